"""Turn generation with a transformers causal LM (the reference ``Backend``; CPU or GPU).

One (resumed) prefill, then cached decode steps (``hindsearch.compute.decode_steps``: our own sampling loop, so
the sampled ids, their log-probs and the seed are exact). Each row stops by ``compute.stop_reason``: an EOS id,
else a stop string in its decoded tail, else its token budget. ``prefill`` is also the rejoin prefill of the
per-row scheduler (``agent/scheduler.py``).

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

import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hindsearch import compute
from hindsearch.agent.backend import (
    GenOutput,
    LogitsHook,
    SamplingParams,
    stop_token_ids,
)
from hindsearch.compute import left_pad

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
    """Turn generation with a transformers causal LM: one (resumed) prefill, then ``compute.decode_steps``.

    Rows that finish are dropped from the batch and the KV cache; with a ``kv_store`` their keys/values are
    saved first, so the next turn resumes from them. ``lockstep()`` is this backend's capability of running
    its forwards in this process (the engine opens it around a whole rollout).
    """

    supports_kv_store = True

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = stop_token_ids(tokenizer, model)
        self.pad_id = compute.pad_id(tokenizer, model)
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "prefill_s": 0.0, "decode_s": 0.0, "kv_save_s": 0.0}

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

    def lockstep(self) -> Any:
        """The multi-process region of this backend's forwards (``hindsearch.hindsight.sync``; a no-op alone)."""
        return compute.lockstep(self.model, self.pad_id)

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
        if kv_store is not None and (kv_keys is None or len(kv_keys) != len(contexts)):
            raise ValueError("kv_store needs one kv_keys entry per context")
        with self.lockstep():
            outs = [GenOutput([], [], "length") for _ in contexts]
            rows = [i for i in range(len(contexts)) if max_new_tokens[i] > 0]
            if not rows:
                return outs
            step = self.prefill(contexts, rows, kv_store, kv_keys)
            if kv_store is not None and not self._storable(step.cache):
                kv_store = None  # e.g. sliding-window layers: every turn re-reads its context
            t0, save_s = time.perf_counter(), [0.0]

            def on_stop(j: int, i: int, o: GenOutput, st: compute.Step) -> None:
                if kv_store is not None:  # cached: the context and all new ids but the last (never fed)
                    ts = time.perf_counter()
                    self._save(kv_store, kv_keys[i], contexts[i] + o.ids[:-1], st.cache, st.mask, j)
                    save_s[0] += time.perf_counter() - ts

            stop = compute.Stop(self.tokenizer, self.eos_ids, stop_strings)
            got = compute.decode_steps(self.model, step, rows, [c[-1:] for c in contexts], max_new_tokens, stop,
                                       sampling, generator, logits_hook, on_stop, self.stats)
            for i in rows:
                outs[i] = got[i]
            self.stats["kv_save_s"] += save_s[0]
            self.stats["decode_s"] += time.perf_counter() - t0 - save_s[0]
            return outs

    def prefill(self, contexts: list[list[int]], rows: list[int], kv_store: KVStore | None,
                kv_keys: Sequence[Hashable] | None) -> compute.Step:
        """The (resumed) prefill of ``contexts[i]`` for ``i`` in ``rows`` (only the last logits kept)."""
        t0 = time.perf_counter()
        cached = [kv_store.take(kv_keys[i], contexts[i]) if kv_store is not None else None for i in rows]
        ids, mask, pos, cache = resume_inputs([contexts[i] for i in rows], cached, self.pad_id,
                                              compute.device_of(self.model))
        del cached
        out = compute.forward(self.model, 1, cache, input_ids=ids, attention_mask=mask, position_ids=pos,
                              use_cache=True)
        self.stats["prefill_tokens"] += int(mask[:, -ids.shape[1] :].sum())
        self.stats["prefill_s"] += time.perf_counter() - t0
        return compute.Step(out.logits[:, -1, :].float(), compute.cache_of(out), mask, pos[:, -1])
