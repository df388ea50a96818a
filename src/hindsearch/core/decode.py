"""THE decode loop: every id a model generates outside TRL's training step is sampled here.

Every row has its own pending-token queue and stop state (THE stop rule, ``sampling.stop_reason``).
A stopped row leaves, or, with ``on_stop``, is handed with the rows that stopped at the same step to
the callback, which may queue an observation: the row then rejoins the running batch on its saved
cache (or, where caches cannot be merged, waits for a turn-synchronous re-read). A row's greedy ids
do not depend on the other rows of its batch. Entry points: ``decode`` and ``decode_shared`` (shared
prefixes read from one cache); each is one lockstep region (``core.lockstep``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hindsearch.core.model import (KV, Step, cache_of, cat_steps, forward, group_chunks, left_pad,
                                   mergeable, pad_id, region, resume, save_row, shared_prefix_len,
                                   suffix_forward)
from hindsearch.core.sampling import (GenOutput, LogitsHook, SamplingParams, Stop, read_back,
                                      sample_tokens, stop_reason)

OnStop = Callable[[list[int], list[GenOutput]], list[tuple[list[int], int] | None]]
"""``on_stop(rows, outs)``: the rows (caller indices) that stopped at one step and the segments they
generated -> per row ``(ids to queue, budget > 0 of its next segment)`` to go on, or None to
leave."""

STAT_KEYS = ("prefill_s", "prefill_tokens", "decode_s", "decode_steps", "forwards", "step_s",
             "kv_save_s", "merge_s", "callback_s", "decode_positions", "decode_pad_positions")
"""``stats`` of a decode: seconds in prefills (first and rejoining), decode forwards, sampling and
bookkeeping, saving keys/values, merging batches and the callback; ids prefilled, decode steps,
forwards; attention positions of decode forwards and how many of them are padding."""


@dataclass(eq=False)
class _Row:
    """A row of the loop: the caller's index, its context (everything before the current segment,
    fed or queued), the segment's budget and output, and the keys/values saved while it waits to
    rejoin."""

    index: int
    ctx: list[int]
    budget: int
    out: GenOutput
    saved: tuple[list[int], KV] | None = None


class _Loop:
    """The loop's state across steps: the model, its pad id, the stop rule and sampling, the
    callback, stats."""

    def __init__(self, model: Any, pad: int, stop: Stop, sampling: SamplingParams,
                 generator: torch.Generator | None, hook: LogitsHook | None, on_stop: OnStop | None,
                 stats: dict[str, float] | None, outs: list[GenOutput] | None) -> None:
        self.model, self.pad, self.stop = model, pad, stop
        self.sampling, self.generator = sampling, generator
        self.hook, self.on_stop, self.outs = hook, on_stop, outs
        self.stats = stats if stats is not None else {}
        for k in STAT_KEYS:
            self.stats.setdefault(k, 0)
        # rows that go on rejoin the running batch (decided at the first prefill)
        self.merge: bool | None = None
        # decode_pad_positions not yet added to stats
        self.pad_positions: torch.Tensor | None = None

    def run(self, waiting: list[_Row], max_rows: int = 0, step: Step | None = None,
            live: list[_Row] | None = None) -> None:
        """Decode until no row is live, waiting or rejoining. ``step``/``live``: rows already
        prefilled."""
        live, join = list(live or []), []
        while waiting or join or live:
            if not live and not join:
                n = max_rows or len(waiting)
                join, waiting = waiting[:n], waiting[n:]
            if join and (self.merge or not live):
                if not self.merge:
                    join.sort(key=lambda r: r.index)
                new = self._prefill(join)
                t0 = time.perf_counter()
                step = cat_steps(step, new) if live else new
                self.stats["merge_s"] += time.perf_counter() - t0
                live, join = live + join, []
            step, live, rejoin = self._step(step, live)
            join += rejoin
        if self.pad_positions is not None:
            self.stats["decode_pad_positions"] += int(self.pad_positions)
            self.pad_positions = None

    def _prefill(self, rows: list[_Row]) -> Step:
        """Feed every row's queue (its context beyond its saved keys/values) in one forward."""
        t0 = time.perf_counter()
        step, fed = resume(self.model, [r.ctx for r in rows], self.pad, [r.saved for r in rows])
        for r in rows:
            r.saved = None
        if self.merge is None:
            self.merge = self.on_stop is not None and mergeable(step.cache)
        st = self.stats
        st["prefill_tokens"] += fed
        st["forwards"] += 1
        st["prefill_s"] += time.perf_counter() - t0
        return step

    def _step(self, step: Step, live: list[_Row]) -> tuple[Step, list[_Row], list[_Row]]:
        """THE decode step: sample one id for every live row, check its stop rule, hand the stopped
        rows to the callback, forward the rows that go on. -> (step, rows still live, rows that
        rejoin)."""
        st, t0 = self.stats, time.perf_counter()
        logits = step.logits
        if self.hook is not None:
            logits = self.hook([r.index for r in live], [r.out.ids for r in live], logits)
        tok, logp = sample_tokens(logits, self.sampling, self.generator)
        ids, lps = read_back(tok, logp)
        keep, ended, fed = [], [], {}
        for j, r in enumerate(live):
            r.out.ids.append(ids[j])
            r.out.logprobs.append(lps[j])
            why = stop_reason(self.stop, r.ctx[-1:], r.out.ids, r.budget)
            if why is None:
                keep.append(j)
                continue
            r.out.finish = why
            ended.append(r)
            # what the cache holds: all new ids but the last (never fed)
            fed[id(r)] = (j, r.ctx + r.out.ids[:-1])
        st["step_s"] += time.perf_counter() - t0
        rejoin = self._call_back(ended) if ended and self.on_stop is not None else []
        # only the rows that go on keep their keys/values (the cache is not trimmed yet)
        if self.merge:
            t0 = time.perf_counter()
            for r in rejoin:
                j, ids = fed[id(r)]
                r.saved = (ids, save_row(step, j, len(ids)))
            st["kv_save_s"] += time.perf_counter() - t0
        if not keep:
            return step, [], rejoin
        t0 = time.perf_counter()
        if len(keep) < len(live):
            sel = torch.tensor(keep, device=step.mask.device)
            step.cache.batch_select_indices(sel)
            step.mask, tok, step.pos = step.mask[sel], tok[sel], step.pos[sel]
        step.mask = torch.cat([step.mask, step.mask.new_ones((len(keep), 1))], dim=1)
        step.pos = step.pos + 1
        st["step_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        out = forward(self.model, 1, step.cache, input_ids=tok[:, None], attention_mask=step.mask,
                      position_ids=step.pos[:, None], use_cache=True)
        step.cache, step.logits = cache_of(out), out.logits[:, -1, :].float()
        st["decode_s"] += time.perf_counter() - t0
        st["decode_steps"] += 1
        st["forwards"] += 1
        st["decode_positions"] += step.mask.numel()
        # read once, at the end of the decode (a read here would wait for the device)
        pad = (step.mask == 0).sum()
        self.pad_positions = pad if self.pad_positions is None else self.pad_positions + pad
        return step, [live[j] for j in keep], rejoin

    def _call_back(self, ended: list[_Row]) -> list[_Row]:
        """``on_stop`` for the rows that stopped at this step; the rows that go on, their next
        segment queued."""
        t0 = time.perf_counter()
        nxt = self.on_stop([r.index for r in ended], [r.out for r in ended])
        if len(nxt) != len(ended):
            raise ValueError(f"on_stop returned {len(nxt)} entries for {len(ended)} stopped rows")
        rejoin = []
        for r, q in zip(ended, nxt):
            if q is None:
                continue
            ids, budget = q
            if budget <= 0:
                raise ValueError(f"on_stop gave row {r.index} a budget of {budget}; a row that "
                                 "goes on needs > 0")
            r.ctx, r.budget, r.out = r.ctx + r.out.ids + list(ids), int(budget), GenOutput(
                [], [], "length")
            if self.outs is not None:
                self.outs[r.index] = r.out
            rejoin.append(r)
        self.stats["callback_s"] += time.perf_counter() - t0
        return rejoin


def decode(
    model: Any, contexts: Sequence[Sequence[int]], stop: Stop, sampling: SamplingParams,
    budgets: Sequence[int], *, generator: torch.Generator | None = None, pad: int | None = None,
    logits_hook: LogitsHook | None = None, on_stop: OnStop | None = None, max_rows: int = 0,
    stats: dict[str, float] | None = None,
) -> list[GenOutput]:
    """Decode every context (non-empty) from its budget on (module docstring), in one lockstep
    region.

    One ``GenOutput`` per context: its last segment (a row with budget 0 stays empty, ``length``).
    ``logits_hook`` and ``on_stop`` see context indices. ``max_rows`` (0: all): rows start at most
    that many together, in order, the next ones when the batch is empty. ``stats`` (``STAT_KEYS``)
    is added to when given."""
    pad = pad_id(stop.tokenizer, model) if pad is None else pad
    outs = [GenOutput([], [], "length") for _ in contexts]
    with region(model, pad):
        rows = [_Row(i, list(contexts[i]), int(n), outs[i]) for i, n in enumerate(budgets) if n > 0]
        if rows:
            _Loop(model, pad, stop, sampling, generator, logits_hook, on_stop, stats, outs).run(
                rows, max_rows)
    return outs


@torch.no_grad()
def decode_shared(
    model: Any, prefixes: Sequence[Sequence[int]], stop: Stop, sampling: SamplingParams,
    budget: int, groups: Sequence[Hashable], batch_size: int = 16, pad: int | None = None,
) -> list[GenOutput]:
    """``decode`` of prefixes whose groups (e.g. one rollout) share a prefix: the common prefix of
    each group is computed once into a KV cache (``batch_size`` groups a chunk), every row feeds
    only its own suffix on a copy of it, identical (group, prefix) rows are decoded once (they share
    one ``GenOutput``), and up to ``2 * batch_size`` rows decode together. One ``GenOutput`` per
    prefix; one lockstep region."""
    pad = pad_id(stop.tokenizer, model) if pad is None else pad
    with region(model, pad):
        if not prefixes:
            return []
        groups = list(groups)
        uniq: dict[tuple[Hashable, tuple[int, ...]], int] = {}
        rows: list[int] = []
        for i, (g, p) in enumerate(zip(groups, prefixes)):
            if (g, tuple(p)) not in uniq:
                uniq[(g, tuple(p))] = i
                rows.append(i)
        new: dict[int, GenOutput] = {}
        loop = _Loop(model, pad, stop, sampling, None, None, None, None, None)
        for gs, members in group_chunks([groups[i] for i in rows], batch_size):
            members = [rows[j] for j in members]
            base_len = {
                g: shared_prefix_len([prefixes[i] for i in members if groups[i] == g], keep=1)
                for g in gs}
            base = resume(model,
                          [prefixes[next(i for i in members if groups[i] == g)][: base_len[g]]
                           for g in gs], pad)[0]
            gi = {g: k for k, g in enumerate(gs)}
            # less padding
            members = sorted(members, key=lambda i: len(prefixes[i]) - base_len[groups[i]])
            for s in range(0, len(members), 2 * batch_size):
                sub = members[s : s + 2 * batch_size]
                ids, att = left_pad([prefixes[i][base_len[groups[i]] :] for i in sub], pad)
                out, kv, att, pos = suffix_forward(model, base.cache, base.mask,
                                                   [gi[groups[i]] for i in sub], ids, att, 1)
                live = [_Row(i, list(prefixes[i]), budget, GenOutput([], [], "length"))
                        for i in sub]
                loop.run([], step=Step(out.logits[:, -1].float(), kv, att, pos[:, -1]), live=live)
                new.update((r.index, r.out) for r in live)
        return [new[uniq[(groups[i], tuple(p))]] for i, p in enumerate(prefixes)]
