"""Known upstream warnings once each, with one line saying whether they matter; every other warning
untouched.

Transformers warns from the caller's line, and its callers are many, so Python's once-per-location
rule would repeat the same deprecation notices after every checkpoint save. ``install`` wraps
``warnings.showwarning``: a warning matching ``KNOWN`` is shown the first time as one line with its
note, and never again in this process; any other warning goes to the original ``showwarning`` in
full. Nothing is filtered, so a new upstream warning is never hidden.
"""

from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Known:
    """One known upstream warning: ``pattern`` (a regex searched in the message), its category, and
    the note."""

    pattern: str
    category: type[Warning]
    note: str


KNOWN: tuple[Known, ...] = (
    Known(r"`gradient_checkpointing` is deprecated", FutureWarning,
          "transformers 5 renamed the argument to activation_checkpointing and TRL 1.16 still "
          "passes the old one; harmless"),
    Known(r"`gradient_checkpointing_(enable|disable)` is deprecated", FutureWarning,
          "transformers 5 renamed the methods and TRL 1.16 still calls the old names around "
          "generation; harmless"),
    Known(r"`is_gradient_checkpointing` is deprecated", FutureWarning,
          "transformers 5 renamed the attribute and its own Trainer still reads the old name; "
          "harmless"),
    Known(r"`past_key_values` is deprecated", FutureWarning,
          "transformers 5.x renames the cache argument (to cache) inside its own masking code; "
          "harmless"),
    Known(r"You are using 'rollout_func', which is an experimental feature", UserWarning,
          "hindsearch drives its multi-turn rollouts through TRL's rollout_func on purpose; trl is "
          "pinned to 1.16.0, where it works as tested; harmless"),
)

_state: dict[str, Any] = {"original": None, "seen": set()}


def match(message: Warning | str, category: type[Warning]) -> Known | None:
    """The ``KNOWN`` entry of a warning, or None."""
    text = str(message)
    for k in KNOWN:
        if issubclass(category, k.category) and re.search(k.pattern, text):
            return k
    return None


def _show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
          file: Any = None, line: str | None = None) -> None:
    k = match(message, category)
    if k is None:
        _state["original"](message, category, filename, lineno, file, line)
        return
    if k.pattern in _state["seen"]:
        return
    _state["seen"].add(k.pattern)
    first = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    out = file if file is not None else sys.stderr
    try:
        out.write(f"upstream {category.__name__} (shown once; {k.note}): {first}\n")
    except (OSError, ValueError):  # a closed stream: as warnings itself does, say nothing
        pass


def install() -> None:
    """Route warnings through ``_show`` (idempotent; the previous ``showwarning`` handles every
    unknown one)."""
    if warnings.showwarning is not _show:
        _state["original"] = warnings.showwarning
        warnings.showwarning = _show
