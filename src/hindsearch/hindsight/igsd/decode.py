"""Greedy query completion and answer scoring for IGSD, with shared-prefix KV caches.

The model compute of IGSD's verification: ``greedy_complete`` (batched greedy decoding to ``</search>``),
``cached_greedy_complete`` and ``cached_utilities`` (rows of one rollout read their common prefix from one
KV cache; identical rows run once; only answer-position logits materialised), and the cache helpers they
share. Every forward goes through ``hindsight.sync`` so ranks stay in lockstep under sharded weights.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from hindsearch.hindsight import sync

CLOSE = "</search>"


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
