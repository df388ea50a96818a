"""Named registries and the plugins that add to them.

A ``Registry`` maps a name to what registered it; each registry lives with what it names
(``hindsight.registry.METHODS``, ``retrieval.registry.RETRIEVERS``, ``train.reward_funcs.REWARDS``)
and declares its built-in names with the module that registers each (imported when that name is
first looked up), so a name is known without importing its layer. ``check`` gives the config's
one-line error for an unknown name. A plugin is a module or a Python file whose import registers
methods, retrievers or rewards (``plugins = [...]``, ``hindsearch train --plugin``);
``load_plugins`` imports each once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hindsearch.config.fields import ConfigError


class Registry:
    """``name -> entry`` of one kind of thing: the built-in names first (in the order of
    ``builtins``), then the others in registration order; read as a collection of names (``in``,
    iteration)."""

    def __init__(self, what: str, builtins: Mapping[str, str] | None = None) -> None:
        self.what = what
        """What a name names, for messages (``method``, ``retrieval.kind``)."""
        self.builtins = dict(builtins or {})
        """Built-in name -> the module whose import registers it (imported when the name is first
        looked up)."""
        self._entries: dict[str, Any] = {}
        # name -> (its place among the built-ins, registration order)
        self._rank: dict[str, tuple[int, int]] = {}
        self._module: dict[str, str | None] = {}  # name -> the module that registered it

    def register(self, name: str, entry: Any, module: str | None = None) -> None:
        """Add ``name``, registered by ``module``; a name taken by another module is an error (a
        plugin cannot shadow a built-in)."""
        if not isinstance(name, str) or not name or "+" in name or ":" in name:
            raise ValueError(f"{self.what} name {name!r}: a non-empty name without '+' or ':'")
        owner = self._module.get(name, self.builtins.get(name))
        if (name in self._entries or name in self.builtins) and owner != module and \
                not (module or "").startswith(f"{owner}."):
            raise ValueError(f"{self.what} {name!r} is already registered (by "
                             f"{owner or 'hindsearch'})")
        builtin = list(self.builtins)
        self._entries[name], self._module[name] = entry, module
        self._rank.setdefault(name, (builtin.index(name) if name in builtin else len(builtin),
                                     len(self._rank)))

    def load(self) -> None:
        """Import the modules of every built-in name."""
        for name in self.builtins:
            self._load(name)

    def _load(self, name: str) -> None:
        if name not in self._entries and name in self.builtins:
            importlib.import_module(self.builtins[name])

    def get(self, name: str) -> Any:
        """The entry of ``name``; an unknown name raises ``KeyError`` listing the registered
        ones."""
        self._load(name)
        if name not in self._entries:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {', '.join(self.names())} "
                           f"(a plugin registers more: plugins = [...] in the config)")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """Every name, without importing anything."""
        rest = sorted((n for n in self._entries if n not in self.builtins),
                      key=self._rank.__getitem__)
        return (*self.builtins, *rest)

    def check(self, value: Any, key: str) -> None:
        """``ConfigError`` naming the config ``key`` and the allowed names unless ``value`` (for a
        list: each of its elements) is one of this registry's names."""
        values = value if isinstance(value, list) else [value]
        if not all(v in self for v in values):
            how = "each from" if isinstance(value, list) else "one of"
            raise ConfigError(f"{key} = {value!r} is not allowed; choose {how} "
                              f"{', '.join(self.names())}")

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.builtins or name in self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


_PLUGINS: dict[str, Any] = {}


class PluginError(ValueError):
    """A plugin that failed while being imported: the message is one line naming the plugin (its
    file) and what it did (raised, a syntax error, registered a taken or malformed name, exited)."""


def _line_in(tb: Any, path: Path | None) -> int | None:
    """The line of ``path`` (the plugin file) that the traceback ``tb`` last passed through, if
    any."""
    import traceback

    line = None
    for frame, lineno in traceback.walk_tb(tb):
        if path is not None and Path(frame.f_code.co_filename) == path:
            line = lineno
    return line


def _run_plugin(label: str, path: Path | None, run: Any) -> Any:
    """``run()`` (a plugin's import), with whatever it raises turned into a one-line
    ``PluginError``."""
    try:
        return run()
    except SyntaxError as e:
        where = (f"{e.filename}, " if e.filename and path is not None and Path(e.filename) != path
                 else "")
        raise PluginError(f"plugin {label}: syntax error ({where}line {e.lineno}): "
                          f"{e.msg}") from None
    # a plugin's sys.exit() would end the command, silently and often with status 0
    except SystemExit as e:
        raise PluginError(f"plugin {label}: called sys.exit({e.code!r}) while being imported; a "
                          "plugin registers methods, retriever kinds or rewards and must not "
                          "exit") from None
    except RecursionError as e:
        raise PluginError(f"plugin {label}: RecursionError while being imported: {e}") from None
    except Exception as e:
        line = _line_in(e.__traceback__, path)
        at = f", line {line}" if line else ""
        msg = " ".join(str(e).split()) or "(no message)"
        raise PluginError(f"plugin {label}{at}: {type(e).__name__} while being imported: "
                          f"{msg}") from e


def load_plugin(spec: str) -> Any:
    """Import one plugin: ``package.module`` or a ``.py`` file (relative to the current folder);
    returns the module. A file is imported once under a name derived from its resolved path.
    Whatever the import raises (or a ``sys.exit``) becomes a ``PluginError`` naming the plugin; a
    folder is refused."""
    if spec in _PLUGINS:
        return _PLUGINS[spec]
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin {spec!r}: give a module name (package.module) or a .py file")
    if spec.endswith(".py"):
        path = Path(spec).expanduser().resolve()
        if path.is_dir():
            raise PluginError(f"plugin {spec}: is a folder; give a .py file or a module name "
                              "(package.module)")
        if not path.is_file():
            raise FileNotFoundError(f"plugin {spec!r}: no such file")
        name = f"hindsearch_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        module = sys.modules.get(name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ImportError(f"plugin {spec!r}: cannot be imported as a Python file")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader = loader_spec.loader
                _run_plugin(str(path), path, lambda: loader.exec_module(module))
            except BaseException:
                del sys.modules[name]
                raise
    else:
        if Path(spec).expanduser().is_dir() or "/" in spec or "\\" in spec:
            raise PluginError(f"plugin {spec}: is a folder or a path, not a module; give a .py "
                              f"file or a module name (package.module)")
        found = importlib.util.find_spec(spec) if "." not in spec else None
        origin = Path(found.origin) if found is not None and found.origin else None
        label = f"{spec} ({origin})" if origin else spec
        module = _run_plugin(label, origin, lambda: importlib.import_module(spec))
        if getattr(module, "__file__", None) is None:
            raise PluginError(f"plugin {spec}: is a folder without __init__.py (a namespace "
                              "package), which registers nothing; give a .py file or a module "
                              "name (package.module)")
    _PLUGINS[spec] = module
    return module


def load_plugins(specs: Iterable[str]) -> None:
    """Import every plugin of ``specs`` (``load_plugin``)."""
    for spec in specs:
        load_plugin(spec)
