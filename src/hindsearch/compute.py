"""The one model-compute core: padded batches, the pad id, KV caches, continuation scoring and a decode loop.

Every forward a model runs outside TRL's training step goes through here: the rollout engine's HF backend
(``agent/hf_backend.py``), the LM judge (``hindsight/judge.py``), the teachers (``hindsight/teacher.py``) and IGSD's
completion and scoring (``hindsight/igsd/decode.py``).

- **Padding** is on the left (``left_pad``), so the last column of a batch is every row's last token; positions
  come from the attention mask (``positions``), so a padded row computes what its unpadded forward computes.
- **Pad id** (``pad_id``): the tokenizer's pad token, else its EOS, else the model config's pad / EOS, else 0.
  Padded positions are masked out, so the choice never changes a number.
- **Scoring** (``score_continuations``): teacher-forced log-probs of continuations after prefixes, only the
  continuation positions' logits materialised, optional top-k.
- **Decoding** (``prefill`` + ``decode_steps``, or ``decode``): greedy or sampled (``agent.backend.sample_tokens``),
  KV cache reused across steps, a row leaves the batch (and the cache) when it stops. ONE stop rule
  (``stop_reason``), checked in this order after each new id: an EOS id -> ``eos``; a stop string in the decoded
  text of the row's last ``STOP_WINDOW`` ids, counting the context's last id as the first of them (so a stop
  string that starts in the context's last token counts) -> ``stop``; the row's budget -> ``length``.

Several processes: every forward goes through ``hindsight.sync.forward`` (announced in an open lockstep region);
callers open the region (``lockstep(model, pad)``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hindsearch.agent.backend import (
    GenOutput,
    LogitsHook,
    SamplingParams,
    sample_tokens,
)
from hindsearch.hindsight import sync

STOP_WINDOW = 16
"""Ids decoded when looking for a stop string (the context's last id and the newest ids); a stop string of n
characters spans at most n ids, and ours (``</search>``, ``</answer>``) have 9."""


def pad_id(tokenizer: Any = None, model: Any = None) -> int:
    """The pad id of a batch: the tokenizer's pad, else its EOS, else ``model.config``'s pad / (first) EOS, else 0."""
    for src in (tokenizer, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            v = getattr(src, name, None) if src is not None else None
            v = v[0] if isinstance(v, list) and v else v
            if isinstance(v, int):
                return v
    return 0


def lockstep(model: Any, pad: int) -> Any:
    """The multi-process region of ``model``'s forwards (``hindsight.sync``; a no-op in one process)."""
    return sync.lockstep(sync.pad_forward(model, pad))


def left_pad(rows: Sequence[Sequence[int]], pad: int, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Left-pad id lists. -> ``(input_ids [B, L], attention_mask [B, L])`` (long), ``L`` = longest row."""
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), int(pad), dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, L - len(r) :] = torch.tensor(list(r), dtype=torch.long)
            mask[i, L - len(r) :] = 1
    return (ids, mask) if device is None else (ids.to(device), mask.to(device))


def positions(mask: Tensor) -> Tensor:
    """Position ids from an attention mask: ``mask [B, L] -> pos [B, L]`` (0 on left padding)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


def cache_kw(model: Any) -> str:
    """The name of the KV-cache argument of ``model.forward`` (transformers >= 5.2x renamed it to ``cache``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_of(out: Any) -> Any:
    """The KV cache returned by a forward (either attribute name)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def forward(model: Any, keep: int = 0, cache: Any = None, **inputs: Any) -> Any:
    """One no-grad forward through ``hindsight.sync`` keeping the logits of the last ``keep`` positions (all when 0,
    or when the architecture has no ``logits_to_keep``); ``cache`` is passed under the model's argument name."""
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

    return sync.forward(run, **inputs)


def token_logprobs(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """``log softmax(logits)`` at ``targets`` without a full log-softmax copy.
    ``logits [B, T, V]`` (float), ``targets [B, T]`` (long) -> ``(logp [B, T], logsumexp [B, T])``."""
    lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, lse


SCORE_LOGITS_BUDGET = 2**30
"""Logit elements one scoring forward may keep (rows x (longest continuation + 1) x vocabulary): 4 GiB as float32.
Only a large vocabulary over long continuations reaches it (Qwen2.5's 151,936 ids: 16 rows of 2,000 tokens asked
for 18 GiB on an H200 and ran out of memory); micro and tiny models never do, so their batches are unchanged."""


def score_chunks(lengths: Sequence[int], batch_size: int, vocab: int | None, budget: int | None = None) -> list[range]:
    """Consecutive row ranges of at most ``batch_size`` rows each, closed early where one more row would take
    ``rows x (longest length + 1) x vocab`` past ``budget`` (default ``SCORE_LOGITS_BUDGET``; a single row always
    goes; ``vocab=None``: no cap)."""
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
    model: Any, prefixes: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], topk: int = 0,
    batch_size: int = 16, pad: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced log-probs of each continuation after its prefix, batched, no grad.

    Returns ``lT [B, T]`` (log-prob of ``cont[t]`` given ``prefix + cont[:t]``; 0 beyond a row's length),
    ``topk_ids [B, T, k]`` (long) and ``topk_logp [B, T, k]`` (the model's top-k log-probs at each continuation
    position; ``k = 0`` gives empty last dims). ``T`` = longest continuation. Every prefix must be non-empty.
    Micro-batches of ``batch_size`` rows (fewer where their logits would pass ``SCORE_LOGITS_BUDGET``); prefixes
    are left-padded so every continuation starts at the same column; logits are kept only for continuation
    positions. Runs in one lockstep region.
    """
    B = len(prefixes)
    if B != len(continuations):
        raise ValueError(f"{B} prefixes but {len(continuations)} continuations")
    T = max((len(c) for c in continuations), default=0)
    lT, ids_out, lp_out = torch.zeros(B, T), torch.zeros(B, T, topk, dtype=torch.long), torch.zeros(B, T, topk)
    pad = pad_id(model=model) if pad is None else pad
    with lockstep(model, pad):
        if B == 0 or T == 0:
            return lT, ids_out, lp_out
        device = device_of(model)
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        for rows in score_chunks([len(c) for c in continuations], batch_size, vocab if isinstance(vocab, int) else None):
            s = rows.start
            P = max(len(prefixes[i]) for i in rows)
            Tb = max(len(continuations[i]) for i in rows)
            if Tb == 0:
                continue
            for i in rows:
                if not len(prefixes[i]):
                    raise ValueError(f"row {i}: empty prefix (a continuation needs at least one context token)")
            # left-pad the prefixes to P, right-pad the continuations to Tb: every continuation starts at column P
            ids, att = left_pad([list(prefixes[i]) + list(continuations[i]) + [pad] * (Tb - len(continuations[i]))
                                 for i in rows], pad)
            for j, i in enumerate(rows):
                att[j, P + len(continuations[i]) :] = 0
            out = forward(model, Tb + 1, input_ids=ids.to(device), attention_mask=att.to(device),
                          position_ids=positions(att).to(device))
            logits = out.logits[:, -(Tb + 1) : -1].float()  # [b, Tb, V]: column P-1+t predicts cont[t]
            got, lse = token_logprobs(logits, ids[:, P:].to(device))
            cmask = att[:, P:].to(device).bool()
            lT[s : s + len(rows), :Tb] = torch.where(cmask, got, torch.zeros_like(got)).cpu()
            if topk > 0:
                if topk > logits.shape[-1]:
                    raise ValueError(f"topk = {topk} exceeds the vocabulary size {logits.shape[-1]}")
                v, k_ids = logits.topk(topk, dim=-1)
                ids_out[s : s + len(rows), :Tb] = k_ids.cpu()
                lp_out[s : s + len(rows), :Tb] = (v - lse.unsqueeze(-1)).cpu()
        return lT, ids_out, lp_out


@dataclass
class Stop:
    """When a decoded row stops: an id in ``eos_ids``, a string of ``strings`` in its decoded tail, its budget."""

    tokenizer: Any
    eos_ids: set[int]
    strings: Sequence[str] = ()


def stop_reason(stop: Stop, lead: Sequence[int], ids: Sequence[int], budget: int) -> str | None:
    """THE stop rule (module docstring) for a row with new ``ids`` after a context ending in ``lead`` (its last
    id, or nothing): ``eos`` / ``stop`` / ``length``, or None to go on."""
    if ids and ids[-1] in stop.eos_ids:
        return "eos"
    if stop.strings:
        tail = (list(lead[-1:]) + list(ids))[-STOP_WINDOW:]
        text = stop.tokenizer.decode(tail, skip_special_tokens=False)
        if any(s in text for s in stop.strings):
            return "stop"
    return "length" if len(ids) >= budget else None


@dataclass
class Step:
    """A batch between decode steps: ``logits [B, V]`` (float) of the next token, the KV ``cache`` (B rows),
    ``mask [B, K]`` (attention over the cached positions) and ``pos [B]`` (position of each row's last id)."""

    logits: Tensor
    cache: Any
    mask: Tensor
    pos: Tensor


def prefill(model: Any, contexts: Sequence[Sequence[int]], pad: int) -> Step:
    """One left-padded forward of whole contexts (only the last logits kept) -> the first ``Step``."""
    ids, mask = left_pad(contexts, pad, device_of(model))
    pos = positions(mask)
    out = forward(model, 1, input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    return Step(out.logits[:, -1, :].float(), cache_of(out), mask, pos[:, -1])


DropFn = Callable[[int, int, GenOutput, Step], None]
"""``on_stop(j, i, out, step)``: row ``i`` (batch row ``j`` of ``step``) stopped; called before it leaves the cache."""


def decode_steps(
    model: Any, step: Step, rows: list[int], leads: Sequence[Sequence[int]], budgets: Sequence[int], stop: Stop,
    sampling: SamplingParams, generator: torch.Generator | None = None, logits_hook: LogitsHook | None = None,
    on_stop: DropFn | None = None, stats: dict[str, Any] | None = None,
) -> list[GenOutput]:
    """Decode from ``step`` (batch row ``j`` is row ``rows[j]`` of the call) until every row stops (``stop_reason``).

    ``leads[i]`` / ``budgets[i]``: row ``i``'s context tail and token budget (> 0). Returns one ``GenOutput``
    per row index ``0..max(rows)`` (rows not in ``rows`` stay empty with finish ``length``). Finished rows leave
    the batch and the cache (``batch_select_indices``).
    """
    outs = [GenOutput([], [], "length") for _ in range(max(rows) + 1 if rows else 0)]
    logits = step.logits
    while True:
        if logits_hook is not None:
            logits = logits_hook(rows, [outs[i].ids for i in rows], logits)
        tok, logp = sample_tokens(logits, sampling, generator)
        keep = []
        for j, i in enumerate(rows):
            o = outs[i]
            o.ids.append(int(tok[j]))
            o.logprobs.append(float(logp[j]))
            why = stop_reason(stop, leads[i], o.ids, budgets[i])
            if why is None:
                keep.append(j)
            else:
                o.finish = why
                if on_stop is not None:
                    on_stop(j, i, o, step)
        if stats is not None:
            stats["decode_steps"] = stats.get("decode_steps", 0) + 1
        if not keep:
            return outs
        if len(keep) < len(rows):
            sel = torch.tensor(keep, device=step.mask.device)
            step.cache.batch_select_indices(sel)
            step.mask, tok, step.pos = step.mask[sel], tok[sel], step.pos[sel]
            rows = [rows[j] for j in keep]
        step.mask = torch.cat([step.mask, step.mask.new_ones((len(rows), 1))], dim=1)
        step.pos = step.pos + 1
        out = forward(model, 1, step.cache, input_ids=tok[:, None], attention_mask=step.mask,
                      position_ids=step.pos[:, None], use_cache=True)
        step.cache, logits = cache_of(out), out.logits[:, -1, :].float()


def decode(
    model: Any, prefixes: Sequence[Sequence[int]], stop: Stop, sampling: SamplingParams, max_new_tokens: Sequence[int],
    generator: torch.Generator | None = None, pad: int | None = None, logits_hook: LogitsHook | None = None,
) -> list[GenOutput]:
    """Decode every prefix (non-empty) up to its budget (greedy or sampled; ``stop_reason``), in one lockstep region.
    One ``GenOutput`` per prefix (a row with budget 0 stays empty); ``logits_hook(rows, new_ids, logits)`` sees
    prefix indices."""
    pad = pad_id(stop.tokenizer, model) if pad is None else pad
    with lockstep(model, pad):
        rows = [i for i, n in enumerate(max_new_tokens) if n > 0]
        outs = [GenOutput([], [], "length") for _ in prefixes]
        if not rows:
            return outs
        step = prefill(model, [prefixes[i] for i in rows], pad)
        got = decode_steps(model, step, rows, [p[-1:] for p in prefixes], max_new_tokens, stop, sampling, generator,
                           logits_hook)
        for i in rows:
            outs[i] = got[i]
        return outs


def repetition_penalty(prefixes: Sequence[Sequence[int]], penalty: float) -> LogitsHook | None:
    """transformers' repetition penalty as a ``logits_hook`` (None when ``penalty`` is 1 or unset): the logit of
    every id already in the row (its prefix and new ids; never the padding) is divided by ``penalty`` (multiplied
    when negative). ``logits [B, V]`` -> ``[B, V]``."""
    if not penalty or penalty == 1.0:
        return None

    def hook(rows: list[int], new_ids: list[list[int]], logits: Tensor) -> Tensor:
        for j, i in enumerate(rows):
            seen = torch.tensor(sorted(set(prefixes[i]) | set(new_ids[j])), dtype=torch.long, device=logits.device)
            v = logits[j, seen]
            logits[j, seen] = torch.where(v < 0, v * penalty, v / penalty)
        return logits

    return hook


def cat_steps(a: Step, b: Step) -> Step:
    """Two batches as one: rows of ``a`` then rows of ``b``, the shorter cache left-padded (masked) to the longer
    one's width K. Plain full-attention caches only (``DynamicLayer``: keys/values ``[B, H, K, D]``).
    ``Step`` of ``B_a + B_b`` rows; neither input is modified."""
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

    layers = [(torch.cat([widen(la.keys), widen(lb.keys)]), torch.cat([widen(la.values), widen(lb.values)]))
              for la, lb in zip(a.cache.layers, b.cache.layers)]
    return Step(torch.cat([a.logits, b.logits]), DynamicCache(ddp_cache_data=layers),
                torch.cat([widen(a.mask), widen(b.mask)]), torch.cat([a.pos, b.pos]))
