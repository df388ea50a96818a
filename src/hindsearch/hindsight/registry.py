"""Methods by name: ``@register_method(name, config=...)`` on a term class (or on ``None`` for a
method that adds no term, GRPO), the ``METHODS`` registry, and the assembly of a config's method
part (``resolve_methods``).

A method's file holds its options dataclass (the config's ``[name]`` table), its term
(``contract.AuxTerm``) and the term's metric declarations (``Metrics``). ``method = "a+b"`` composes
registered terms. A plugin registers a method the same way, with no edit under ``src/``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from hindsearch.config.fields import ConfigError, _assign
from hindsearch.config.registry import Registry

Reduction = Literal["sum", "mean"]


class Methods(Registry):
    """The method registry: a registered name, or ``a+b`` (registered methods that each add a term,
    composed). Iterating gives the registered names, then the compositions it lists (``listed``)."""

    def __init__(self, builtins: dict[str, str], listed: tuple[str, ...] = ()) -> None:
        super().__init__("method", builtins)
        self.listed = listed
        """Compositions shown among the names (``--method``'s choices); any composition is valid
        without it."""

    def parts(self, name: str) -> list[str]:
        """The registered methods ``name`` composes (one for a plain name); ``KeyError`` naming what
        is wrong."""
        parts = name.split("+")
        for p in parts:
            self.get(p)
        if len(parts) > 1:
            if len(set(parts)) != len(parts):
                raise KeyError(f"method {name!r} names a method twice")
            empty = [p for p in parts if getattr(self._entries[p], "term", None) is None]
            if empty:
                raise KeyError(f"method {name!r}: {', '.join(empty)} adds no term and composes "
                               "with nothing")
        return parts

    def names(self) -> tuple[str, ...]:
        return super().names() + self.listed

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if "+" not in name:
            return super().__contains__(name)
        try:
            self.parts(name)
        except KeyError:
            return False
        return True


METHODS = Methods({"grpo": "hindsearch.hindsight.methods.grpo",
                   "hindsearch": "hindsearch.hindsight.methods.hindsearch",
                   "igsd": "hindsearch.hindsight.methods.igsd"}, listed=("hindsearch+igsd",))
"""Training methods by name (``register_method``)."""


@dataclasses.dataclass(frozen=True)
class Metrics:
    """What a term logs (as ``<term>/<key>``) and how it is shown.

    ``reductions``: every key the term's ``prepare`` and ``loss`` return, with how it is reduced
    over processes: ``sum`` (counts and seconds of a rank's own rows) or ``mean`` (fractions, means,
    losses). A key a term returns without declaring it is an error (never guessed from its name).
    ``loss``: the key of the term's loss (the report's "Loss parts" panel). ``panels``: the report's
    panels of the term, ``{title: keys}``, in order.
    """

    reductions: Mapping[str, Reduction]
    loss: str
    panels: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.reductions.items() if v not in ("sum", "mean")}
        if bad:
            raise ValueError(f"metric reductions must be 'sum' or 'mean', got {bad}")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A registered method: its name (also its config section and its metrics' prefix), its options
    dataclass (None: no options), its term class (None: no term) and the term's metric
    declarations."""

    name: str
    config: type | None
    term: type | None
    metrics: Metrics | None


def register_method(name: str, config: type | None = None) -> Callable[[Any], Any]:
    """Class decorator: register the term class as method ``name`` with options ``config`` (a
    dataclass whose fields are the ``[name]`` section; ``choice``/``bounded`` metadata is checked
    with the rest of the config, and an optional ``check()`` runs the section's cross-field rules).
    The class declares ``name`` (its metrics' and tensors' prefix, ``hind``) and ``metrics:
    Metrics``. Decorating ``None`` (``register_method("grpo")(None)``) registers a method that adds
    no term."""
    import sys

    # who registers: a term-less method has no class to ask
    caller = sys._getframe(1).f_globals.get("__name__")

    def deco(term: Any) -> Any:
        if config is not None and not dataclasses.is_dataclass(config):
            raise TypeError(f"method {name!r}: config must be a dataclass, got {config!r}")
        metrics = None
        if term is not None:
            metrics = getattr(term, "metrics", None)
            if not isinstance(metrics, Metrics):
                raise TypeError(f"method {name!r}: {term.__qualname__}.metrics must be a "
                                f"hindsearch.hindsight.registry.Metrics (its metrics' reductions)")
            if not isinstance(getattr(term, "name", None), str):
                raise TypeError(f"method {name!r}: {term.__qualname__}.name must be a str (its "
                                "metrics' prefix)")
        origin = term if term is not None else config
        module = getattr(origin, "__module__", None) or caller
        METHODS.register(name, MethodSpec(name, config, term, metrics), module)
        return term

    return deco


def method(name: str) -> MethodSpec:
    """The registered method ``name`` (``KeyError`` naming the registered ones)."""
    return METHODS.get(name)


def method_parts(method_name: str) -> list[MethodSpec]:
    """The registered methods ``method_name`` composes (``a+b``: both)."""
    return [METHODS.get(p) for p in METHODS.parts(method_name)]


def term_methods() -> list[MethodSpec]:
    """Every registered method that adds a term, in registration order (what the report and compare
    can show)."""
    return [s for s in (METHODS.get(n) for n in METHODS.names() if "+" not in n)
            if s.term is not None]


def make_terms(cfg: Any) -> list[Any]:
    """The terms of ``cfg.method``, each built from its own section (``term(options,
    seed=train.seed)``); none for a method without a term. Builds the objects only (no model): bad
    term options fail here."""
    resolve_methods(cfg)
    try:
        specs = method_parts(cfg.method)
    except KeyError as e:
        raise ValueError(f"method = {cfg.method!r}: {e.args[0]}") from None
    return [s.term(cfg.sections.get(s.name), seed=cfg.train.seed) for s in specs
            if s.term is not None]


def reduction_of(term: Any, key: str) -> Reduction:
    """How metric ``key`` (without the ``<term>/`` prefix) of ``term`` is reduced over processes; an
    undeclared key raises ``KeyError`` naming the term."""
    metrics = getattr(term, "metrics", None)
    if metrics is None or key not in metrics.reductions:
        raise KeyError(f"term {term.name!r} logs metric {key!r} without declaring its reduction "
                       f"over processes (add it to {type(term).__qualname__}.metrics.reductions: "
                       "'sum' or 'mean')")
    return metrics.reductions[key]


def resolve_methods(cfg: Any) -> Any:
    """Assemble the method part of a loaded ``Config`` (returned): ``method`` checked against
    ``METHODS``, and every registered method's ``[name]`` table parsed by its options dataclass
    (defaults where the config has none) into ``cfg.sections``, then validated. A table no method
    registered gets the config's unknown-key error. Idempotent: a plugin loaded since adds its
    sections on the next call."""
    METHODS.check(cfg.method, "method")
    for name in METHODS.names():
        spec = METHODS.get(name) if "+" not in name else None
        if spec is not None and spec.config is not None and name not in cfg.sections:
            cfg.sections[name] = spec.config()
    for name, layers in list(cfg.tables.items()):
        if name not in cfg.sections:
            source = layers[0][0]
            raise ConfigError(f"{source}: unknown key {name!r} in [Config]; allowed: "
                              f"{sorted([*cfg.field_names(), *cfg.sections])}")
        for source, value in layers:
            _assign(cfg, name, value, source)
        del cfg.tables[name]
    return cfg.validate()
