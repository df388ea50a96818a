"""The generation-backend interface of the rollout engine: what one turn of generation takes and returns.

- ``Backend``: ``generate(contexts, max_new_tokens, sampling, stop_strings, generator, logits_hook)`` -> one
  ``GenOutput`` per context (new ids, their sampling log-probs, why the row stopped). Implementations:
  ``hf_backend.HFBackend`` (transformers, CPU/GPU) and ``vllm_backend.VLLMBackend`` / ``VLLMServerBackend``.
- ``SamplingParams``, the sampling helpers (``top_p_filter``, ``sample_tokens``) and ``stop_token_ids`` (the
  EOS ids that end a turn), shared by the backends.

This module imports no backend and no engine (``engine.make_backend`` picks one), so the backends depend on it
and on nothing above them (``tests/test_layout.py``).

Log-probs: ``log softmax(logits / T)`` of the sampled token (T = 1 when greedy), before top-p filtering, i.e.
what a trainer recomputes from the same logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

LogitsHook = Callable[[list[int], list[list[int]], torch.Tensor], torch.Tensor]
"""``hook(rows, new_ids, logits[B, V]) -> logits``: rows index the contexts of the call."""


@dataclass
class SamplingParams:
    """Explicit sampling parameters; greedy when ``greedy`` or ``temperature == 0``."""

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


@dataclass
class GenOutput:
    """One row of a generation call: new ids, their sampling log-probs, why it stopped."""

    ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" (stop string), "eos", "length"


class Backend(Protocol):
    """Generates one turn for a batch of token contexts (HF on CPU/GPU, vLLM on GPU)."""

    def generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: torch.Generator | None = None,
        logits_hook: LogitsHook | None = None,
    ) -> list[GenOutput]: ...


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the nucleus of mass ``top_p``. logits: [B, V] -> [B, V]."""
    if top_p >= 1.0:
        return logits
    sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    remove = probs.cumsum(-1) - probs > top_p  # keep the token that crosses top_p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)


def sample_tokens(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick next tokens and their log-probs. logits: [B, V] float -> (tokens [B], logprobs [B])."""
    if sampling.is_greedy:
        logp = logits.log_softmax(-1)
        tok = logits.argmax(-1)
    else:
        scaled = logits / sampling.temperature
        logp = scaled.log_softmax(-1)
        probs = top_p_filter(scaled, sampling.top_p).softmax(-1)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)



def stop_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """EOS ids that end a turn: the tokenizer's EOS and the model's ``generation_config.eos_token_id``(s)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gc = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gc if isinstance(gc, list) else [gc] if gc is not None else [])
    return ids
