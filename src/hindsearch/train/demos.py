"""Warm-up demonstrations: read them from JSONL and tokenize them into training rows (ids, gen_mask,
query_mask) exactly as the rollout engine builds them; the text rules (segments, prompt, query mask)
are ``agent.protocol``'s."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hindsearch.agent import protocol
from hindsearch.fsutil import BadLine, iter_jsonl
from hindsearch.records import Trajectory, Turn


def load_demos(path: str | Path, require_answer: bool = True) -> tuple[list[Trajectory], int]:
    """Read a trajectories JSONL (``Trajectory.to_dict()`` per line).

    Returns ``(trajectories, n_skipped)``; with ``require_answer`` a trajectory without a final
    ``<answer>`` is skipped (counted). A malformed line raises ``ValueError`` naming file:line.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"warmup.demos: file not found: {p}")
    out, skipped = [], 0
    for ln, d in iter_jsonl(p, "yield-bad", objects=False):
        try:
            if isinstance(d, BadLine):
                raise ValueError(d.reason)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            texts = (d.get("question"), d.get("completion_text"))
            if not all(isinstance(t, str) for t in texts):
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


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of a segment tokenized alone, no special tokens (as the rollout engine injects text)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_demo(tokenizer: Any, traj: Trajectory,
                  max_total_tokens: int | None = None) -> Trajectory:
    """Token ids and exact masks of a text-level demonstration (see the module docstring).

    Uses ``traj.extra["segments"]`` when present, else
    ``protocol.segments_from_text(completion_text)``. The prompt is ``protocol.encode_prompt`` and a
    model-written segment's query mask ``protocol.query_token_mask`` over the segment's ids, the
    rules of the rollout engine. Fills ``prompt_ids``, ``completion_ids``, ``gen_mask``,
    ``query_mask``, ``logprobs`` (zeros) and the turns' token spans. When prompt + completion exceed
    ``max_total_tokens`` the completion is cut to fit and ``stop_reason`` becomes ``length``.
    """
    hint = traj.extra.get("hint")
    p_ids = protocol.encode_prompt(tokenizer, traj.question, hint)
    segs = traj.extra.get("segments") or protocol.segments_from_text(traj.completion_text)
    ids: list[int] = []
    gen: list[int] = []
    qmask: list[int] = []
    turns: list[Turn] = []
    src_turns = iter(traj.turns)
    for text, generated in segs:
        seg_ids = _encode(tokenizer, text)
        start = len(ids)
        ids += seg_ids
        gen += [int(bool(generated))] * len(seg_ids)
        if generated:
            seg_text = tokenizer.decode(seg_ids, skip_special_tokens=False)
            qm = protocol.query_token_mask(tokenizer, seg_ids, seg_text)
            qmask += qm
            action, content = protocol.parse_action(text)
            src = next(src_turns, None)
            t = (replace(src) if src is not None
                 else Turn(action=action or "invalid", content=content))
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
