"""The batched IGSD driver of one training step: propose, verify, and the tensors, metrics and
samples the term hands to the trainer."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight.igsd.types import METRIC_KEYS, Pair
from hindsearch.hindsight.igsd.propose import propose_pairs
from hindsearch.hindsight.igsd.stages import verify_pairs
from hindsearch.hindsight.teacher import select_teacher
from hindsearch.records import Passage, Trajectory


def run_igsd(
    trajs: Sequence[Trajectory],
    completion_len: int,
    ctx: AuxContext,
    cfg: Any,
    *,
    rng: random.Random | None = None,
    teacher: Any = None,
    hints: dict[int, str] | None = None,
    corpus: Sequence[Passage] | None = None,
    batch_size: int = 16,
    prefix_cache: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, float], list[dict[str, Any]]]:
    """The batched IGSD driver for one step → (tensors, metrics, samples) as in ``AuxBatch``.

    Tensors (``B = len(trajs)``, ``T = completion_len``): ``igsd_mask [B, T]`` (1 at verified
    positions), ``igsd_gate [B, T]``, ``igsd_a``/``igsd_b [B, T]`` (long), ``igsd_pT [B, T, 2]``
    (teacher pair distribution over ``(b, a)``). The teacher is ``teacher``, else ``cfg.teacher``'s
    model of ``ctx``; matched completions go through ``ctx.complete``, retrieval through
    ``ctx.retriever`` with ``ctx.topk``, scoring through ``ctx.policy``. ``hints``: row -> the
    teacher's hint line when ``cfg.hindsight`` is not ``answer`` (``igsd.hints``). ``prefix_cache``
    (default) reads each rollout's shared prefix from one KV cache (same numbers).
    """
    rng = rng or random.Random(0)
    B, T = len(trajs), completion_len
    tens = {
        "igsd_mask": torch.zeros(B, T), "igsd_gate": torch.zeros(B, T),
        "igsd_a": torch.zeros(B, T, dtype=torch.long),
        "igsd_b": torch.zeros(B, T, dtype=torch.long),
        "igsd_pT": torch.full((B, T, 2), 0.5),
    }
    m: dict[str, float] = dict.fromkeys(METRIC_KEYS, 0.0)
    samples: list[dict[str, Any]] = [{} for _ in trajs]
    t0 = time.perf_counter()
    tokenizer = ctx.tokenizer
    if teacher is None:
        teacher = select_teacher(cfg.teacher, ctx, getattr(cfg, "ema_decay", None))
    pairs = propose_pairs(trajs, T, teacher, tokenizer, cfg, rng, m, batch_size, hints)
    m["hindsight_rows"] = (float(len(hints)) if hints is not None
                           else m["failed"] - m["rows_no_query"])
    m["positions_selected"] = float(len(pairs))
    m["time_proposal"] = time.perf_counter() - t0
    controls = verify_pairs(pairs, trajs, ctx, cfg, corpus=corpus, rng=rng, m=m,
                            batch_size=batch_size, prefix_cache=prefix_cache)
    done = [(p, c) for p, c in zip(pairs, controls) if p.verified]
    for p, ctl in done:
        tens["igsd_mask"][p.row, p.t] = 1.0
        tens["igsd_gate"][p.row, p.t] = p.gate
        tens["igsd_a"][p.row, p.t] = p.a
        tens["igsd_b"][p.row, p.t] = p.b
        tens["igsd_pT"][p.row, p.t] = torch.tensor(p.p_T)
        samples[p.row].setdefault("igsd_pairs", []).append(pair_record(p, ctl, tokenizer))
    m["positions_verified"] = float(len(done))
    if done:
        m["mean_delta"] = sum(p.delta for p, _ in done) / len(done)
        m["frac_delta_pos"] = sum(p.delta > 0 for p, _ in done) / len(done)
        m["mean_gate"] = sum(p.gate for p, _ in done) / len(done)
    gate_precision_counts([p for p, _ in done], trajs, m)
    return tens, m, samples


def gate_precision_counts(done: Sequence[Pair], trajs: Sequence[Trajectory],
                          m: dict[str, float]) -> None:
    """The gate's precision, as counts (they add up over processes): among verified pairs with
    ``delta > 0`` and with ``delta <= 0``, how many there are and how many of their teacher queries
    retrieved an evidence passage of the question (``delta_pos_teacher_hits / delta_pos_pairs``
    against ``delta_nonpos_teacher_hits / delta_nonpos_pairs``: a gate that helps opens more often
    where the teacher's query found the evidence)."""
    from hindsearch.records import title_key

    for p in done:
        ev = {title_key(e) for e in trajs[p.row].evidence}
        hit = float(bool(ev & {title_key(d.bare_title) for d in p.docs.get("T", [])}))
        side = "pos" if p.delta > 0 else "nonpos"
        m[f"delta_{side}_pairs"] += 1.0
        m[f"delta_{side}_teacher_hits"] += hit



def pair_record(p: Pair, controls: list[list[Passage]], tokenizer: Any) -> dict[str, Any]:
    """The auditable record of one verified pair (stored in samples.jsonl)."""
    return {
        "t": p.t, "student_token": tokenizer.decode([p.a]),
        "teacher_token": tokenizer.decode([p.b]),
        "q_S": p.queries["S"], "q_T": p.queries["T"], "closed_S": p.closed["S"],
        "closed_T": p.closed["T"], "titles_S": [d.bare_title for d in p.docs["S"]],
        "titles_T": [d.bare_title for d in p.docs["T"]],
        "control_ids": [[d.id for d in c] for c in controls],
        "u_S": p.u["S"], "u_T": p.u["T"], "ig_S": p.ig["S"], "ig_T": p.ig["T"], "delta": p.delta,
        "gate": p.gate, "p_T_teacher_token": p.p_T[0],
    }
