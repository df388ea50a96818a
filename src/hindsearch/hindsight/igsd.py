"""IGSD: verify the teacher's query-token proposals by executing them, then distil gated pairs.

For every failed rollout (teacher context = prompt + ``(The correct answer is: {A[0]}.)``,
teacher-forced on the student's completion):

1. **Positions** (``select_positions``): query tokens where the teacher's top token ``b_t`` differs
   from the student's sampled token ``a_t`` (``disagree``; the ``max_positions_per_rollout`` with the
   largest teacher preference ``log pT(b) - log pT(a)`` are kept), or ``all`` (the first ones) or
   ``random`` query tokens.
2. **Matched completion**: ``prefix + a_t`` and ``prefix + b_t`` (prefix = prompt + completion[:t])
   are completed greedily by the *current policy* (no hindsight) until ``</search>``, at most
   ``max_query_tokens`` new tokens, all in one batched call per step (``RolloutEngine.complete_queries``
   when the trainer gives an engine, else ``greedy_complete`` here); a completion that never closes
   is cut there and still executed (counted).
3. **Execution**: both query strings go through the rollout's retriever with its top-k, one batched
   ``retrieve`` call per step for the queries not in the per-step cache (keyed by query string).
4. **Utility** ``u(D)``: mean log-prob, under the current policy, of the first gold answer's tokens
   (cut to ``max_answer_tokens``, counted) after ``state + information_block(D) + "<answer> "``, where
   ``state`` = prompt + completion[:t] + proposed token + its completion (+ ``</search>`` when it
   never closed). The answer tokens are those of ``info + "<answer> " + gold`` beyond its longest
   common token prefix with ``info + "<answer>"`` (the natural tokenization of `` gold``).
5. **Controls**: ``n_controls`` random passage sets (``control = random``: ``topk`` passages from the
   corpus, drawn once per pair) or empty blocks (``control = empty``), shared by both queries of the
   pair, each scored with the query's own state: ``IG(q) = u(D_q) - mean_j u(C_j | q)``.
6. ``delta = IG(q_T) - IG(q_S)``; gate per config (``losses.gate``).
7. The teacher's pair distribution ``p_T`` over ``(b_t, a_t)`` is stored; the student's pair logits
   are read from the live logits at loss time (``losses.pair_kl``).

Cost (``prefix_cache=True``, the default): all completions and utility evaluations of one search of
one rollout share ``prompt + completion[:q_start]``; that prefix is run once per (rollout, search)
into a KV cache and only the suffixes are run against row copies of it (``cached_greedy_complete``,
``cached_utilities``; identical prefixes / sequences once; only answer-position logits kept). Same
numbers as the plain full-sequence path (``prefix_cache=False``) up to float noise (tested).

Several processes (``hindsearch.hindsight.sync``): the proposal (teacher), the matched completion and the
scoring (policy) are lockstep regions that every rank enters, even with no failed rollout or no pair, so
ranks run the same number of forwards through sharded weights; a single process runs exactly as before.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.hindsight import losses, sync
from hindsearch.hindsight.teacher import continuation_logprobs, igsd_prompt_ids, teacher_token_logprobs, through_last_query
from hindsearch.records import Passage, Trajectory

CLOSE = "</search>"
CompleteFn = Callable[[list[list[int]], int], list[tuple[list[int], str, bool]]]


@dataclass
class Pair:
    """One verified position: student token ``a`` vs teacher token ``b`` at completion index ``t`` of row ``row``."""

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


class QueryCache:
    """Per-step retrieval cache keyed by query string; counts hits and misses."""

    def __init__(self) -> None:
        self.docs: dict[str, list[Passage] | None] = {}
        self.hits = 0
        self.misses = 0
        self.calls = 0
        self.errors = 0

    def fetch(self, retriever: Any, queries: Sequence[str], k: int) -> list[list[Passage] | None]:
        """Results for every query (None when retrieval failed); one batched call for the new ones."""
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
                    raise ValueError(f"retriever returned {len(res)} result lists for {len(todo)} queries")
                for q, r in zip(todo, res):
                    self.docs[q] = list(r)
            except Exception:
                self.errors += len(todo)
                for q in todo:
                    self.docs[q] = None
        return [self.docs[q] for q in queries]


def select_positions(
    query_mask: Sequence[int],
    a_ids: Sequence[int],
    b_ids: Sequence[int],
    pref: Sequence[float],
    mode: str,
    cap: int,
    rng: random.Random,
) -> list[int]:
    """Completion indices to verify for one rollout, sorted; ``pref[t] = log pT(b_t) - log pT(a_t)``."""
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


def _close_ids(tokenizer: Any) -> list[int]:
    return list(tokenizer(CLOSE, add_special_tokens=False)["input_ids"])


def cut_completion(tokenizer: Any, ids: Sequence[int], lead: Sequence[int] = ()) -> tuple[list[int], bool]:
    """Keep generated ids up to the token that completes ``</search>`` (searched in the text of
    ``lead + ids``, so a ``</search>`` that starts in the proposed token counts); ``(ids, closed)``."""
    ids, lead = list(ids), list(lead)
    for j in range(0 if lead else 1, len(ids) + 1):
        if CLOSE in tokenizer.decode(lead + ids[:j]):
            return ids[:j], True
    return ids, False


def query_text(tokenizer: Any, query_ids: Sequence[int]) -> str:
    """The query string of ids that start right after ``<search>`` (text up to ``</search>``, stripped)."""
    return tokenizer.decode(list(query_ids), skip_special_tokens=True).split(CLOSE, 1)[0].strip()


@torch.no_grad()
def greedy_complete(model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int) -> list[tuple[list[int], str, bool]]:
    """Fallback matched completion (when no rollout engine is given): batched greedy decoding with a
    KV cache, left-padded, each row stopping at ``</search>`` or EOS; ``(new ids, new text, closed)``."""
    with sync.lockstep(lambda: sync.pad_forward(model, _pad_id(tokenizer))()):
        return _greedy_complete(model, tokenizer, prefixes, max_tokens) if prefixes else []


def _greedy_complete(model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int) -> list[tuple[list[int], str, bool]]:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    L = max(len(p) for p in prefixes)
    dev = next(model.parameters()).device
    ids = torch.full((len(prefixes), L), pad, dtype=torch.long)
    att = torch.zeros(len(prefixes), L, dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, L - len(p) :] = torch.tensor(p)
        att[i, L - len(p) :] = 1
    ids, att = ids.to(dev), att.to(dev)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    out = sync.forward(model, input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True, logits_to_keep=1)
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in transformers 5.2x
    new: list[list[int]] = [[] for _ in prefixes]
    done = [False] * len(prefixes)
    lead = [p[-1:] for p in prefixes]
    for _ in range(max_tokens):
        nxt = out.logits[:, -1].argmax(-1)
        for i, x in enumerate(nxt.tolist()):
            if done[i]:
                continue
            if x == tokenizer.eos_token_id:
                done[i] = True
                continue
            new[i].append(x)
            done[i] = CLOSE in tokenizer.decode(lead[i] + new[i][-4:])
        if all(done):
            break
        att = torch.cat([att, torch.ones_like(att[:, :1])], dim=1)
        pos = pos[:, -1:] + 1
        out = sync.forward(model, input_ids=nxt[:, None], attention_mask=att, position_ids=pos, use_cache=True,
                           logits_to_keep=1, **{kw: out.past_key_values})
    res = []
    for i, g in enumerate(new):
        kept, closed = cut_completion(tokenizer, g, lead[i])
        res.append((kept, tokenizer.decode(kept), closed))
    return res


# ---- prefix-cached forwards: rows that share a long prefix (same rollout) read it from one KV cache ----


def _cache_kw(model: Any) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in transformers 5.2x


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _pad_id(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0)


def shared_prefix_len(seqs: Sequence[Sequence[int]], keep: int = 0) -> int:
    """Length of the longest common prefix of ``seqs``, leaving at least ``keep`` ids of the shortest one."""
    n = min(len(s) for s in seqs) - keep
    c, first = 0, seqs[0]
    while c < n and all(s[c] == first[c] for s in seqs):
        c += 1
    return c


@torch.no_grad()
def base_cache(model: Any, bases: Sequence[Sequence[int]], pad: int) -> tuple[Any, torch.Tensor]:
    """KV cache of the left-padded ``bases`` (one forward, only the last logit kept) → ``(cache, att [n, P])``."""
    dev = next(model.parameters()).device
    P = max(len(b) for b in bases)
    ids = torch.full((len(bases), P), pad, dtype=torch.long)
    att = torch.zeros(len(bases), P, dtype=torch.long)
    for i, b in enumerate(bases):
        ids[i, P - len(b) :] = torch.tensor(list(b), dtype=torch.long)
        att[i, P - len(b) :] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    out = sync.forward(model, input_ids=ids.to(dev), attention_mask=att.to(dev), position_ids=pos.to(dev),
                       use_cache=True, logits_to_keep=1)
    return _cache_of(out), att.to(dev)


def expand_cache(model: Any, cache: Any, idx: torch.Tensor) -> Any:
    """A new cache whose row ``j`` is row ``idx[j]`` of ``cache`` (rows may repeat); ``cache`` is untouched."""
    from transformers import DynamicCache

    return DynamicCache([(layer.keys[idx], layer.values[idx]) for layer in cache.layers], config=model.config)


@torch.no_grad()
def suffix_forward(
    model: Any, cache: Any, base_att: torch.Tensor, owner: Sequence[int], left: Sequence[Sequence[int]],
    right: Sequence[Sequence[int]], pad: int, keep: int,
) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """Forward ``left[j] + right[j]`` after cached base row ``owner[j]``: ``left`` parts are left-padded to a
    common width (so every ``right`` part starts at the same column), ``right`` parts right-padded.

    Returns ``(out, new cache, att [m, P + W], pos [m, W])``; ``out.logits`` holds the last ``keep`` columns.
    The base cache is not modified (rows are copied with ``expand_cache``).
    """
    dev = base_att.device
    m, W1, W2 = len(owner), max(len(x) for x in left), max((len(x) for x in right), default=0)
    ids = torch.full((m, W1 + W2), pad, dtype=torch.long)
    satt = torch.zeros(m, W1 + W2, dtype=torch.long)
    for j, (lf, rt) in enumerate(zip(left, right)):
        ids[j, W1 - len(lf) : W1 + len(rt)] = torch.tensor(list(lf) + list(rt), dtype=torch.long)
        satt[j, W1 - len(lf) : W1 + len(rt)] = 1
    idx = torch.tensor(list(owner), dtype=torch.long, device=dev)
    batt = base_att[idx]
    satt = satt.to(dev)
    pos = (batt.sum(-1, keepdim=True) + satt.cumsum(-1) - 1).clamp(min=0)
    att = torch.cat([batt, satt], dim=1)
    kv = expand_cache(model, cache, idx)
    out = sync.forward(model, input_ids=ids.to(dev), attention_mask=att, position_ids=pos, use_cache=True,
                       logits_to_keep=keep, **{_cache_kw(model): kv})
    return out, _cache_of(out), att, pos


def _chunks(groups: Sequence[Hashable], batch_size: int) -> list[tuple[list[Hashable], list[int]]]:
    """Split row indices by group: ``[(group keys of a chunk, its rows)]``, at most ``batch_size`` groups a chunk."""
    gids = list(dict.fromkeys(groups))
    res = []
    for s in range(0, len(gids), batch_size):
        gs = set(gids[s : s + batch_size])
        res.append((gids[s : s + batch_size], [i for i, g in enumerate(groups) if g in gs]))
    return res


@torch.no_grad()
def cached_greedy_complete(
    model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int, groups: Sequence[Hashable] | None = None,
    batch_size: int = 16,
) -> list[tuple[list[int], str, bool]]:
    """``greedy_complete`` with shared prefixes computed once: prefixes of one group (e.g. one rollout) are
    decoded from one KV cache of their common prefix; identical prefixes are completed once.
    ``(new ids, new text, closed)`` per prefix, as ``greedy_complete``; up to ``2 * batch_size`` rows decode together."""
    with sync.lockstep(lambda: sync.pad_forward(model, _pad_id(tokenizer))()):
        return _cached_greedy_complete(model, tokenizer, prefixes, max_tokens, groups, batch_size) if prefixes else []


def _cached_greedy_complete(
    model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int, groups: Sequence[Hashable] | None,
    batch_size: int,
) -> list[tuple[list[int], str, bool]]:
    groups = list(groups) if groups is not None else list(range(len(prefixes)))
    uniq: dict[tuple[Hashable, tuple[int, ...]], int] = {}
    rows: list[int] = []
    for i, (g, p) in enumerate(zip(groups, prefixes)):
        if (g, tuple(p)) not in uniq:
            uniq[(g, tuple(p))] = i
            rows.append(i)
    new: dict[int, list[int]] = {i: [] for i in rows}
    pad, eos = _pad_id(tokenizer), tokenizer.eos_token_id
    for gs, members in _chunks([groups[i] for i in rows], batch_size):
        members = [rows[j] for j in members]
        base_len = {g: shared_prefix_len([prefixes[i] for i in members if groups[i] == g], keep=1) for g in gs}
        cache, batt = base_cache(model, [prefixes[next(i for i in members if groups[i] == g)][: base_len[g]] for g in gs], pad)
        gi = {g: k for k, g in enumerate(gs)}
        members = sorted(members, key=lambda i: len(prefixes[i]) - base_len[groups[i]])  # less padding
        for s in range(0, len(members), 2 * batch_size):
            sub = members[s : s + 2 * batch_size]
            left = [prefixes[i][base_len[groups[i]] :] for i in sub]
            out, kv, att, pos = suffix_forward(model, cache, batt, [gi[groups[i]] for i in sub], left, [[]] * len(sub), pad, 1)
            live, last = list(sub), pos[:, -1]
            for _ in range(max_tokens):
                nxt = out.logits[:, -1].argmax(-1)
                keep = []
                for j, (i, x) in enumerate(zip(live, nxt.tolist())):
                    if x == eos:
                        continue
                    new[i].append(x)
                    if CLOSE not in tokenizer.decode(prefixes[i][-1:] + new[i][-4:]):
                        keep.append(j)
                if not keep or len(new[live[keep[0]]]) >= max_tokens:
                    break
                if len(keep) < len(live):
                    sel = torch.tensor(keep, device=att.device)
                    kv.batch_select_indices(sel)
                    att, nxt, last = att[sel], nxt[sel], last[sel]
                    live = [live[j] for j in keep]
                att = torch.cat([att, torch.ones_like(att[:, :1])], dim=1)
                last = last + 1
                out = sync.forward(model, input_ids=nxt[:, None], attention_mask=att, position_ids=last[:, None],
                                   use_cache=True, logits_to_keep=1, **{_cache_kw(model): kv})
    res = []
    for i, p in enumerate(prefixes):
        g = new[uniq[(groups[i], tuple(p))]]
        kept, closed = cut_completion(tokenizer, g, p[-1:])
        res.append((kept, tokenizer.decode(kept), closed))
    return res


@torch.no_grad()
def cached_utilities(
    model: Any, states: Sequence[Sequence[int]], ctxs: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
    groups: Sequence[Hashable], batch_size: int = 16,
) -> torch.Tensor:
    """``u [N]``: mean log-prob of ``answers[i]`` after ``states[i] + ctxs[i]`` (0 for an empty answer), with the
    common prefix of the states of one group computed once and only answer-position logits materialised."""
    with sync.lockstep(lambda: sync.pad_forward(model, _pad_id_model(model))()):
        return _cached_utilities(model, states, ctxs, answers, groups, batch_size)


def _cached_utilities(
    model: Any, states: Sequence[Sequence[int]], ctxs: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
    groups: Sequence[Hashable], batch_size: int,
) -> torch.Tensor:
    u = torch.zeros(len(states))
    pad = _pad_id_model(model)
    for gs, members in _chunks(groups, batch_size):
        base_len = {g: shared_prefix_len([states[i] for i in members if groups[i] == g]) for g in gs}
        cache, batt = base_cache(model, [states[next(i for i in members if groups[i] == g)][: base_len[g]] for g in gs], pad)
        gi = {g: k for k, g in enumerate(gs)}
        members = sorted(members, key=lambda i: len(states[i]) - base_len[groups[i]] + len(ctxs[i]))  # less padding
        for s in range(0, len(members), batch_size):
            sub = [i for i in members[s : s + batch_size]]
            Tb = max(len(answers[i]) for i in sub)
            if Tb == 0:
                continue
            left = [list(states[i][base_len[groups[i]] :]) + list(ctxs[i]) for i in sub]
            out, _, _, _ = suffix_forward(model, cache, batt, [gi[groups[i]] for i in sub], left,
                                          [answers[i] for i in sub], pad, Tb + 1)
            logits = out.logits[:, :Tb].float()  # [m, Tb, V]: column t predicts answer token t
            tgt = torch.zeros(len(sub), Tb, dtype=torch.long)
            amask = torch.zeros(len(sub), Tb)
            for j, i in enumerate(sub):
                tgt[j, : len(answers[i])] = torch.tensor(list(answers[i]), dtype=torch.long)
                amask[j, : len(answers[i])] = 1
            lp = (logits.gather(-1, tgt.to(logits.device)[..., None])[..., 0] - torch.logsumexp(logits, -1)).cpu()
            u[sub] = (lp * amask).sum(-1) / amask.sum(-1).clamp(min=1)
    return u


def _pad_id_model(model: Any) -> int:
    pid = getattr(model.config, "pad_token_id", None)
    if pid is None:
        pid = getattr(model.config, "eos_token_id", None)
        pid = pid[0] if isinstance(pid, list) else pid
    return int(pid or 0)


def answer_split(tokenizer: Any, info: str, gold: str) -> tuple[list[int], list[int]]:
    """Context ids (info block + ``<answer>``) and the gold answer's ids, tokenized naturally (module doc, 4)."""
    ctx = list(tokenizer(info + "<answer>", add_special_tokens=False)["input_ids"])
    full = list(tokenizer(info + "<answer> " + gold, add_special_tokens=False)["input_ids"])
    c = 0
    while c < min(len(ctx), len(full)) and ctx[c] == full[c]:
        c += 1
    return full[:c], full[c:]


def control_sampler(
    retriever: Any, corpus: Sequence[Passage] | None, fallback: Sequence[Passage], rng: random.Random
) -> Callable[[int], list[Passage]]:
    """``draw(k)`` → k distinct random passages from ``corpus``, else the retriever's passage store
    (``retriever.passages`` or ``retriever.store`` with ``len``/``get``), else ``fallback`` (the
    passages retrieved this step, e.g. for a remote retriever)."""
    if corpus is None and getattr(retriever, "passages", None) is not None:
        corpus = retriever.passages
    if corpus is None and getattr(retriever, "store", None) is not None and len(retriever.store) > 0:
        store = retriever.store
        return lambda k: [store.get(i) for i in rng.sample(range(len(store)), min(k, len(store)))]
    pool = list(corpus) if corpus is not None else list({d.id: d for d in fallback}.values())
    return lambda k: rng.sample(pool, min(k, len(pool)))


METRIC_KEYS = (
    "failed", "rows_no_query", "positions_considered", "positions_selected", "positions_verified", "teacher_agree",
    "completions", "never_closed", "retrieval_calls", "retrieval_queries", "cache_hits", "cache_hit_rate",
    "retrieval_errors", "empty_results", "answers_cut", "utility_evals", "mean_delta", "frac_delta_pos", "mean_gate",
    "time_proposal", "time_completion", "time_retrieval", "time_scoring",
)


def propose_pairs(
    trajs: Sequence[Trajectory], T: int, teacher: Any, tokenizer: Any, cfg: Any, rng: random.Random,
    m: dict[str, float], batch_size: int = 16,
) -> list[Pair]:
    """Teacher forward (gold hindsight) on failed rollouts with query tokens → the positions to verify."""
    failed = [i for i, tr in enumerate(trajs) if tr.failed]
    rows = [i for i in failed if any(trajs[i].query_mask[:T]) and trajs[i].golden_answers]
    m["failed"], m["rows_no_query"] = float(len(failed)), float(len(failed) - len(rows))
    if not rows and not sync.active():  # several processes: an idle rank still joins the teacher's forwards
        return []
    prompts = [igsd_prompt_ids(tokenizer, trajs[i].question, trajs[i].golden_answers) for i in rows]
    comps = [through_last_query(trajs[i].completion_ids, trajs[i].query_mask, T) for i in rows]  # exact: scores at query tokens only
    lT, top_ids, top_lp = teacher_token_logprobs(teacher, prompts, comps, topk=1, batch_size=batch_size)
    pairs = []
    for j, i in enumerate(rows):
        tr, n = trajs[i], len(comps[j])
        a, b = comps[j], top_ids[j, :n, 0].tolist()
        pref = (top_lp[j, :n, 0] - lT[j, :n]).tolist()
        qm = list(tr.query_mask[:n])
        m["positions_considered"] += sum(qm)
        m["teacher_agree"] += sum(1 for t in range(n) if qm[t] and a[t] == b[t])
        for t in select_positions(qm, a, b, pref, cfg.positions, cfg.max_positions_per_rollout, rng):
            p_T = losses.pair_probs(top_lp[j, t, 0:1], lT[j, t : t + 1])[0].tolist()
            pairs.append(Pair(i, t, a[t], b[t], (p_T[0], p_T[1]), query_start(tr.query_mask, t)))
    return pairs


def query_start(query_mask: Sequence[int], t: int) -> int:
    """First index of the run of query tokens that contains ``t``."""
    while t > 0 and query_mask[t - 1]:
        t -= 1
    return t


def verify_pairs(
    pairs: list[Pair], trajs: Sequence[Trajectory], *, policy: Any, tokenizer: Any, retriever: Any, cfg: Any,
    topk: int, complete: CompleteFn | None, corpus: Sequence[Passage] | None, rng: random.Random, m: dict[str, float],
    batch_size: int = 16, prefix_cache: bool = True,
) -> list[list[list[Passage]]]:
    """Matched completion, execution, utilities with shared controls, delta and gate, filled into ``pairs``.

    ``complete=None`` decodes with ``policy`` here: ``cached_greedy_complete`` (one KV cache of each
    rollout's shared prefix) when ``prefix_cache``, else ``greedy_complete``. Utilities are scored with
    ``cached_utilities`` (each rollout's shared state prefix computed once) when ``prefix_cache``, else
    by full-sequence forwards (``continuation_logprobs``); both compute the same numbers.
    Returns the control sets of each pair (``[]`` for pairs that could not be verified).
    """
    # matched completion: both proposals of every pair in one batched call
    t0 = time.perf_counter()
    prefixes, keys, groups = [], [], []
    for k, p in enumerate(pairs):
        tr = trajs[p.row]
        for side, tok in (("T", p.b), ("S", p.a)):
            prefixes.append(list(tr.prompt_ids) + list(tr.completion_ids[: p.t]) + [tok])
            keys.append((k, side))
            groups.append((p.row, p.q_start))  # same rollout and search: prompt + completion[:q_start] shared
    if complete is None and prefix_cache:
        outs = cached_greedy_complete(policy, tokenizer, prefixes, cfg.max_query_tokens, groups, batch_size)
    elif complete is None:
        outs = greedy_complete(policy, tokenizer, prefixes, cfg.max_query_tokens)
    else:  # several processes: every rank calls the engine (its HF backend runs in lockstep), even with nothing
        outs = complete(prefixes, cfg.max_query_tokens) if prefixes or sync.active() else []
    m["completions"] = float(len(prefixes))
    close = _close_ids(tokenizer)
    for (k, side), pre, (ids, _text, _closed) in zip(keys, prefixes, outs):
        p, tr = pairs[k], trajs[pairs[k].row]
        ids = list(ids)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id in ids:
            ids = ids[: ids.index(tokenizer.eos_token_id)]
        lead = list(tr.completion_ids[p.q_start : p.t]) + [pre[-1]]
        kept, closed = cut_completion(tokenizer, ids[: cfg.max_query_tokens + len(close)], lead)
        if not closed:
            kept = kept[: cfg.max_query_tokens]
            m["never_closed"] += 1
        p.queries[side] = query_text(tokenizer, lead + kept)
        p.states[side] = pre + kept + ([] if closed else close)
        p.closed[side] = closed
    m["time_completion"] += time.perf_counter() - t0

    # execution: one batched retrieval call for the step's new queries (per-step cache)
    t0 = time.perf_counter()
    cache = QueryCache()
    qlist = [p.queries[s] for p in pairs for s in ("T", "S")]
    docs = cache.fetch(retriever, qlist, topk)
    got = {(k, s): docs[2 * k + (0 if s == "T" else 1)] for k in range(len(pairs)) for s in ("T", "S")}
    m.update(retrieval_calls=float(cache.calls), retrieval_queries=float(cache.misses), cache_hits=float(cache.hits),
             cache_hit_rate=cache.hits / max(len(qlist), 1), retrieval_errors=float(cache.errors),
             empty_results=float(sum(1 for d in got.values() if d is not None and not d)))
    m["time_retrieval"] += time.perf_counter() - t0

    # utilities with shared controls: one batched scoring pass, identical sequences scored once
    t0 = time.perf_counter()
    draw = control_sampler(retriever, corpus, [d for ds in docs if ds for d in ds], rng)
    seqs: dict[tuple, int] = {}
    prefs: list[list[int]] = []
    conts: list[list[int]] = []
    slot_state: list[list[int]] = []
    slot_ctx: list[list[int]] = []
    slot_group: list[tuple[int, int]] = []

    def slot(state: list[int], passages: Sequence[Passage], gold: str, group: tuple[int, int]) -> int:
        ctx, ans = answer_split(tokenizer, protocol.information_block(passages), gold)
        if len(ans) > cfg.max_answer_tokens:
            m["answers_cut"] += 1
            ans = ans[: cfg.max_answer_tokens]
        key = (tuple(state), tuple(ctx), tuple(ans))
        if key not in seqs:
            seqs[key] = len(prefs)
            prefs.append(state + ctx)
            conts.append(ans)
            slot_state.append(state)
            slot_ctx.append(ctx)
            slot_group.append(group)
        return seqs[key]

    plan, all_controls = [], []
    for k, p in enumerate(pairs):
        if got[(k, "T")] is None or got[(k, "S")] is None:
            all_controls.append([])
            continue
        gold = trajs[p.row].golden_answers[0]
        controls = [draw(topk) if cfg.control == "random" else [] for _ in range(cfg.n_controls)]
        all_controls.append(controls)
        plan.append((k, {s: (slot(p.states[s], got[(k, s)], gold, (p.row, p.q_start)),
                             [slot(p.states[s], c, gold, (p.row, p.q_start)) for c in controls])
                         for s in ("T", "S")}))
    m["utility_evals"] = float(len(prefs))
    u: list[float] = []
    scored = bool(prefs) or sync.active()  # several processes: an idle rank still joins the policy's forwards
    if scored and prefix_cache:
        u = cached_utilities(policy, slot_state, slot_ctx, conts, slot_group, batch_size).tolist()
    elif scored:
        lp, _, _ = continuation_logprobs(policy, prefs, conts, 0, batch_size)
        lens = torch.tensor([max(len(c), 1) for c in conts], dtype=torch.float)
        u = (lp.sum(-1) / lens).tolist()
    for k, plan_k in plan:
        p = pairs[k]
        for s in ("T", "S"):
            own, ctl = plan_k[s]
            p.u[s] = u[own]
            p.ig[s] = u[own] - (sum(u[c] for c in ctl) / len(ctl) if ctl else 0.0)
            p.docs[s] = got[(k, s)]
        p.delta = p.ig["T"] - p.ig["S"]
        p.gate = float(losses.gate(torch.tensor([p.delta]), cfg.gate, cfg.gate_sharpness, cfg.margin)[0])
        p.verified = True
    m["time_scoring"] += time.perf_counter() - t0
    return all_controls


def run_igsd(
    trajs: Sequence[Trajectory],
    completion_len: int,
    *,
    policy: Any,
    teacher: Any,
    tokenizer: Any,
    retriever: Any,
    cfg: Any,
    topk: int,
    complete: CompleteFn | None = None,
    corpus: Sequence[Passage] | None = None,
    rng: random.Random | None = None,
    batch_size: int = 16,
    prefix_cache: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, float], list[dict[str, Any]]]:
    """The batched IGSD driver for one step → (tensors, metrics, samples) as in ``AuxBatch``.

    Tensors (``B = len(trajs)``, ``T = completion_len``): ``igsd_mask [B, T]`` (1 at verified
    positions), ``igsd_gate [B, T]``, ``igsd_a``/``igsd_b [B, T]`` (long), ``igsd_pT [B, T, 2]``
    (teacher pair distribution over ``(b, a)``). ``complete`` defaults to ``greedy_complete`` with
    ``policy``; random controls come from ``control_sampler``. ``prefix_cache`` (default) reads each
    rollout's shared prefix from one KV cache in completion and scoring (same numbers, much cheaper);
    a ``complete`` that is a rollout engine's HF decoding of ``policy`` is then replaced by the cached
    greedy decoder (the same greedy decoding of the same model).
    """
    rng = rng or random.Random(0)
    B, T = len(trajs), completion_len
    tens = {
        "igsd_mask": torch.zeros(B, T), "igsd_gate": torch.zeros(B, T),
        "igsd_a": torch.zeros(B, T, dtype=torch.long), "igsd_b": torch.zeros(B, T, dtype=torch.long),
        "igsd_pT": torch.full((B, T, 2), 0.5),
    }
    m: dict[str, float] = dict.fromkeys(METRIC_KEYS, 0.0)
    samples: list[dict[str, Any]] = [{} for _ in trajs]
    t0 = time.perf_counter()
    pairs = propose_pairs(trajs, T, teacher, tokenizer, cfg, rng, m, batch_size)
    m["positions_selected"] = float(len(pairs))
    m["time_proposal"] = time.perf_counter() - t0
    if not pairs and not sync.active():  # several processes: every rank goes through verification's forwards
        return tens, m, samples
    if prefix_cache and _is_hf_engine_of(complete, policy):
        complete = None
    controls = verify_pairs(pairs, trajs, policy=policy, tokenizer=tokenizer, retriever=retriever, cfg=cfg, topk=topk,
                            complete=complete, corpus=corpus, rng=rng, m=m, batch_size=batch_size, prefix_cache=prefix_cache)
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
    return tens, m, samples


def _is_hf_engine_of(complete: Any, policy: Any) -> bool:
    """Whether ``complete`` is ``RolloutEngine.complete_queries`` of an engine decoding ``policy`` with transformers."""
    backend = getattr(getattr(complete, "__self__", None), "backend", None)
    return type(backend).__name__ == "HFBackend" and getattr(backend, "model", None) is policy


def pair_record(p: Pair, controls: list[list[Passage]], tokenizer: Any) -> dict[str, Any]:
    """The auditable record of one verified pair (stored in samples.jsonl)."""
    return {
        "t": p.t, "student_token": tokenizer.decode([p.a]), "teacher_token": tokenizer.decode([p.b]),
        "q_S": p.queries["S"], "q_T": p.queries["T"], "closed_S": p.closed["S"], "closed_T": p.closed["T"],
        "titles_S": [d.bare_title for d in p.docs["S"]], "titles_T": [d.bare_title for d in p.docs["T"]],
        "control_ids": [[d.id for d in c] for c in controls],
        "u_S": p.u["S"], "u_T": p.u["T"], "ig_S": p.ig["S"], "ig_T": p.ig["T"], "delta": p.delta, "gate": p.gate,
        "p_T_teacher_token": p.p_T[0],
    }
