"""Greedy query completion and answer scoring for IGSD, with shared-prefix KV caches.

The model compute of IGSD's verification: ``greedy_complete`` (batched greedy decoding to ``</search>``),
``cached_greedy_complete`` and ``cached_utilities`` (rows of one rollout read their common prefix from one
KV cache; identical rows run once; only answer-position logits materialised), and the cache helpers they
share. Every forward goes through ``hindsight.sync`` so ranks stay in lockstep under sharded weights.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from hindsearch import compute
from hindsearch.agent import protocol
from hindsearch.agent.backend import GenOutput, SamplingParams

GREEDY = SamplingParams(greedy=True)


def _stop(tokenizer: Any) -> compute.Stop:
    """IGSD's completions stop at ``</search>`` or the tokenizer's EOS (``compute.stop_reason``)."""
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    return compute.Stop(tokenizer, eos, (protocol.SEARCH_CLOSE,))


def _finish(tokenizer: Any, out: GenOutput, prefix: Sequence[int]) -> tuple[list[int], str, bool]:
    """``(new ids, new text, closed)`` of one decoded row: an EOS is dropped, ids are cut after ``</search>``."""
    ids = out.ids[:-1] if out.finish == "eos" else out.ids
    kept, closed = protocol.cut_at_search_close(tokenizer, ids, list(prefix[-1:]))
    return kept, tokenizer.decode(kept), closed


def greedy_complete(model: Any, tokenizer: Any, prefixes: list[list[int]], max_tokens: int) -> list[tuple[list[int], str, bool]]:
    """Fallback matched completion (when no rollout engine is given): batched greedy ``compute.decode``,
    left-padded, each row stopping at ``</search>`` or EOS; ``(new ids, new text, closed)``."""
    if not prefixes:
        with compute.lockstep(model, compute.pad_id(tokenizer, model)):
            return []
    outs = compute.decode(model, prefixes, _stop(tokenizer), GREEDY, [max_tokens] * len(prefixes))
    return [_finish(tokenizer, o, p) for o, p in zip(outs, prefixes)]


def shared_prefix_len(seqs: Sequence[Sequence[int]], keep: int = 0) -> int:
    """Length of the longest common prefix of ``seqs``, leaving at least ``keep`` ids of the shortest one."""
    n = min(len(s) for s in seqs) - keep
    c, first = 0, seqs[0]
    while c < n and all(s[c] == first[c] for s in seqs):
        c += 1
    return c


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
    out = compute.forward(model, keep, kv, input_ids=ids.to(dev), attention_mask=att, position_ids=pos, use_cache=True)
    return out, compute.cache_of(out), att, pos


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
    with compute.lockstep(model, compute.pad_id(tokenizer, model)):
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
    new: dict[int, GenOutput] = {}
    pad, stop = compute.pad_id(tokenizer, model), _stop(tokenizer)
    for gs, members in _chunks([groups[i] for i in rows], batch_size):
        members = [rows[j] for j in members]
        base_len = {g: shared_prefix_len([prefixes[i] for i in members if groups[i] == g], keep=1) for g in gs}
        base = compute.prefill(model, [prefixes[next(i for i in members if groups[i] == g)][: base_len[g]] for g in gs], pad)
        gi = {g: k for k, g in enumerate(gs)}
        members = sorted(members, key=lambda i: len(prefixes[i]) - base_len[groups[i]])  # less padding
        for s in range(0, len(members), 2 * batch_size):
            sub = members[s : s + 2 * batch_size]
            left = [prefixes[i][base_len[groups[i]] :] for i in sub]
            out, kv, att, pos = suffix_forward(model, base.cache, base.mask, [gi[groups[i]] for i in sub], left,
                                               [[]] * len(sub), pad, 1)
            step = compute.Step(out.logits[:, -1].float(), kv, att, pos[:, -1])
            got = compute.decode_steps(model, step, list(range(len(sub))), [prefixes[i][-1:] for i in sub],
                                       [max_tokens] * len(sub), stop, GREEDY)
            new.update(zip(sub, got))
    return [_finish(tokenizer, new[uniq[(groups[i], tuple(p))]], p) for i, p in enumerate(prefixes)]


@torch.no_grad()
def cached_utilities(
    model: Any, states: Sequence[Sequence[int]], ctxs: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
    groups: Sequence[Hashable], batch_size: int = 16,
) -> torch.Tensor:
    """``u [N]``: mean log-prob of ``answers[i]`` after ``states[i] + ctxs[i]`` (0 for an empty answer), with the
    common prefix of the states of one group computed once and only answer-position logits materialised."""
    with compute.lockstep(model, compute.pad_id(model=model)):
        return _cached_utilities(model, states, ctxs, answers, groups, batch_size)


def _cached_utilities(
    model: Any, states: Sequence[Sequence[int]], ctxs: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
    groups: Sequence[Hashable], batch_size: int,
) -> torch.Tensor:
    u = torch.zeros(len(states))
    pad = compute.pad_id(model=model)
    for gs, members in _chunks(groups, batch_size):
        base_len = {g: shared_prefix_len([states[i] for i in members if groups[i] == g]) for g in gs}
        base = compute.prefill(model, [states[next(i for i in members if groups[i] == g)][: base_len[g]] for g in gs], pad)
        cache, batt = base.cache, base.mask
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
            lp = compute.token_logprobs(logits, tgt.to(logits.device))[0].cpu()
            u[sub] = (lp * amask).sum(-1) / amask.sum(-1).clamp(min=1)
    return u
