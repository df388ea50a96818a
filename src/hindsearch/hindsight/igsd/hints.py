"""IGSD's teacher hindsight other than the answer line: the judge's redacted critique, or a summary
of the group.

Both are ``FEEDBACK_TEMPLATE`` lines with every gold answer string replaced by ``[ANSWER]``
(``judge.redact``), so the teacher learns where to search from what the group or the judge saw,
never from the answer's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hindsearch.agent import protocol
from hindsearch.hindsight.judge import redact
from hindsearch.records import Trajectory

MAX_GROUP_LINES = 4
"""Other rollouts a group summary lists (successes first)."""


def group_summary(trajs: Sequence[Trajectory], i: int) -> str | None:
    """What the other rollouts of row ``i``'s question in this step did: each one's queries and
    whether it answered correctly, successes first, gold strings redacted; None when no other
    rollout of the question searched."""
    others = [t for j, t in enumerate(trajs) if j != i and t.qid == trajs[i].qid and t.queries]
    if not others:
        return None
    others.sort(key=lambda t: -t.em)
    parts = []
    for t in others[:MAX_GROUP_LINES]:
        queries = "; ".join(f'"{q}"' for q in t.queries)
        parts.append(f"searching {queries} {'found the answer' if t.em else 'did not'}")
    text, _ = redact("Other attempts at this question: " + ", ".join(parts) + ".",
                     trajs[i].golden_answers)
    return text


def hint_lines(trajs: Sequence[Trajectory], rows: Sequence[int], kind: str,
               judge: Any = None) -> dict[int, str]:
    """Row -> the teacher's hint line for ``igsd.hindsight = kind`` (``critique`` or ``group``); a
    row whose critique is unusable or whose group has nothing to say gets none (and is not
    distilled)."""
    if kind == "critique":
        crits = judge.critique([trajs[i] for i in rows])
        return {i: protocol.FEEDBACK_TEMPLATE.format(critique=c.text) for i, c in zip(rows, crits)
                if c.usable}
    if kind == "group":
        out = {}
        for i in rows:
            s = group_summary(trajs, i)
            if s is not None:
                out[i] = protocol.FEEDBACK_TEMPLATE.format(critique=s)
        return out
    raise ValueError(f"igsd.hindsight = {kind!r} has no hint lines (answer uses the answer line)")
