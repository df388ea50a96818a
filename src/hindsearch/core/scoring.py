"""Teacher-forced scoring: log-probs of continuations after prefixes, batched, no grad, only the
continuation positions' logits materialised.

``score_continuations``: per-token log-probs (and optional top-k) of each continuation after its
prefix, micro-batched under ``SCORE_LOGITS_BUDGET``. ``shared_prefix_utilities``: the mean log-prob
of an answer after ``state + context``, a group's common prefix computed once. Each call is one
lockstep region (``core.lockstep``): every process calls it at the same point, with its own rows
(none included), and runs as many forwards as the busiest one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from hindsearch.core.model import (device_of, forward, group_chunks, left_pad, pad_id, positions,
                                   region, resume, shared_prefix_len, suffix_forward,
                                   token_logprobs)

SCORE_LOGITS_BUDGET = 2**30
"""Logit elements one scoring forward may keep (rows x (longest continuation + 1) x vocabulary): 4
GiB as float32. Only a large vocabulary over long continuations reaches it (Qwen2.5's 151,936 ids:
16 rows of 2,000 tokens asked for 18 GiB on an H200 and ran out of memory); micro and tiny models
never do, so their batches are unchanged."""


def score_chunks(lengths: Sequence[int], batch_size: int, vocab: int | None,
                 budget: int | None = None) -> list[range]:
    """Consecutive row ranges of at most ``batch_size`` rows each, closed early where one more row
    would take ``rows x (longest length + 1) x vocab`` past ``budget`` (default
    ``SCORE_LOGITS_BUDGET``; a single row always goes; ``vocab=None``: no cap)."""
    budget = SCORE_LOGITS_BUDGET if budget is None else budget
    out, s = [], 0
    while s < len(lengths):
        e, longest = s + 1, lengths[s]
        while e < len(lengths) and e - s < batch_size:
            nxt = max(longest, lengths[e])
            if vocab is not None and (e - s + 1) * (nxt + 1) * vocab > budget:
                break
            e, longest = e + 1, nxt
        out.append(range(s, e))
        s = e
    return out


@torch.no_grad()
def score_continuations(
    model: Any, prefixes: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
    topk: int = 0, batch_size: int = 16, pad: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced log-probs of each continuation after its prefix, batched, no grad.

    Returns ``lT [B, T]`` (log-prob of ``cont[t]`` given ``prefix + cont[:t]``; 0 beyond a row's
    length), ``topk_ids [B, T, k]`` (long) and ``topk_logp [B, T, k]`` (the model's top-k log-probs
    at each continuation position; ``k = 0`` gives empty last dims). ``T`` = longest continuation.
    Every prefix must be non-empty. Micro-batches of ``batch_size`` rows (fewer where their logits
    would pass ``SCORE_LOGITS_BUDGET``); prefixes are left-padded so every continuation starts at
    the same column; logits are kept only for continuation positions. Runs in one lockstep region.
    """
    B = len(prefixes)
    if B != len(continuations):
        raise ValueError(f"{B} prefixes but {len(continuations)} continuations")
    T = max((len(c) for c in continuations), default=0)
    lT, ids_out, lp_out = torch.zeros(B, T), torch.zeros(B, T, topk, dtype=torch.long), torch.zeros(
        B, T, topk)
    pad = pad_id(model=model) if pad is None else pad
    with region(model, pad):
        if B == 0 or T == 0:
            return lT, ids_out, lp_out
        device = device_of(model)
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        for rows in score_chunks([len(c) for c in continuations], batch_size,
                                 vocab if isinstance(vocab, int) else None):
            s = rows.start
            P = max(len(prefixes[i]) for i in rows)
            Tb = max(len(continuations[i]) for i in rows)
            if Tb == 0:
                continue
            for i in rows:
                if not len(prefixes[i]):
                    raise ValueError(f"row {i}: empty prefix (a continuation needs at least one "
                                     "context token)")
            # prefixes left-padded to P, continuations right-padded to Tb: every continuation starts
            # at column P
            ids, att = left_pad([prefixes[i] for i in rows], pad,
                                right=[continuations[i] for i in rows])
            out = forward(model, Tb + 1, input_ids=ids.to(device), attention_mask=att.to(device),
                          position_ids=positions(att).to(device))
            # [b, Tb, V]: column P-1+t predicts cont[t]
            logits = out.logits[:, -(Tb + 1) : -1].float()
            got, lse = token_logprobs(logits, ids[:, P:].to(device))
            cmask = att[:, P:].to(device).bool()
            lT[s : s + len(rows), :Tb] = torch.where(cmask, got, torch.zeros_like(got)).cpu()
            if topk > 0:
                if topk > logits.shape[-1]:
                    raise ValueError(
                        f"topk = {topk} exceeds the vocabulary size {logits.shape[-1]}")
                v, k_ids = logits.topk(topk, dim=-1)
                ids_out[s : s + len(rows), :Tb] = k_ids.cpu()
                lp_out[s : s + len(rows), :Tb] = (v - lse.unsqueeze(-1)).cpu()
        return lT, ids_out, lp_out


@torch.no_grad()
def shared_prefix_utilities(
    model: Any, states: Sequence[Sequence[int]], ctxs: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]], groups: Sequence[Hashable], batch_size: int = 16,
) -> Tensor:
    """``u [N]``: mean log-prob of ``answers[i]`` after ``states[i] + ctxs[i]`` (0 for an empty
    answer), with the common prefix of the states of one group computed once and only
    answer-position logits materialised."""
    pad = pad_id(model=model)
    with region(model, pad):
        u = torch.zeros(len(states))
        for gs, members in group_chunks(groups, batch_size):
            base_len = {g: shared_prefix_len([states[i] for i in members if groups[i] == g])
                        for g in gs}
            base = resume(model, [states[next(i for i in members if groups[i] == g)][: base_len[g]]
                                  for g in gs], pad)[0]
            cache, batt = base.cache, base.mask
            gi = {g: k for k, g in enumerate(gs)}
            # less padding
            members = sorted(members,
                             key=lambda i: len(states[i]) - base_len[groups[i]] + len(ctxs[i]))
            for s in range(0, len(members), batch_size):
                sub = list(members[s : s + batch_size])
                Tb = max(len(answers[i]) for i in sub)
                if Tb == 0:
                    continue
                ids, att = left_pad([list(states[i][base_len[groups[i]] :]) + list(ctxs[i])
                                     for i in sub], pad, right=[answers[i] for i in sub])
                out, _, _, _ = suffix_forward(model, cache, batt, [gi[groups[i]] for i in sub],
                                              ids, att, Tb + 1)
                logits = out.logits[:, :Tb].float()  # [m, Tb, V]: column t predicts answer token t
                tgt, amask = ids[:, -Tb:], att[:, -Tb:].float()  # the answers, right-padded
                lp = token_logprobs(logits, tgt.to(logits.device))[0].cpu()
                u[sub] = (lp * amask).sum(-1) / amask.sum(-1).clamp(min=1)
        return u
