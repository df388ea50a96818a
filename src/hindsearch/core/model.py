"""Batches of a causal LM outside TRL's training step: padding, positions, the pad id, forwards and
KV caches.

Padding is on the left (``left_pad``, the one id-batch builder) and positions come from the
attention mask, so a padded row computes what its unpadded forward computes; padded positions are
masked out, so the pad id (``pad_id``) never changes a number. ``forward`` runs without grad, keeps
only the last ``keep`` positions' logits and is announced to the other processes
(``core.lockstep``). The KV-cache helpers save, resume, merge and share prefixes. The rules:
docs/protocol.md, "The model core".
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hindsearch.core import lockstep

KV = list[tuple[Tensor, Tensor]]
"""One row's saved keys/values: ``(keys, values)`` per layer, each ``[1, H, n, D]`` for its ``n``
fed ids."""


def pad_id(tokenizer: Any = None, model: Any = None) -> int:
    """The pad id of a batch: the tokenizer's pad, else its EOS, else ``model.config``'s pad /
    (first) EOS, else 0."""
    for src in (tokenizer, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            v = getattr(src, name, None) if src is not None else None
            v = v[0] if isinstance(v, list) and v else v
            if isinstance(v, int):
                return v
    return 0


def region(model: Any, pad: int) -> Any:
    """The multi-process region of ``model``'s forwards (``core.lockstep``; a no-op in one
    process)."""
    return lockstep.lockstep(lockstep.pad_forward(model, pad))


def left_pad(rows: Sequence[Sequence[int]], pad: int, device: torch.device | str | None = None,
             right: Sequence[Sequence[int]] | None = None) -> tuple[Tensor, Tensor]:
    """THE padded id batch: ``rows`` left-padded to their longest length ``W1``, then (with
    ``right``) each ``right[i]`` right-padded to the longest of them ``W2``, so every right part
    starts at column ``W1``: a prefix and its continuation (scoring), a suffix and its answer after
    a cached base (``suffix_forward``). -> ``(input_ids [B, W1 + W2], attention_mask [B, W1 + W2])``
    (long; padding is ``pad`` with mask 0)."""
    W1 = max((len(r) for r in rows), default=0)
    W2 = max((len(r) for r in right), default=0) if right is not None else 0
    ids = torch.full((len(rows), W1 + W2), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), W1 + W2), dtype=torch.long)
    for i, r in enumerate(rows):
        seq = list(r) + (list(right[i]) if right is not None else [])
        if seq:
            ids[i, W1 - len(r) : W1 - len(r) + len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, W1 - len(r) : W1 - len(r) + len(seq)] = 1
    return (ids, mask) if device is None else (ids.to(device), mask.to(device))


def positions(mask: Tensor) -> Tensor:
    """Position ids from an attention mask: ``mask [B, L] -> pos [B, L]`` (0 on left padding)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


def cache_kw(model: Any) -> str:
    """The name of the KV-cache argument of ``model.forward`` (transformers >= 5.2x renamed it to
    ``cache``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_of(out: Any) -> Any:
    """The KV cache returned by a forward (either attribute name)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def forward(model: Any, keep: int = 0, cache: Any = None, **inputs: Any) -> Any:
    """One no-grad forward (announced in an open ``region``) keeping the logits of the last ``keep``
    positions (all when 0, or when the architecture has no ``logits_to_keep``); ``cache`` is passed
    under the model's argument name."""
    if cache is not None:
        inputs[cache_kw(model)] = cache

    def run(**kw: Any) -> Any:
        with torch.no_grad():
            if keep:
                try:
                    return model(**kw, logits_to_keep=keep)
                except TypeError:  # architectures without logits_to_keep
                    pass
            return model(**kw)

    return lockstep.forward(run, **inputs)


def token_logprobs(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """``log softmax(logits)`` at ``targets`` without a full log-softmax copy. ``logits [B, T, V]``
    (float), ``targets [B, T]`` (long) -> ``(logp [B, T], logsumexp [B, T])``."""
    lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, lse


@dataclass
class Step:
    """A batch between decode steps: ``logits [B, V]`` (float) of the next token, the KV ``cache``
    (B rows), ``mask [B, K]`` (attention over the cached positions) and ``pos [B]`` (position of
    each row's last id)."""

    logits: Tensor
    cache: Any
    mask: Tensor
    pos: Tensor


def cat_steps(a: Step, b: Step) -> Step:
    """Two batches as one: rows of ``a`` then rows of ``b``, the shorter cache left-padded (masked)
    to the longer one's width K. Plain full-attention caches only (``DynamicLayer``: keys/values
    ``[B, H, K, D]``). ``Step`` of ``B_a + B_b`` rows; neither input is modified."""
    from transformers import DynamicCache

    K = max(a.mask.shape[1], b.mask.shape[1])

    def widen(t: Tensor) -> Tensor:  # [B, ..., k] or [B, H, k, D] -> left-padded to K
        dim = 1 if t.dim() == 2 else 2
        extra = K - t.shape[dim]
        if extra == 0:
            return t
        shape = list(t.shape)
        shape[dim] = extra
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    layers = [(torch.cat([widen(la.keys), widen(lb.keys)]),
               torch.cat([widen(la.values), widen(lb.values)]))
              for la, lb in zip(a.cache.layers, b.cache.layers)]
    return Step(torch.cat([a.logits, b.logits]), DynamicCache(ddp_cache_data=layers),
                torch.cat([widen(a.mask), widen(b.mask)]), torch.cat([a.pos, b.pos]))


def mergeable(cache: Any) -> bool:
    """Whether rows of ``cache`` can be saved, resumed and merged: only plain full-attention layers
    (``DynamicLayer``; not sliding windows)."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))


def save_row(step: Step, j: int, n: int) -> KV:
    """Copies of batch row ``j``'s keys/values: its ``n`` real positions (right-aligned in
    ``step``)."""
    if int(step.mask[j].sum()) != n:
        raise RuntimeError(f"KV row {j} holds {int(step.mask[j].sum())} tokens, expected {n}")
    return [(layer.keys[j : j + 1, :, -n:].clone(), layer.values[j : j + 1, :, -n:].clone())
            for layer in step.cache.layers]


def resume(model: Any, contexts: Sequence[Sequence[int]], pad: int,
           cached: Sequence[tuple[Sequence[int], KV] | None] | None = None) -> tuple[Step, int]:
    """One forward (only the last logits kept) that continues each row from its saved keys/values
    with padding on the left only -> the rows' ``Step`` and the number of ids fed.

    ``cached[i]`` = ``(ids, kv)`` covers a strict prefix of ``contexts[i]`` (or is None). All rows
    feed a chunk of W = max uncached tail; row i feeds its last ``min(len_i, W)`` ids and keeps
    ``k_i = max(0, len_i - W) <= cached_i`` cached positions, left-padded to K = max k_i (the saved
    keys/values and their mask are padded here, row by row; the ids are ``left_pad``'s): a row whose
    tail is shorter than W re-feeds a few cached ids instead of padding inside its sequence. Without
    any cache this is a plain left-padded prefill. Inputs: ``input_ids [B, W]``, ``attention_mask
    [B, K + W]``, ``position_ids [B, W]``, a cache of K positions.
    """
    from transformers import DynamicCache

    device = device_of(model)
    cached = cached if cached is not None else [None] * len(contexts)
    n_cached = [len(c[0]) if c is not None else 0 for c in cached]
    W = max(len(x) - c for x, c in zip(contexts, n_cached))
    keep = [max(0, len(x) - W) for x in contexts]
    K = max(keep)
    ids, chunk_mask = left_pad([list(x[k:]) for x, k in zip(contexts, keep)], pad, device)
    past_mask = torch.zeros((len(contexts), K), dtype=torch.long, device=device)
    for i, k in enumerate(keep):
        past_mask[i, K - k :] = 1
    mask = torch.cat([past_mask, chunk_mask], dim=1)
    pos = positions(mask)[:, K:]
    cache = None
    if K > 0:
        ref = next(c[1] for c, k in zip(cached, keep) if k > 0)
        layers = []
        for li, (k0, v0) in enumerate(ref):
            kk = k0.new_zeros((len(contexts), k0.shape[1], K, k0.shape[3]))
            vv = v0.new_zeros((len(contexts), v0.shape[1], K, v0.shape[3]))
            for i, k in enumerate(keep):
                if k > 0:
                    kk[i, :, K - k :] = cached[i][1][li][0][0, :, :k]
                    vv[i, :, K - k :] = cached[i][1][li][1][0, :, :k]
            layers.append((kk, vv))
        cache = DynamicCache(ddp_cache_data=layers)
    out = forward(model, 1, cache, input_ids=ids, attention_mask=mask, position_ids=pos,
                  use_cache=True)
    return Step(out.logits[:, -1, :].float(), cache_of(out), mask, pos[:, -1]), int(
        chunk_mask.sum())


def shared_prefix_len(seqs: Sequence[Sequence[int]], keep: int = 0) -> int:
    """Length of the longest common prefix of ``seqs``, leaving at least ``keep`` ids of the
    shortest one."""
    n = min(len(s) for s in seqs) - keep
    c, first = 0, seqs[0]
    while c < n and all(s[c] == first[c] for s in seqs):
        c += 1
    return c


def group_chunks(groups: Sequence[Hashable],
                 batch_size: int) -> list[tuple[list[Hashable], list[int]]]:
    """Split row indices by group: ``[(group keys of a chunk, its rows)]``, at most ``batch_size``
    groups a chunk."""
    gids = list(dict.fromkeys(groups))
    res = []
    for s in range(0, len(gids), batch_size):
        gs = set(gids[s : s + batch_size])
        res.append((gids[s : s + batch_size], [i for i, g in enumerate(groups) if g in gs]))
    return res


def expand_cache(model: Any, cache: Any, idx: Tensor) -> Any:
    """A new cache whose row ``j`` is row ``idx[j]`` of ``cache`` (rows may repeat); ``cache`` is
    untouched."""
    from transformers import DynamicCache

    return DynamicCache([(layer.keys[idx], layer.values[idx]) for layer in cache.layers],
                        config=model.config)


@torch.no_grad()
def suffix_forward(model: Any, cache: Any, base_att: Tensor, owner: Sequence[int], ids: Tensor,
                   att: Tensor, keep: int) -> tuple[Any, Any, Tensor, Tensor]:
    """Forward the batch ``ids [m, W]`` / ``att [m, W]`` (``left_pad``) after cached base row
    ``owner[j]`` (``base_att [G, P]``, the base cache's attention mask).

    Returns ``(out, new cache, att [m, P + W], pos [m, W])``; ``out.logits`` holds the last ``keep``
    columns. The base cache is not modified (rows are copied with ``expand_cache``).
    """
    dev = base_att.device
    idx = torch.tensor(list(owner), dtype=torch.long, device=dev)
    batt = base_att[idx]
    satt = att.to(dev)
    pos = (batt.sum(-1, keepdim=True) + satt.cumsum(-1) - 1).clamp(min=0)
    att = torch.cat([batt, satt], dim=1)
    kv = expand_cache(model, cache, idx)
    out = forward(model, keep, kv, input_ids=ids.to(dev), attention_mask=att, position_ids=pos,
                  use_cache=True)
    return out, cache_of(out), att, pos
