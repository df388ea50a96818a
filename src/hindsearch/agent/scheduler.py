"""Per-row turn scheduling: a row whose turn ends is served and rejoins decoding without waiting for the others.

The rule (replacing "one batched retrieve per turn"): after every decode step, the rows whose turn ended at that
step are served together - each turn is parsed (``engine.end_turn``), their searches go to the retriever in ONE
batched call (``engine.serve``), the observation is appended - and the rows that go on are prefilled (only their
uncached ids: the last sampled id and the injected ids, on top of their cached keys/values) and merged into the
running batch (``compute.cat_steps``), so they decode their next turn from the next step on. The other rows never
wait for retrieval or for the slowest row of a turn.

Exactness: the ids, masks, log-probs and stop rules are those of the turn-synchronous engine (the same
``end_turn`` / ``serve`` / ``compute.stop_reason``); a row's greedy trajectory does not depend on the other
rows, so greedy trajectories are identical (tested against ``RolloutEngine(per_row=False)``). Sampled
trajectories draw from the same seeded generator in a different order, so a seed gives other (equally
distributed, reproducible) samples than the turn-synchronous engine.

Needs a backend that decodes in this process with a cross-turn KV cache whose layers can be merged (the HF
backend with plain full-attention layers); ``run_per_row`` returns False before any row has decoded otherwise,
and the engine runs turn-synchronously.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from hindsearch import compute
from hindsearch.agent import protocol
from hindsearch.agent.backend import GenOutput, SamplingParams, sample_tokens

STAT_KEYS = ("sched_prefill_s", "sched_decode_s", "sched_serve_s", "sched_merge_s", "sched_kv_save_s",
             "sched_step_s", "sched_forwards", "sched_decode_positions", "sched_decode_pad_positions")
"""Engine statistics of the per-row loop: seconds in rejoin prefills, decode forwards, serving (parse, retrieve,
inject), merging caches, saving KV, sampling and bookkeeping; forwards; attention positions of decode forwards
and how many of them are padding."""


@dataclass(eq=False)
class _Row:
    """A row in the running batch: its trajectory state, its turn budget and the turn generated so far."""

    state: Any
    budget: int
    out: GenOutput
    ended: bool = False


def run_per_row(engine: Any, states: list[Any], sampling: SamplingParams, gen: torch.Generator | None,
                kv: Any) -> bool:
    """Roll out every not-done state of ``states`` to its end with per-row turn scheduling (module docstring).
    False (nothing done) when the backend cannot do it; the caller then runs turn-synchronously."""
    backend, st = engine.backend, engine.stats
    if not hasattr(backend, "prefill") or not hasattr(backend, "eos_ids"):
        return False
    for k in STAT_KEYS:
        st.setdefault(k, 0.0)
    stop = compute.Stop(engine.tokenizer, backend.eos_ids, protocol.STOP_STRINGS)
    live: list[_Row] = []
    step: compute.Step | None = None
    join = [s for s in states if not s.done]
    first = True
    while join or live:
        if join:
            t0 = time.perf_counter()
            new = backend.prefill([s.traj.prompt_ids + s.traj.completion_ids for s in join], list(range(len(join))),
                                  kv, [s.index for s in join])
            st["sched_prefill_s"] += time.perf_counter() - t0
            st["sched_forwards"] += 1
            if first and not backend._storable(new.cache):
                return False  # e.g. sliding-window layers: cannot be merged; nothing has been sampled yet
            first = False
            t0 = time.perf_counter()
            step = new if step is None else compute.cat_steps(step, new)
            st["sched_merge_s"] += time.perf_counter() - t0
            live += [_Row(s, engine.budget(s), GenOutput([], [], "length")) for s in join]
        join = _decode_step(engine, live, step, stop, sampling, gen, kv)
        live = [r for r in live if not r.ended]
        if not live:
            step = None
    return True


def _decode_step(engine: Any, live: list[_Row], step: compute.Step, stop: compute.Stop, sampling: SamplingParams,
                 gen: torch.Generator | None, kv: Any) -> list[Any]:
    """Sample one id for every live row, end the rows that stop (KV saved, turn served), forward the others.
    Returns the states that rejoin (their next turn starts). ``step`` is advanced in place."""
    backend, st = engine.backend, engine.stats
    t0 = time.perf_counter()
    logits = step.logits
    hook = engine.row_hook([r.state for r in live])
    if hook is not None:
        logits = hook(list(range(len(live))), [r.out.ids for r in live], logits)
    tok, logp = sample_tokens(logits, sampling, gen)
    keep, ended, saving = [], [], 0.0
    for j, r in enumerate(live):
        r.out.ids.append(int(tok[j]))
        r.out.logprobs.append(float(logp[j]))
        ctx = r.state.traj.prompt_ids + r.state.traj.completion_ids
        why = compute.stop_reason(stop, ctx[-1:], r.out.ids, r.budget)
        if why is None:
            keep.append(j)
            continue
        r.out.finish, r.ended = why, True
        ended.append(r)
        ts = time.perf_counter()  # cached: the context and all new ids but the last (never fed)
        backend._save(kv, r.state.index, ctx + r.out.ids[:-1], step.cache, step.mask, j)
        saving += time.perf_counter() - ts
    st["sched_kv_save_s"] += saving
    st["sched_step_s"] += time.perf_counter() - t0 - saving  # KV saving is counted on its own
    join = _serve(engine, ended, kv) if ended else []
    if keep:
        t0 = time.perf_counter()
        if len(keep) < len(live):
            sel = torch.tensor(keep, device=step.mask.device)
            step.cache.batch_select_indices(sel)
            step.mask, tok, step.pos = step.mask[sel], tok[sel], step.pos[sel]
        step.mask = torch.cat([step.mask, step.mask.new_ones((len(keep), 1))], dim=1)
        step.pos = step.pos + 1
        st["sched_step_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        out = compute.forward(backend.model, 1, step.cache, input_ids=tok[:, None], attention_mask=step.mask,
                              position_ids=step.pos[:, None], use_cache=True)
        step.cache, step.logits = compute.cache_of(out), out.logits[:, -1, :].float()
        st["sched_decode_s"] += time.perf_counter() - t0
        st["sched_forwards"] += 1
        st["sched_decode_positions"] += step.mask.numel()
        st["sched_decode_pad_positions"] += int((step.mask == 0).sum())
        backend.stats["decode_steps"] += 1
    return join


def _serve(engine: Any, ended: list[_Row], kv: Any) -> list[Any]:
    """Serve the rows whose turn ended at this step: parse, one batched retrieve, inject; the states that go on."""
    t0 = time.perf_counter()
    searches = [r.state for r in ended if engine.end_turn(r.state, r.out, r.budget)]
    engine.serve(searches)
    kv.discard(r.state.index for r in ended if r.state.done)
    engine.stats["sched_serve_s"] += time.perf_counter() - t0
    return [r.state for r in ended if not r.state.done]
