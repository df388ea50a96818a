"""Stage 1, propose: the teacher (policy + gold answer line) scores the student's failed query
tokens; the positions where it prefers another token become pairs."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


from hindsearch.agent import protocol
from hindsearch.hindsight import losses
from hindsearch.hindsight.igsd.types import (Pair)
from hindsearch.hindsight.teacher import igsd_prompt_ids, teacher_token_logprobs, through_last_query
from hindsearch.records import Trajectory


def select_positions(
    query_mask: Sequence[int],
    a_ids: Sequence[int],
    b_ids: Sequence[int],
    pref: Sequence[float],
    mode: str,
    cap: int,
    rng: random.Random,
) -> list[int]:
    """Completion indices to verify for one rollout, sorted; ``pref[t] = log pT(b_t) - log
    pT(a_t)``."""
    cand = [t for t, m in enumerate(query_mask) if m]
    if mode == "disagree":
        cand = [t for t in cand if a_ids[t] != b_ids[t]]
        cand = sorted(cand, key=lambda t: -pref[t])[:cap]
    elif mode == "all":
        cand = cand[:cap]
    elif mode == "random":
        cand = rng.sample(cand, min(cap, len(cand)))
    else:
        raise ValueError(f"igsd.positions = {mode!r} is not one of disagree, all, random")
    return sorted(cand)


def answer_token_ids(tokenizer: Any, golds: Sequence[str]) -> set[int]:
    """Token ids of the gold answers as they can appear in a query: each answer tokenised alone and
    after a space (no special tokens)."""
    ids: set[int] = set()
    for g in golds:
        for text in (g, " " + g):
            ids.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def unreachable_positions(completion: Sequence[int], proposed: Sequence[int],
                          query_mask: Sequence[int], prompt_ids: Sequence[int]) -> set[int]:
    """Query positions ``t`` whose proposed token occurs neither in ``prompt_ids`` nor in
    ``completion[:t]`` (the retrieved text included): tokens the student cannot produce from what it
    has seen. All sequences are per rollout; ``completion``, ``proposed`` and ``query_mask`` have
    length n (the scored completion)."""
    seen = set(prompt_ids)
    out: set[int] = set()
    for t, (tok, b) in enumerate(zip(completion, proposed)):
        if query_mask[t] and b not in seen:
            out.add(t)
        seen.add(tok)
    return out


def unseen_answer_positions(
    completion: Sequence[int], proposed: Sequence[int], query_mask: Sequence[int],
    prompt_ids: Sequence[int], answer_ids: set[int],
) -> set[int]:
    """Query positions ``t`` whose proposed teacher token ``proposed[t]`` is one of ``answer_ids``
    and occurs neither in ``prompt_ids`` nor in ``completion[:t]``: tokens only the hindsight can
    supply (``unreachable_positions`` restricted to answer tokens)."""
    return {t for t in unreachable_positions(completion, proposed, query_mask, prompt_ids)
            if proposed[t] in answer_ids}


def teacher_prompts(trajs: Sequence[Trajectory], rows: Sequence[int], tokenizer: Any,
                    hints: dict[int, str] | None) -> list[list[int]]:
    """The teacher prompt of each row: the answer line (``hints`` None), else the row's hint line (a
    redacted critique or group summary, ``FEEDBACK_TEMPLATE`` shape)."""
    if hints is None:
        return [igsd_prompt_ids(tokenizer, trajs[i].question, trajs[i].golden_answers)
                for i in rows]
    return [protocol.encode_prompt(tokenizer, trajs[i].question, hints[i]) for i in rows]


def propose_pairs(
    trajs: Sequence[Trajectory], T: int, teacher: Any, tokenizer: Any, cfg: Any, rng: random.Random,
    m: dict[str, float], batch_size: int = 16, hints: dict[int, str] | None = None,
) -> list[Pair]:
    """Teacher forward (hindsight in the prompt) on failed rollouts with query tokens → the
    positions to verify. ``hints``: row -> hint line for ``igsd.hindsight`` other than ``answer`` (a
    row without one is skipped)."""
    failed = [i for i, tr in enumerate(trajs) if tr.failed]
    rows = [i for i in failed if any(trajs[i].query_mask[:T]) and trajs[i].golden_answers
            and (hints is None or i in hints)]
    m["failed"], m["rows_no_query"] = float(len(failed)), float(len(failed) - len(rows))
    prompts = teacher_prompts(trajs, rows, tokenizer, hints)
    # exact: scores at query tokens only
    comps = [through_last_query(trajs[i].completion_ids, trajs[i].query_mask, T) for i in rows]
    lT, top_ids, top_lp = teacher_token_logprobs(teacher, prompts, comps, topk=1,
                                                 batch_size=batch_size)
    pairs = []
    for j, i in enumerate(rows):
        tr, n = trajs[i], len(comps[j])
        a, b = comps[j], top_ids[j, :n, 0].tolist()
        pref = (top_lp[j, :n, 0] - lT[j, :n]).tolist()
        qm = list(tr.query_mask[:n])
        m["positions_considered"] += sum(qm)
        m["teacher_agree"] += sum(1 for t in range(n) if qm[t] and a[t] == b[t])
        off = unreachable_positions(a, b, qm, tr.prompt_ids)
        ans = answer_token_ids(tokenizer, tr.golden_answers)
        gold = {t for t in off if b[t] in ans}  # unseen_answer_positions, from the same scan
        m["proposals"] += sum(1 for t in range(n) if qm[t] and a[t] != b[t])
        m["proposals_gold"] += sum(1 for t in gold if a[t] != b[t])
        if cfg.proposals == "reachable":  # tokens the student cannot produce: not verified
            m["positions_unreachable"] += sum(1 for t in off if a[t] != b[t])
            qm = [0 if t in off else q for t, q in enumerate(qm)]
        # tokens only the hindsight can supply: not verified, not distilled
        if cfg.answer_tokens == "drop":
            drop = {t for t in gold if qm[t]}
            m["answer_tokens_dropped"] += len(drop)
            qm = [0 if t in drop else q for t, q in enumerate(qm)]
        for t in select_positions(qm, a, b, pref, cfg.positions,
                                  cfg.max_positions_per_rollout, rng):
            p_T = losses.pair_probs(top_lp[j, t, 0:1], lT[j, t : t + 1])[0].tolist()
            pairs.append(Pair(i, t, a[t], b[t], (p_T[0], p_T[1]), query_start(tr.query_mask, t)))
    return pairs



def query_start(query_mask: Sequence[int], t: int) -> int:
    """First index of the run of query tokens that contains ``t``."""
    while t > 0 and query_mask[t - 1]:
        t -= 1
    return t
