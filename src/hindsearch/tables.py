"""The one markdown table renderer: every results, evaluation and probe table goes through it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def markdown_table(head: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """``| a | b |`` lines: the head, the ``|---|`` rule, one line per row (cells as ``str``); no
    newline at the end."""
    lines = ["| " + " | ".join(map(str, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines)
