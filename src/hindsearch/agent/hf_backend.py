"""Rollout generation with a transformers causal LM (the reference ``Backend``; CPU or GPU).

``generate`` is the model core's decode loop with per-row scheduling (a row whose turn ends keeps
its keys/values and rejoins at the next step); ``complete_queries`` completes greedily to
``</search>``, reading each group's shared prefix from one KV cache. Both are lockstep regions of
the model core on several processes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from hindsearch.agent import protocol
from hindsearch.core.decode import STAT_KEYS, OnStop, decode, decode_shared
from hindsearch.core.model import pad_id
from hindsearch.core.sampling import (GREEDY, GenOutput, LogitsHook, SamplingParams, Stop,
                                      stop_token_ids)


class HFBackend:
    """Rollout generation with a transformers causal LM through the model core's decode loop."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.eos_ids = stop_token_ids(tokenizer, model)
        self.pad_id = pad_id(tokenizer, model)
        self.stats: dict[str, float] = dict.fromkeys(STAT_KEYS, 0)

    @torch.no_grad()
    def generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: torch.Generator | None = None,
        logits_hook: LogitsHook | None = None,
        on_stop: OnStop | None = None,
    ) -> list[GenOutput]:
        """One segment for each context (``backend.Backend``); with ``on_stop`` rows go on after
        their callback."""
        return decode(self.model, contexts, Stop(self.tokenizer, self.eos_ids, stop_strings),
                      sampling, max_new_tokens, generator=generator, pad=self.pad_id,
                      logits_hook=logits_hook, on_stop=on_stop,
                      stats=self.stats)

    @torch.no_grad()
    def complete_queries(
        self, prefixes: list[list[int]], max_new_tokens: int,
        groups: Sequence[Hashable] | None = None,
        batch_size: int = 16,
    ) -> list[GenOutput]:
        """Greedy completion to ``</search>`` (``backend.Backend``): ``decode_shared`` with
        ``groups``, else ``decode``."""
        stop = Stop(self.tokenizer, self.eos_ids, (protocol.SEARCH_CLOSE,))
        if groups is None:
            return decode(self.model, prefixes, stop, GREEDY, [max_new_tokens] * len(prefixes),
                          pad=self.pad_id)
        return decode_shared(self.model, prefixes, stop, GREEDY, max_new_tokens, groups, batch_size,
                             pad=self.pad_id)
