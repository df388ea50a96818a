"""vLLM turn generation (GPU), the same ``Backend`` interface as ``rollout.HFBackend``.

``vllm`` is an optional extra (``pip install vllm``); importing this module without it is
fine, constructing the backend raises a clear error. Each turn is one ``LLM.generate`` call
on token-id prompts with stop strings ``</search>`` / ``</answer>`` (kept in the output),
``logprobs=0`` (the sampled token's log-prob) and ``detokenize`` only for the stop check.
vLLM's returned ``token_ids`` are the sampled ids, so the engine's exactness holds.

Log-probs are vLLM's ``processed_logprobs`` of the temperature-scaled distribution when the
installed vLLM supports ``logprobs_mode`` (as the HF backend), else its default.
Weight updates during training are the trainer's business (TRL's vLLM colocate/server
mode); ``llm`` may be an ``LLM`` the trainer already holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hindsearch.agent.rollout import GenOutput, LogitsHook, SamplingParams


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise RuntimeError(
            "rollout.backend = 'vllm' needs vLLM (a GPU extra): pip install vllm; "
            "or use rollout.backend = 'hf'"
        ) from e
    return vllm


class VLLMBackend:
    """Turn generation through a ``vllm.LLM``."""

    def __init__(self, llm: Any, eos_ids: set[int] | None = None) -> None:
        self.vllm = _import_vllm()
        self.llm = llm
        self.eos_ids = eos_ids or set()

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **llm_kwargs: Any) -> "VLLMBackend":
        """Build an ``LLM`` over the same checkpoint as an HF model (its ``name_or_path``)."""
        vllm = _import_vllm()
        path = getattr(model, "name_or_path", None)
        if not path:
            raise ValueError("vLLM backend needs a model loaded from a path or hub id (model.name_or_path is empty)")
        llm = vllm.LLM(model=path, **{"gpu_memory_utilization": 0.3, "enable_prefix_caching": True, **llm_kwargs})
        return cls(llm, {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())

    def generate(
        self,
        contexts: list[list[int]],
        max_new_tokens: list[int],
        sampling: SamplingParams,
        stop_strings: Sequence[str],
        generator: Any = None,
        logits_hook: LogitsHook | None = None,
    ) -> list[GenOutput]:
        if logits_hook is not None:
            raise ValueError("the vLLM backend does not support logits hooks (use the hf backend)")
        seed = int(generator.initial_seed()) if generator is not None else None
        outs: list[GenOutput] = [GenOutput([], [], "length") for _ in contexts]
        rows = [i for i, n in enumerate(max_new_tokens) if n > 0]
        if not rows:
            return outs
        params = []
        for i in rows:
            kw = dict(
                max_tokens=max_new_tokens[i], stop=list(stop_strings), include_stop_str_in_output=True,
                logprobs=0, temperature=0.0 if sampling.is_greedy else sampling.temperature,
                top_p=1.0 if sampling.is_greedy else sampling.top_p, seed=None if seed is None else seed + i,
            )
            params.append(self.vllm.SamplingParams(**kw))
        prompts = [{"prompt_token_ids": contexts[i]} for i in rows]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        for i, res in zip(rows, results):
            c = res.outputs[0]
            ids = list(c.token_ids)
            lps = [float(lp[t].logprob) if lp and t in lp else 0.0 for t, lp in zip(ids, c.logprobs or [{}] * len(ids))]
            if c.finish_reason == "stop" and c.stop_reason is None:
                finish = "eos"
            elif c.finish_reason == "stop":
                finish = "stop"
            else:
                finish = "length"
            outs[i] = GenOutput(ids, lps, finish)
        return outs
