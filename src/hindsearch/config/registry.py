"""Named registries (methods, retriever kinds, reward functions) and the plugins that add to them.

A ``Registry`` maps a name to what registered it, in registration order. The config reads its names where a field
takes one (``method``, ``retrieval.kind``, ``train.reward_funcs``), so a name a plugin registers is as valid as a
built-in one. The built-in entries register themselves when their modules are imported; a registry names those
modules (``builtins``) and imports them the first time it is read, the way ``hindsearch.cli`` collects its
commands: this module imports nothing of hindsearch.

A plugin is a module (``package.module``) or a Python file (``path/to/file.py``, relative to the current folder)
whose import registers methods, retrievers or rewards: ``plugins = [...]`` at the top of a config, or
``hindsearch train --plugin``. ``load_plugins`` imports each once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class Registry:
    """``name -> entry`` of one kind of thing, in registration order; read as a collection of names (``in``,
    iteration), so a config field can take its names as its allowed values."""

    def __init__(self, what: str, builtins: tuple[str, ...] = ()) -> None:
        self.what = what
        """What a name names, for messages (``method``, ``retrieval.kind``)."""
        self.builtins = builtins
        """Modules whose import registers the built-in entries (imported on first read)."""
        self._entries: dict[str, Any] = {}
        self._rank: dict[str, tuple[int, int]] = {}  # name -> (its builtin module's position, registration order)
        self._module: dict[str, str | None] = {}  # name -> the module that registered it
        self._loaded = False

    def register(self, name: str, entry: Any, module: str | None = None) -> None:
        """Add ``name``, registered by ``module``; a name already taken by another entry is an error (a plugin
        cannot shadow a built-in). The built-ins are listed first, in the order of ``builtins``, whatever order
        their modules were imported in."""
        self.load()
        if not isinstance(name, str) or not name or "+" in name or ":" in name:
            raise ValueError(f"{self.what} name {name!r}: a non-empty name without '+' or ':'")
        if name in self._entries and self._module[name] != module:  # the same module imported again may re-register
            raise ValueError(f"{self.what} {name!r} is already registered (by {self._module[name] or 'hindsearch'})")
        rank = next((i for i, b in enumerate(self.builtins) if module == b or (module or "").startswith(b + ".")),
                    0 if module is None else len(self.builtins))
        self._entries[name], self._module[name] = entry, module
        self._rank.setdefault(name, (rank, len(self._rank)))

    def load(self) -> None:
        """Import the built-in modules (once)."""
        if not self._loaded:
            self._loaded = True
            for mod in self.builtins:
                importlib.import_module(mod)

    def get(self, name: str) -> Any:
        """The entry of ``name``; an unknown name raises ``KeyError`` listing the registered ones."""
        self.load()
        if name not in self._entries:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {', '.join(self._entries)} (a plugin "
                           f"registers more: plugins = [...] in the config)")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        self.load()
        return tuple(sorted(self._entries, key=self._rank.__getitem__))

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


_PLUGINS: dict[str, Any] = {}


class PluginError(ValueError):
    """A plugin that failed while being imported: the message is one line naming the plugin (its file) and what
    it did (raised, a syntax error, registered a taken or malformed name, exited)."""


def _line_in(tb: Any, path: Path | None) -> int | None:
    """The line of ``path`` (the plugin file) that the traceback ``tb`` last passed through, if any."""
    import traceback

    line = None
    for frame, lineno in traceback.walk_tb(tb):
        if path is not None and Path(frame.f_code.co_filename) == path:
            line = lineno
    return line


def _run_plugin(label: str, path: Path | None, run: Any) -> Any:
    """``run()`` (a plugin's import), with whatever it raises turned into a one-line ``PluginError``."""
    try:
        return run()
    except SyntaxError as e:
        where = f"{e.filename}, " if e.filename and path is not None and Path(e.filename) != path else ""
        raise PluginError(f"plugin {label}: syntax error ({where}line {e.lineno}): {e.msg}") from None
    except SystemExit as e:  # a plugin's sys.exit() would end the command, silently and often with status 0
        raise PluginError(f"plugin {label}: called sys.exit({e.code!r}) while being imported; a plugin registers "
                          f"methods, retriever kinds or rewards and must not exit") from None
    except RecursionError as e:
        raise PluginError(f"plugin {label}: RecursionError while being imported: {e}") from None
    except Exception as e:
        line = _line_in(e.__traceback__, path)
        at = f", line {line}" if line else ""
        msg = " ".join(str(e).split()) or "(no message)"
        raise PluginError(f"plugin {label}{at}: {type(e).__name__} while being imported: {msg}") from e


def load_plugin(spec: str) -> Any:
    """Import one plugin: ``package.module`` or a ``.py`` file (relative to the current folder); returns the
    module. A file is imported once under a name derived from its resolved path. Whatever the import raises
    (or a ``sys.exit``) becomes a ``PluginError`` naming the plugin; a folder is refused."""
    if spec in _PLUGINS:
        return _PLUGINS[spec]
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin {spec!r}: give a module name (package.module) or a .py file")
    if spec.endswith(".py"):
        path = Path(spec).expanduser().resolve()
        if path.is_dir():
            raise PluginError(f"plugin {spec}: is a folder; give a .py file or a module name (package.module)")
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
            raise PluginError(f"plugin {spec}: is a folder or a path, not a module; give a .py file or a module "
                              f"name (package.module)")
        found = importlib.util.find_spec(spec) if "." not in spec else None
        origin = Path(found.origin) if found is not None and found.origin else None
        label = f"{spec} ({origin})" if origin else spec
        module = _run_plugin(label, origin, lambda: importlib.import_module(spec))
        if getattr(module, "__file__", None) is None:
            raise PluginError(f"plugin {spec}: is a folder without __init__.py (a namespace package), which "
                              f"registers nothing; give a .py file or a module name (package.module)")
    _PLUGINS[spec] = module
    return module


def load_plugins(specs: Iterable[str]) -> None:
    """Import every plugin of ``specs`` (``load_plugin``)."""
    for spec in specs:
        load_plugin(spec)


class Methods(Registry):
    """The method registry: a registered name, or ``a+b`` (several registered methods that each add a term,
    composed). Iterating gives the registered names and the compositions listed with ``list_composition``."""

    def __init__(self, builtins: tuple[str, ...]) -> None:
        super().__init__("method", builtins)
        self._listed: list[str] = []

    def list_composition(self, name: str) -> None:
        """Show ``a+b`` among the names (in ``--method``'s choices); any composition is valid without it."""
        if name not in self._listed:
            self._listed.append(name)

    def parts(self, name: str) -> list[str]:
        """The registered methods ``name`` composes (one for a plain name); ``KeyError`` naming what is wrong."""
        parts = name.split("+")
        for p in parts:
            self.get(p)
        if len(parts) > 1:
            if len(set(parts)) != len(parts):
                raise KeyError(f"method {name!r} names a method twice")
            empty = [p for p in parts if getattr(self._entries[p], "term", None) is None]
            if empty:
                raise KeyError(f"method {name!r}: {', '.join(empty)} adds no term and composes with nothing")
        return parts

    def names(self) -> tuple[str, ...]:
        return super().names() + tuple(self._listed)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.parts(name)
        except KeyError:
            return False
        return True


METHODS = Methods(builtins=("hindsearch.hindsight.methods",))
"""Training methods (``hindsearch.hindsight.registry.register_method``)."""

RETRIEVERS = Registry("retrieval.kind", builtins=("hindsearch.retrieval.bm25", "hindsearch.retrieval.dense",
                                                  "hindsearch.retrieval.client"))
"""Retriever kinds (``hindsearch.retrieval.base.register_retriever``, ``register_index_kind``)."""

class Rewards(Registry):
    """The reward-function registry: a registered name, or a ``module:function`` path (imported when the trainer
    is built; ``hindsearch.train.reward_funcs.resolve_reward``)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (_is_path(name) or super().__contains__(name))


def _is_path(name: str) -> bool:
    """Whether ``name`` is a ``module:function`` path (both parts non-empty)."""
    module, _, func = name.partition(":")
    return bool(module and func)


REWARDS = Rewards("reward function", builtins=("hindsearch.train.reward_funcs",))
"""TRL reward functions by name (``hindsearch.train.reward_funcs.register_reward``)."""
