"""How a config value is declared, read and checked: allowed values and bounds in field metadata
(``choice``, ``bounded``, read back with ``choices_of``) and the typed assignment of a TOML value or
``--set``."""

from __future__ import annotations

import math
from dataclasses import field, fields
from typing import Any


TEACHERS = ("frozen", "live", "ema")
"""A term's ``teacher`` (``hindsearch.hindsight.teacher.select_teacher`` reads this tuple)."""


FEEDBACK_KINDS = ("critique", "oracle_gold", "oracle_nogold", "answer_line", "answer_query")


DISTILL_ON = ("query", "action", "decision", "decision_query", "answer_decision")
"""``hindsearch.distill_on`` (``hindsearch.hindsight.teacher.distill_weights`` reads this tuple)."""


CRITIQUE_SOURCES = ("own", "shuffled")


AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "sum")


GATES = ("positive_tanh", "positive_sigmoid", "sigmoid", "hard", "none")
"""``igsd.gate`` (``hindsearch.hindsight.losses.GATES`` reads this tuple)."""


def choice(default: Any, choices: tuple[str, ...]) -> Any:
    """A field whose value (or, for a list, every element) must be one of ``choices``."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"choices": choices})
    return field(default=default, metadata={"choices": choices})


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None) -> Any:
    """A numeric field with bounds (None values are not checked: they mean "unset")."""
    return field(default=default, metadata={"bounds": {"ge": ge, "gt": gt, "le": le, "lt": lt}})


def choices_of(cls: type, name: str) -> tuple[str, ...]:
    """The allowed values declared on ``cls.name`` (what validation checks and code dispatches
    on)."""
    for f in fields(cls):
        if f.name == name:
            return tuple(f.metadata["choices"])
    raise KeyError(f"{cls.__name__} has no field {name!r}")


class ConfigError(ValueError):
    """A bad configuration value; the message names the key and what is allowed."""


INT64_MAX = 2**63 - 1
"""The largest integer a config value may hold: every one ends up in a 64-bit integer (torch, numpy,
TRL)."""


def url_problem(text: str) -> str | None:
    """Why ``text`` is not an ``http://`` or ``https://`` URL with a host (and a valid port); None
    when it is one."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(text)
        u.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        return f"is not a valid URL ({e})"
    if u.scheme not in ("http", "https") or not u.hostname:
        return "must be an http:// or https:// URL with a host"
    return None


def _drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


def _assign(obj: Any, key: str, value: Any, source: str, prefix: str = "") -> None:
    names = {f.name: f for f in fields(obj)}
    # the Config's parsed method sections
    sections = getattr(obj, "sections", {}) if not prefix else {}
    if key not in names and key not in sections:
        # a method's table: parsed when the run is assembled
        if not prefix and hasattr(obj, "tables"):
            obj.tables.setdefault(key, []).append((source, value))
            return
        if not prefix:
            raise ConfigError(f"{source}: unknown key {key!r} in [{type(obj).__name__}]; allowed: "
                              f"{sorted([*names, *sections])}")
        raise ConfigError(f"{source}: unknown key {prefix}{key}; allowed: {sorted(names)}")
    current = getattr(obj, key)
    if hasattr(current, "__dataclass_fields__"):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: [{prefix}{key}] must be a table, got {value!r}")
        for k, v in value.items():
            _assign(current, k, v, source, f"{prefix}{key}.")
        return
    if isinstance(current, dict) and isinstance(value, dict):
        # a raw table (train.trl): --set adds one key, keeps the others
        value = {**current, **value}
    # no current value to compare with: check the annotation
    if current is None and value is not None:
        value = _check_annotation(prefix + key, names[key].type, value, source)
    setattr(obj, key, _coerce(prefix + key, current, value, source))


_SIMPLE_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
                 "list": (list,), "dict": (dict,)}


def _check_annotation(key: str, annotation: Any, value: Any, source: str) -> Any:
    """A value for a field whose default is None, checked against its annotation
    (``int | None`` ...)."""
    parts = [a.strip().split("[")[0] for a in str(annotation).split("|")]
    named = [a for a in parts if a != "None"]
    if not named or any(a not in _SIMPLE_TYPES for a in named):
        return value  # an annotation this check does not read: left to validate()
    ok = any(isinstance(value, t) for a in named for t in _SIMPLE_TYPES[a])
    if isinstance(value, bool) and "bool" not in named:
        ok = False
    if not ok:
        raise ConfigError(f"{source}: {key} must be {' or '.join(named)}, got {value!r}")
    return float(value) if named == ["float"] else value


def _coerce(key: str, current: Any, value: Any, source: str) -> Any:
    if isinstance(value, float) and not math.isfinite(value):  # nan/inf pass every < and > check
        raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        raise ConfigError(
            f"{source}: {key} = {value} does not fit in 64 bits (at most {INT64_MAX})")
    if current is None or value is None:
        return value
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
        return value
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(current) is not type(value):
        raise ConfigError(f"{source}: {key} must be {type(current).__name__}, got {value!r}")
    return value


_BOUND_TEXT = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


_BOUND_OK = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b,
             "lt": lambda v, b: v < b}


def _check_declared(obj: Any, prefix: str) -> None:
    """Walk ``obj``'s fields (recursing into sub-configs) and check each declared choice and
    bound."""
    for f in fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if hasattr(value, "__dataclass_fields__"):
            _check_declared(value, key + ".")
        elif "choices" in f.metadata:
            allowed = f.metadata["choices"]
            bad = [v for v in (value if isinstance(value, list) else [value]) if v not in allowed]
            if bad:
                raise ConfigError(f"{key} = {value!r} is not allowed; choose "
                                  f"{'each from' if isinstance(value, list) else 'one of'} "
                                  f"{', '.join(allowed)}")
        elif "bounds" in f.metadata and value is not None:
            for op, bound in f.metadata["bounds"].items():
                if bound is not None and not _BOUND_OK[op](value, bound):
                    rule = " and ".join(f"{_BOUND_TEXT[o]} {b}"
                                        for o, b in f.metadata["bounds"].items() if b is not None)
                    raise ConfigError(f"{key} must be {rule}, got {value}")
