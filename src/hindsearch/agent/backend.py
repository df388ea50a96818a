"""The generation-backend interface of the rollout engine: what generating rows of a rollout takes
and returns.

``Backend.generate`` continues each context into one ``GenOutput`` (with ``on_stop``, rows go on
after a stop); ``Backend.complete_queries`` is THE query completer (IGSD's matched completion).
Implementations: ``hf_backend.HFBackend`` (the model core's decode loop, per-row schedule) and
``vllm_backend`` (turn-level). This module imports no backend and no engine, so the backends depend
on it and on nothing above them (``tests/test_layout.py``). The two calls in detail:
docs/protocol.md, "Generation backends".
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import torch

from hindsearch.core.decode import OnStop
from hindsearch.core.sampling import GenOutput, LogitsHook, SamplingParams


class Backend(Protocol):
    """Generates rows of token contexts (HF on CPU/GPU, vLLM on GPU)."""

    def generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: torch.Generator | None = None,
        logits_hook: LogitsHook | None = None,
        on_stop: OnStop | None = None,
    ) -> list[GenOutput]: ...

    def complete_queries(
        self, prefixes: list[list[int]], max_new_tokens: int,
        groups: Sequence[Hashable] | None = None,
        batch_size: int = 16,
    ) -> list[GenOutput]:
        """Greedy completion of every prefix (a context ending inside a ``<search>`` query) until
        ``</search>`` (``protocol.SEARCH_CLOSE``), an EOS (``finish = "eos"``, the EOS id last) or
        ``max_new_tokens``. ``groups``: prefixes of one group (one rollout's search) share their
        beginning, which an implementation may compute once (``batch_size`` groups a chunk); None:
        every prefix on its own. Greedy ids do not depend on the grouping."""
        ...
