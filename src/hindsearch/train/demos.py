"""Warm-up demonstrations: read them from JSONL, split their text into model-written and injected segments,
and tokenize them into training rows (ids, gen_mask, query_mask) exactly as the rollout engine builds them."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from hindsearch.agent import protocol
from hindsearch.records import Trajectory, Turn

INJECTED_RE = re.compile(
    r"(\n\n<information>.*?(?:</information>\n\n|$)|" + re.escape(protocol.INVALID_NOTICE) + ")", re.DOTALL
)


# ---------------------------------------------------------------- demonstrations
def segments_from_text(completion_text: str) -> list[tuple[str, bool]]:
    """Split a completion into ``(text, generated)`` segments: injected blocks (information
    blocks, the invalid-action notice) are ``generated=False``, everything else True."""
    out: list[tuple[str, bool]] = []
    pos = 0
    for m in INJECTED_RE.finditer(completion_text):
        if m.start() > pos:
            out.append((completion_text[pos : m.start()], True))
        out.append((m.group(0), False))
        pos = m.end()
    if pos < len(completion_text):
        out.append((completion_text[pos:], True))
    return out


def load_demos(path: str | Path, require_answer: bool = True) -> tuple[list[Trajectory], int]:
    """Read a trajectories JSONL (``Trajectory.to_dict()`` per line).

    Returns ``(trajectories, n_skipped)``; with ``require_answer`` a trajectory without a final
    ``<answer>`` is skipped (counted). A malformed line raises ``ValueError`` naming file:line.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"warmup.demos: file not found: {p}")
    out, skipped = [], 0
    with p.open() as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise ValueError("not a JSON object")
                if not isinstance(d.get("question"), str) or not isinstance(d.get("completion_text"), str):
                    raise ValueError("needs string fields 'question' and 'completion_text'")
                d.setdefault("qid", str(ln))
                d.setdefault("golden_answers", [])
                d.setdefault("prompt_ids", [])
                t = Trajectory.from_dict(d)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{p}:{ln}: bad trajectory: {e}") from e
            if require_answer and protocol.extract_answer(t.completion_text) is None:
                skipped += 1
                continue
            out.append(t)
    return out, skipped


def _encode(tokenizer: Any, text: str, offsets: bool = False) -> Any:
    return tokenizer(text, add_special_tokens=False, return_offsets_mapping=offsets)


def prompt_ids(tokenizer: Any, question: str, hint: str | None = None) -> list[int]:
    """Prompt ids exactly as the rollout engine builds them (special tokens only without a chat template)."""
    text = protocol.make_prompt(tokenizer, question, hint)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return list(tokenizer(text, add_special_tokens=not has_template)["input_ids"])


def _query_mask(tokenizer: Any, text: str) -> list[int]:
    """1 on the tokens of ``text`` that overlap the query characters inside ``<search>...</search>``."""
    enc = _encode(tokenizer, text, offsets=True)
    m = protocol.ACTION_RE.search(text)
    if m is None or m.group(1) != "search":
        return [0] * len(enc["input_ids"])
    raw = m.group(2)
    lo = m.start(2) + (len(raw) - len(raw.lstrip()))
    hi = m.start(2) + len(raw.rstrip())
    return [int(a < hi and b > lo and b > a) for a, b in enc["offset_mapping"]]


def tokenize_demo(tokenizer: Any, traj: Trajectory, max_total_tokens: int | None = None) -> Trajectory:
    """Token ids and exact masks of a text-level demonstration (see the module docstring).

    Uses ``traj.extra["segments"]`` when present, else ``segments_from_text(completion_text)``.
    Fills ``prompt_ids``, ``completion_ids``, ``gen_mask``, ``query_mask``, ``logprobs`` (zeros)
    and the turns' token spans. When prompt + completion exceed ``max_total_tokens`` the
    completion is cut to fit and ``stop_reason`` becomes ``length``.
    """
    hint = traj.extra.get("hint")
    p_ids = prompt_ids(tokenizer, traj.question, hint)
    segs = traj.extra.get("segments") or segments_from_text(traj.completion_text)
    ids: list[int] = []
    gen: list[int] = []
    qmask: list[int] = []
    turns: list[Turn] = []
    src_turns = iter(traj.turns)
    for text, generated in segs:
        seg_ids = list(_encode(tokenizer, text)["input_ids"])
        start = len(ids)
        ids += seg_ids
        gen += [int(bool(generated))] * len(seg_ids)
        if generated:
            qm = _query_mask(tokenizer, text)
            qmask += qm
            action, content = protocol.parse_action(text)
            src = next(src_turns, None)
            t = replace(src) if src is not None else Turn(action=action or "invalid", content=content)
            t.gen_span = (start, len(ids))
            on = [start + i for i, v in enumerate(qm) if v]
            t.query_span = (on[0], on[-1] + 1) if on else (start, start)
            t.inject_span = (len(ids), len(ids))
            turns.append(t)
        else:
            qmask += [0] * len(seg_ids)
            if turns:
                turns[-1].inject_span = (start, len(ids))
    stop = traj.stop_reason or "answer"
    if max_total_tokens is not None and len(p_ids) + len(ids) > max_total_tokens:
        keep = max(0, max_total_tokens - len(p_ids))
        ids, gen, qmask, stop = ids[:keep], gen[:keep], qmask[:keep], "length"
    return replace(traj, prompt_ids=p_ids, completion_ids=ids, gen_mask=gen, query_mask=qmask,
                   logprobs=[0.0] * len(ids), turns=turns, stop_reason=stop)
