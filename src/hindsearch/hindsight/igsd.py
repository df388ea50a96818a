"""IGSD's verification pipeline, one training step read top to bottom: the teacher (policy + gold
answer line, or a redacted hint) proposes query tokens of failed rollouts (stage 1,
``propose_pairs``); each proposal and the student's token are completed into a query, executed
against the retriever and scored against control passages, and the pair is gated (stages 2-5,
``verify_pairs``); ``run_igsd`` runs one step from the term's ``AuxContext`` and returns the
tensors, metrics and auditable records the term hands to the trainer. Every rank makes the same
model-core calls, so several processes stay in lockstep. docs/methods.md gives the algorithm in
full.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.answers import answer_in_text
from hindsearch.core.scoring import score_continuations, shared_prefix_utilities
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight.judge import redact
from hindsearch.hindsight.teacher import (igsd_prompt_ids, select_teacher, teacher_token_logprobs,
                                          through_last_query)
from hindsearch.records import Passage, Trajectory


# --- records: a proposed pair (also the auditable record), each stage's typed output, the metric
# keys

@dataclass
class Pair:
    """One verified position: student token ``a`` vs teacher token ``b`` at completion index ``t``
    of row ``row``."""

    row: int
    t: int
    a: int
    b: int
    p_T: tuple[float, float]
    """Teacher pair distribution over ``(b, a)``."""
    q_start: int
    queries: dict[str, str] = field(default_factory=dict)  # "T"/"S" -> query string
    states: dict[str, list[int]] = field(default_factory=dict)
    closed: dict[str, bool] = field(default_factory=dict)
    ig: dict[str, float] = field(default_factory=dict)
    u: dict[str, float] = field(default_factory=dict)
    docs: dict[str, list[Passage]] = field(default_factory=dict)
    delta: float = 0.0
    gate: float = 0.0
    verified: bool = False



METRIC_KEYS = (
    "failed", "rows_no_query", "positions_considered", "positions_selected", "positions_verified",
    "teacher_agree", "answer_tokens_dropped", "proposals", "proposals_gold",
    "positions_unreachable", "alias_queries_dropped",
    "hindsight_rows",
    "completions", "never_closed", "retrieval_calls", "retrieval_queries", "cache_hits",
    "cache_hit_rate", "retrieval_errors", "empty_results", "answers_cut", "utility_evals",
    "mean_delta", "frac_delta_pos", "mean_gate",
    "delta_pos_pairs", "delta_pos_teacher_hits", "delta_nonpos_pairs", "delta_nonpos_teacher_hits",
    "time_proposal", "time_completion", "time_retrieval", "time_scoring",
)


# ---- the stages after the proposal: complete -> execute -> score -> gate, typed inputs and outputs
Side = str
"""``"T"`` (the teacher's token ``b``) or ``"S"`` (the student's token ``a``)."""



SIDES: tuple[Side, Side] = ("T", "S")



@dataclass
class Completion:
    """Stage 2 (matched completion) of one side of a pair."""

    query: str
    """The executed query string."""
    state: list[int]
    """prompt + completion[:t] + proposed token + its completion (+ ``</search>`` when it never
    closed)."""
    closed: bool



@dataclass
class Scored:
    """Stage 4 (scoring) of one pair: utilities of each side's own documents and their gains over
    the controls."""

    u: dict[Side, float]
    ig: dict[Side, float]



StageMetrics = dict[str, float]


# --- the teacher's hindsight other than the answer line: the judge's redacted critique, or a group
# summary. Both are FEEDBACK_TEMPLATE lines with every gold answer string replaced by [ANSWER]
# (judge.redact), so the teacher learns where to search from what the group or the judge saw, never
# from the answer's name.

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


# --- stage 1, propose: the teacher scores the student's failed query tokens; where it prefers
# another token, a pair

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


# --- stages 2-5: complete -> execute -> score -> gate, each with typed inputs and outputs and its
# own metrics; verify_pairs runs them in order and fills the Pair records. Models, tokenizer,
# retriever and query completer come from the term's AuxContext.

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


# --- the batched driver of one training step

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
