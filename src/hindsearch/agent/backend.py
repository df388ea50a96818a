"""The generation-backend interface of the rollout engine: what generating rows of a rollout takes
and returns.

- ``Backend.generate(contexts, max_new_tokens, sampling, stop_strings, generator, logits_hook,
  on_stop)`` -> one ``GenOutput`` per context (new ids, their sampling log-probs, why the row
  stopped). With ``on_stop`` rows go on after a stop (``core.decode.OnStop``: the callback queues an
  observation and a budget, or lets the row leave). Implementations: ``hf_backend.HFBackend``
  (transformers, CPU/GPU: the model core's decode loop, per-row schedule) and
  ``vllm_backend.VLLMBackend`` / ``VLLMServerBackend`` (turn-level: every row generates its turn,
  then the callback sees them all).
- ``Backend.complete_queries(prefixes, max_new_tokens, groups, batch_size)`` -> one ``GenOutput``
  per prefix: THE query completer (IGSD's matched completion): each prefix continued greedily until
  ``</search>``, an EOS or ``max_new_tokens``. ``HFBackend`` decodes its model with the model core's
  loop (with ``groups``, each group's shared prefix is computed once:
  ``core.decode.decode_shared``); the vLLM backends run one greedy turn.
- ``SamplingParams``, ``GenOutput``, the sampling helpers and the stop rule are the model core's
  (``hindsearch.core.sampling``).

This module imports no backend and no engine (``engine.make_backend`` picks one), so the backends
depend on it and on nothing above them (``tests/test_layout.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import torch

from hindsearch.core.decode import OnStop
from hindsearch.core.sampling import GenOutput, LogitsHook, SamplingParams


class Backend(Protocol):
    """Generates rows of token contexts (HF on CPU/GPU, vLLM on GPU)."""

    in_process: bool
    """Whether it decodes the engine's model in this process (HF: True; vLLM: False)."""

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
