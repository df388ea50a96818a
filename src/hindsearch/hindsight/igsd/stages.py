"""Stages 2-5 of IGSD's verification: complete -> execute -> score -> gate, each a function with
typed inputs and outputs that returns its own metrics; ``verify_pairs`` runs them in order and fills
the ``Pair`` records. Models, tokenizer, retriever and query completer come from the term's
``AuxContext``."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.core.scoring import score_continuations, shared_prefix_utilities
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight.igsd.types import (SIDES, Completion, StageMetrics, Pair, Scored, Side)
from hindsearch.records import Passage, Trajectory
from hindsearch.answers import answer_in_text


class QueryCache:
    """Per-step retrieval cache keyed by query string; counts hits and misses."""

    def __init__(self) -> None:
        self.docs: dict[str, list[Passage] | None] = {}
        self.hits = 0
        self.misses = 0
        self.calls = 0
        self.errors = 0

    def fetch(self, retriever: Any, queries: Sequence[str], k: int) -> list[list[Passage] | None]:
        """Results for every query (None when retrieval failed); one batched call for the new
        ones."""
        new: list[str] = []
        for q in queries:
            if q in self.docs or q in new:
                self.hits += 1
            else:
                self.misses += 1
                new.append(q)
        todo = [q for q in new if q.strip()]
        for q in new:
            if not q.strip():
                self.docs[q] = []  # an empty query retrieves nothing (no call)
        if todo:
            self.calls += 1
            try:
                res = retriever.retrieve(todo, k)
                if len(res) != len(todo):
                    raise ValueError(f"retriever returned {len(res)} result lists for {len(todo)} "
                                     "queries")
                for q, r in zip(todo, res):
                    self.docs[q] = list(r)
            except Exception:
                self.errors += len(todo)
                for q in todo:
                    self.docs[q] = None
        return [self.docs[q] for q in queries]


def answer_split(tokenizer: Any, info: str, gold: str) -> tuple[list[int], list[int]]:
    """Context ids (info block + ``<answer>``) and the gold answer's ids, tokenized naturally
    (module doc, 4)."""
    ctx = list(tokenizer(info + protocol.ANSWER_OPEN, add_special_tokens=False)["input_ids"])
    full = list(
        tokenizer(info + protocol.ANSWER_OPEN + " " + gold, add_special_tokens=False)["input_ids"])
    c = 0
    while c < min(len(ctx), len(full)) and ctx[c] == full[c]:
        c += 1
    return full[:c], full[c:]


def control_sampler(
    retriever: Any, corpus: Sequence[Passage] | None, fallback: Sequence[Passage],
    rng: random.Random
) -> Callable[[int], list[Passage]]:
    """``draw(k)`` → k distinct random passages from ``corpus``, else the retriever's passage store
    (``retriever.passages`` or ``retriever.store`` with ``len``/``get``), else ``fallback`` (the
    passages retrieved this step, e.g. for a remote retriever)."""
    if corpus is None and getattr(retriever, "passages", None) is not None:
        corpus = retriever.passages
    store = getattr(retriever, "store", None) if corpus is None else None
    if store is not None and len(store) > 0:
        return lambda k: [store.get(i) for i in rng.sample(range(len(store)), min(k, len(store)))]
    pool = list(corpus) if corpus is not None else list({d.id: d for d in fallback}.values())
    return lambda k: rng.sample(pool, min(k, len(pool)))


def complete_stage(
    pairs: Sequence[Pair], trajs: Sequence[Trajectory], ctx: AuxContext, cfg: Any,
    batch_size: int = 16, prefix_cache: bool = True,
) -> tuple[list[dict[Side, Completion]], StageMetrics]:
    """Both proposals of every pair completed greedily by the current policy, in one batched call of
    the query completer ``ctx.complete`` (the rollout engine's backend); with ``prefix_cache`` each
    rollout's shared prefix is computed once (``groups``: rollout and search). A completion is cut
    after ``</search>``, its EOS dropped."""
    t0 = time.perf_counter()
    prefixes, keys, groups = [], [], []
    for k, p in enumerate(pairs):
        tr = trajs[p.row]
        for side, tok in (("T", p.b), ("S", p.a)):
            prefixes.append(list(tr.prompt_ids) + list(tr.completion_ids[: p.t]) + [tok])
            keys.append((k, side))
            # same rollout and search: prompt + completion[:q_start] shared
            groups.append((p.row, p.q_start))
    if ctx.complete is None:
        raise ValueError("IGSD needs a query completer (AuxContext.complete: the rollout engine)")
    tokenizer = ctx.tokenizer
    outs = ctx.complete.complete_queries(prefixes, cfg.max_query_tokens,
                                         groups if prefix_cache else None, batch_size)
    m: StageMetrics = {"completions": float(len(prefixes)), "never_closed": 0.0}
    close = protocol.search_close_ids(tokenizer)
    res: list[dict[Side, Completion]] = [{} for _ in pairs]
    for (k, side), pre, o in zip(keys, prefixes, outs):
        p, tr = pairs[k], trajs[pairs[k].row]
        ids = o.ids[:-1] if o.finish == "eos" else list(o.ids)
        lead = list(tr.completion_ids[p.q_start : p.t]) + [pre[-1]]
        kept, closed = protocol.cut_at_search_close(tokenizer,
                                                    ids[: cfg.max_query_tokens + len(close)], lead)
        if not closed:
            kept = kept[: cfg.max_query_tokens]
            m["never_closed"] += 1
        query = protocol.query_text(tokenizer, lead + kept)
        res[k][side] = Completion(query, pre + kept + ([] if closed else close), closed)
    m["time_completion"] = time.perf_counter() - t0
    return res, m


def execute_stage(comps: Sequence[dict[Side, Completion]], retriever: Any, topk: int
                  ) -> tuple[list[dict[Side, list[Passage] | None]], StageMetrics]:
    """Both queries of every pair through the retriever: one batched call for the step's new queries
    (per-step cache); ``None`` where retrieval failed."""
    t0 = time.perf_counter()
    cache = QueryCache()
    qlist = [c[s].query for c in comps for s in SIDES]
    docs = cache.fetch(retriever, qlist, topk)
    got = [{s: docs[2 * k + i] for i, s in enumerate(SIDES)} for k in range(len(comps))]
    empty = sum(1 for g in got for d in g.values() if d is not None and not d)
    m: StageMetrics = dict(retrieval_calls=float(cache.calls),
                           retrieval_queries=float(cache.misses), cache_hits=float(cache.hits),
                           cache_hit_rate=cache.hits / max(len(qlist), 1),
                           retrieval_errors=float(cache.errors), empty_results=float(empty))
    m["time_retrieval"] = time.perf_counter() - t0
    return got, m


def shared_state(traj: Trajectory, q_start: int, close: Sequence[int]) -> list[int]:
    """The state ``utility_state = shared`` scores every document set of a pair after: prompt + the
    completion through the rollout's own search at ``q_start`` as it was issued (its turn's
    generated tokens, ``</search>`` included; ``close`` appended when the turn never closed)."""
    q_end = q_start
    while q_end < len(traj.query_mask) and traj.query_mask[q_end]:
        q_end += 1
    for turn in traj.turns:
        if turn.action == "search" and turn.query_span[0] == q_start and turn.gen_span[1] > q_end:
            return list(traj.prompt_ids) + list(traj.completion_ids[: turn.gen_span[1]])
    return list(traj.prompt_ids) + list(traj.completion_ids[:q_end]) + list(close)


def score_stage(
    pairs: Sequence[Pair], trajs: Sequence[Trajectory], comps: Sequence[dict[Side, Completion]],
    got: Sequence[dict[Side, list[Passage] | None]], ctx: AuxContext, cfg: Any, *,
    corpus: Sequence[Passage] | None, rng: random.Random, batch_size: int = 16,
    prefix_cache: bool = True,
) -> tuple[list[Scored | None], list[list[list[Passage]]], StageMetrics]:
    """``u(D)`` under ``ctx.policy`` of each side's documents and of ``n_controls`` shared control
    sets (``ctx.topk`` passages each), in one batched pass (identical sequences scored once) →
    ``(scores, controls, metrics)``; ``None`` / ``[]`` for a pair whose retrieval failed.
    ``prefix_cache`` scores with ``core.scoring.shared_prefix_utilities``, else full-sequence
    forwards (same numbers)."""
    t0 = time.perf_counter()
    m: StageMetrics = {"answers_cut": 0.0}
    tokenizer = ctx.tokenizer
    draw = control_sampler(ctx.retriever, corpus,
                           [d for g in got for ds in g.values() if ds for d in ds], rng)
    seqs: dict[tuple, int] = {}
    slot_state: list[list[int]] = []
    slot_ctx: list[list[int]] = []
    conts: list[list[int]] = []
    slot_group: list[tuple[int, int]] = []

    def slot(state: list[int], passages: Sequence[Passage], gold: str,
             group: tuple[int, int]) -> int:
        ctx, ans = answer_split(tokenizer, protocol.information_block(passages), gold)
        if len(ans) > cfg.max_answer_tokens:
            m["answers_cut"] += 1
            ans = ans[: cfg.max_answer_tokens]
        key = (tuple(state), tuple(ctx), tuple(ans))
        if key not in seqs:
            seqs[key] = len(conts)
            slot_state.append(state)
            slot_ctx.append(ctx)
            conts.append(ans)
            slot_group.append(group)
        return seqs[key]

    plan: list[dict[Side, tuple[int, list[int]]] | None] = []
    controls: list[list[list[Passage]]] = []
    close = protocol.search_close_ids(tokenizer)
    for k, p in enumerate(pairs):
        if got[k]["T"] is None or got[k]["S"] is None:
            plan.append(None)
            controls.append([])
            continue
        gold, grp = trajs[p.row].golden_answers[0], (p.row, p.q_start)
        ctl = [draw(ctx.topk) if cfg.control == "random" else [] for _ in range(cfg.n_controls)]
        controls.append(ctl)
        s0 = shared_state(trajs[p.row], p.q_start, close) if cfg.utility_state == "shared" else None
        st = {s: s0 if s0 is not None else comps[k][s].state for s in SIDES}
        plan.append({s: (slot(st[s], got[k][s], gold, grp),
                         [slot(st[s], c, gold, grp) for c in ctl])
                     for s in SIDES})
    m["utility_evals"] = float(len(conts))
    u = _utilities(ctx.policy, slot_state, slot_ctx, conts, slot_group, batch_size, prefix_cache)
    scores: list[Scored | None] = []
    for pk in plan:
        if pk is None:
            scores.append(None)
            continue
        own = {s: u[pk[s][0]] for s in SIDES}
        controls_mean = {s: sum(u[c] for c in pk[s][1]) / len(pk[s][1]) if pk[s][1] else 0.0
                         for s in SIDES}
        scores.append(Scored(own, {s: own[s] - controls_mean[s] for s in SIDES}))
    m["time_scoring"] = time.perf_counter() - t0
    return scores, controls, m


def _utilities(policy: Any, states: list[list[int]], ctxs: list[list[int]], conts: list[list[int]],
               groups: list[tuple[int, int]], batch_size: int, prefix_cache: bool) -> list[float]:
    """``u`` of every scored sequence (mean answer-token log-prob)."""
    if prefix_cache:
        return shared_prefix_utilities(policy, states, ctxs, conts, groups, batch_size).tolist()
    lp, _, _ = score_continuations(policy, [s + c for s, c in zip(states, ctxs)], conts,
                                   0, batch_size)
    lens = torch.tensor([max(len(c), 1) for c in conts], dtype=torch.float)
    return (lp.sum(-1) / lens).tolist()


def gate_stage(scores: Sequence[Scored | None], cfg: Any) -> list[tuple[float, float] | None]:
    """``(delta, gate)`` of each scored pair: ``delta = IG_T - IG_S``; the gate per ``cfg.gate``
    (``losses.gate``) of ``delta``, or with ``gate_input = min_controls`` of ``min(delta, IG_T)``:
    the teacher's documents must also beat the random controls (without controls, ``IG_T = u_T`` and
    ``delta`` alone is used)."""
    out: list[tuple[float, float] | None] = []
    for sc in scores:
        if sc is None:
            out.append(None)
            continue
        delta = sc.ig["T"] - sc.ig["S"]
        x = (min(delta, sc.ig["T"]) if cfg.gate_input == "min_controls" and cfg.n_controls > 0
             else delta)
        g = losses.gate(torch.tensor([x]), cfg.gate, cfg.gate_sharpness, cfg.margin)
        out.append((delta, float(g[0])))
    return out


def verify_pairs(
    pairs: list[Pair], trajs: Sequence[Trajectory], ctx: AuxContext, cfg: Any, *,
    corpus: Sequence[Passage] | None, rng: random.Random, m: dict[str, float], batch_size: int = 16,
    prefix_cache: bool = True,
) -> list[list[list[Passage]]]:
    """complete -> execute -> score -> gate for ``pairs``; each stage's results are written into its
    ``Pair`` (the auditable record) and its metrics added to ``m``. Returns each pair's control sets
    (``[]`` for pairs that could not be verified)."""
    comps, mc = complete_stage(pairs, trajs, ctx, cfg, batch_size, prefix_cache)
    for p, c in zip(pairs, comps):
        for s in SIDES:
            p.queries[s], p.states[s], p.closed[s] = c[s].query, c[s].state, c[s].closed
    keep = list(range(len(pairs)))
    # a teacher query that names the answer verifies nothing the student can reach
    if cfg.proposals == "reachable":
        keep = [k for k in keep
                if not answer_in_text(trajs[pairs[k].row].golden_answers, comps[k]["T"].query)]
        m["alias_queries_dropped"] = m.get("alias_queries_dropped", 0.0) + len(pairs) - len(keep)
    kp, kc = [pairs[k] for k in keep], [comps[k] for k in keep]
    got, me = execute_stage(kc, ctx.retriever, ctx.topk)
    scores, kept_controls, ms = score_stage(kp, trajs, kc, got, ctx, cfg, corpus=corpus, rng=rng,
                                            batch_size=batch_size, prefix_cache=prefix_cache)
    for stage in (mc, me, ms):
        for key, v in stage.items():
            summed = key.startswith("time_") or key in ("never_closed", "answers_cut")
            m[key] = m.get(key, 0.0) + v if summed else v
    controls: list[list[list[Passage]]] = [[] for _ in pairs]
    for k, ctl in zip(keep, kept_controls):
        controls[k] = ctl
    for p, g, sc, dg in zip(kp, got, scores, gate_stage(scores, cfg)):
        if sc is None or dg is None:
            continue
        p.u, p.ig, p.docs = dict(sc.u), dict(sc.ig), {s: g[s] for s in SIDES}
        p.delta, p.gate, p.verified = dg[0], dg[1], True
    return controls
