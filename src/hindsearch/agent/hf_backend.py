"""Turn generation with a transformers causal LM (the reference ``Backend``; CPU or GPU).

One (resumed) prefill, then cached decode steps with our own sampling loop, so the sampled ids, their log-probs
and the seed are exact. Each row stops at the first stop string (checked on the decoded tail of its new ids), at
an EOS id, or at its token budget.

Cost: with a ``KVStore`` each trajectory's KV cache is kept across turns: a turn feeds only the tokens not yet
cached (the last sampled token plus the injected ids) on top of the cached keys/values, so earlier turns are
never re-read. Rows are laid out so that padding is only ever on the left (``resume_inputs``): the rows of a
batch share one chunk width W (the longest uncached tail), and a row with a shorter tail re-feeds its last few
cached tokens instead of padding inside its sequence.

Several processes (``hindsearch.hindsight.sync``): every forward is announced, and ``lockstep()`` is the region
a caller opens around all its turns, so a rank whose rows finish earlier runs pad-token forwards until every
rank is done (the policy is sharded under FSDP, and under ZeRO-3 with ``ds3_gather_for_generation = false``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hindsearch.agent.backend import GenOutput, LogitsHook, SamplingParams, sample_tokens, stop_token_ids
from hindsearch.hindsight import sync


def left_pad(contexts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists. -> (input_ids [B, L], attention_mask [B, L])."""
    L = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), L), dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, L - len(c) :] = torch.tensor(c, dtype=torch.long)
        mask[i, L - len(c) :] = 1
    return ids.to(device), mask.to(device)


RowKV = tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]
"""A row's cache: the ids fed so far and their (keys, values) per layer, each ``[1, H, len(ids), D]``."""


@dataclass
class KVStore:
    """Per-trajectory KV caches kept across the turns of one rollout (HF backend).

    ``rows[key]``: the ids already fed for that trajectory (its context minus the last sampled
    token) and their keys/values. Scoped to one rollout: weights may change between rollouts.
    """

    rows: dict[Hashable, RowKV] = field(default_factory=dict)

    def take(self, key: Hashable, context: list[int]) -> RowKV | None:
        """Pop the row's cache if its ids are a strict prefix of ``context`` (else None: full prefill)."""
        entry = self.rows.pop(key, None)
        if entry is None or len(entry[0]) >= len(context) or context[: len(entry[0])] != entry[0]:
            return None
        return entry

    def discard(self, keys: Iterable[Hashable]) -> None:
        for k in keys:
            self.rows.pop(k, None)


def resume_inputs(
    contexts: list[list[int]], cached: list[RowKV | None], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """Inputs that continue each row from its cached KV with padding on the left only.

    ``cached[i]`` covers a strict prefix of ``contexts[i]`` (or is None). All rows feed a chunk of
    W = max uncached tail tokens; row i feeds its last ``min(len_i, W)`` tokens and keeps
    ``k_i = max(0, len_i - W) <= cached_i`` cached tokens, left-padded to K = max k_i. A row whose
    tail is shorter than W thus re-feeds a few cached tokens instead of padding mid-sequence.
    -> (input_ids [B, W], attention_mask [B, K + W], position_ids [B, W], DynamicCache of K or None).
    """
    from transformers import DynamicCache

    n_cached = [len(c[0]) if c is not None else 0 for c in cached]
    W = max(len(x) - c for x, c in zip(contexts, n_cached))
    keep = [max(0, len(x) - W) for x in contexts]
    K = max(keep)
    ids, chunk_mask = left_pad([x[k:] for x, k in zip(contexts, keep)], pad_id, device)
    past_mask = torch.zeros((len(contexts), K), dtype=torch.long, device=device)
    for i, k in enumerate(keep):
        past_mask[i, K - k :] = 1
    mask = torch.cat([past_mask, chunk_mask], dim=1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, K:]
    if K == 0:
        return ids, mask, pos, None
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
    return ids, mask, pos, DynamicCache(ddp_cache_data=layers)


class HFBackend:
    """Turn generation with a transformers causal LM: one (resumed) prefill, then cached decode steps.

    Rows that finish are dropped from the batch and the KV cache (``batch_select_indices``);
    with a ``kv_store`` their keys/values are saved first, so the next turn resumes from them.
    """

    supports_kv_store = True

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = stop_token_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        params = inspect.signature(model.forward).parameters if model is not None else {}
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x renamed it
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "prefill_s": 0.0, "decode_s": 0.0, "kv_save_s": 0.0}

    @staticmethod
    def _cache_of(out: Any) -> Any:
        cache = getattr(out, "cache", None)
        return cache if cache is not None else out.past_key_values

    @staticmethod
    def _storable(cache: Any) -> bool:
        """Only plain full-attention layers can be sliced per row and resumed (not sliding windows)."""
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))

    def _save(self, store: KVStore, key: Hashable, fed: list[int], cache: Any, mask: torch.Tensor, j: int) -> None:
        """Copy row j's keys/values (its ``len(fed)`` real, right-aligned positions) into the store."""
        n = len(fed)
        if int(mask[j].sum()) != n:
            raise RuntimeError(f"KV row {j} holds {int(mask[j].sum())} tokens, expected {n}")
        store.rows[key] = (fed, [(layer.keys[j : j + 1, :, -n:].clone(), layer.values[j : j + 1, :, -n:].clone())
                                 for layer in cache.layers])

    def _hit_stop(self, ids: list[int], stop_strings: Sequence[str]) -> bool:
        tail = self.tokenizer.decode(ids[-12:], skip_special_tokens=False)
        return any(s in tail for s in stop_strings)

    def lockstep(self) -> Any:
        """The multi-process region of this backend's forwards (``hindsearch.hindsight.sync``; a no-op alone)."""
        return sync.lockstep(sync.pad_forward(self.model, self.pad_id))

    @torch.no_grad()
    def generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: torch.Generator | None = None,
        logits_hook: LogitsHook | None = None,
        kv_store: KVStore | None = None,
        kv_keys: Sequence[Hashable] | None = None,
    ) -> list[GenOutput]:
        """One turn for each context. With ``kv_store`` (and one ``kv_keys`` entry per context) rows
        resume from their stored caches and leave theirs in the store for the next call.

        With several processes every forward is announced to the other ranks and a rank with fewer (or no)
        rows runs pad-token forwards until every rank's rows are done (``sync.lockstep``): the policy is
        sharded under FSDP, and under ZeRO-3 when ``ds3_gather_for_generation`` is false."""
        with self.lockstep():
            return self._generate(contexts, max_new_tokens, sampling, stop_strings, generator, logits_hook, kv_store,
                                  kv_keys)

    def _generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: torch.Generator | None,
        logits_hook: LogitsHook | None,
        kv_store: KVStore | None,
        kv_keys: Sequence[Hashable] | None,
    ) -> list[GenOutput]:
        if kv_store is not None and (kv_keys is None or len(kv_keys) != len(contexts)):
            raise ValueError("kv_store needs one kv_keys entry per context")
        device = next(self.model.parameters()).device
        outs = [GenOutput([], [], "length") for _ in contexts]
        rows = [i for i in range(len(contexts)) if max_new_tokens[i] > 0]
        if not rows:
            return outs
        t0 = time.perf_counter()
        cached = [kv_store.take(kv_keys[i], contexts[i]) if kv_store is not None else None for i in rows]
        ids, mask, pos, cache = resume_inputs([contexts[i] for i in rows], cached, self.pad_id, device)
        del cached
        # logits_to_keep=1: only the last position's logits are needed (saves a [B, L, V] tensor)
        out = sync.forward(self.model, input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                           logits_to_keep=1, **({self._cache_kw: cache} if cache is not None else {}))
        self.stats["prefill_tokens"] += int(mask[:, -ids.shape[1] :].sum())
        self.stats["prefill_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        cache, logits, last_pos = self._cache_of(out), out.logits[:, -1, :].float(), pos[:, -1]
        if kv_store is not None and not self._storable(cache):
            kv_store = None  # e.g. sliding-window layers: every turn re-reads its context
        save_s = 0.0
        while True:
            if logits_hook is not None:
                logits = logits_hook(rows, [outs[i].ids for i in rows], logits)
            tok, logp = sample_tokens(logits, sampling, generator)
            keep = []
            for j, i in enumerate(rows):
                o = outs[i]
                o.ids.append(int(tok[j]))
                o.logprobs.append(float(logp[j]))
                if o.ids[-1] in self.eos_ids:
                    o.finish = "eos"
                elif self._hit_stop(o.ids, stop_strings):
                    o.finish = "stop"
                elif len(o.ids) >= max_new_tokens[i]:
                    o.finish = "length"
                else:
                    keep.append(j)
            self.stats["decode_steps"] += 1
            if kv_store is not None and len(keep) < len(rows):
                ts = time.perf_counter()
                kept = set(keep)
                for j, i in enumerate(rows):
                    if j not in kept:  # cached: the context and all new ids but the last (never fed)
                        self._save(kv_store, kv_keys[i], contexts[i] + outs[i].ids[:-1], cache, mask, j)
                save_s += time.perf_counter() - ts
            if not keep:
                break
            if len(keep) < len(rows):
                sel = torch.tensor(keep, device=device)
                cache.batch_select_indices(sel)
                mask, tok, last_pos = mask[sel], tok[sel], last_pos[sel]
                rows = [rows[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            last_pos = last_pos + 1
            out = sync.forward(
                self.model, input_ids=tok[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                use_cache=True, **{self._cache_kw: cache},
            )
            cache, logits = self._cache_of(out), out.logits[:, -1, :].float()
        self.stats["kv_save_s"] += save_s
        self.stats["decode_s"] += time.perf_counter() - t0 - save_s
        return outs
