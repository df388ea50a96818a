"""The trainer's vLLM glue (``rollout.backend = vllm``): ``GRPOConfig`` fields from our ``rollout``
section, the engine pointed at TRL's vLLM (its ``LLM`` in colocate mode, a ``VLLMClient`` in server
mode), and the colocated engine's wake-up / sleep around the rollout. The functions take the trainer
(``self``) as their first argument."""

from __future__ import annotations

from typing import Any


def vllm_grpo_fields(rollout_cfg: Any) -> dict[str, Any]:
    """``GRPOConfig`` fields of the vLLM path from our ``rollout`` section (``rollout.vllm_*``).

    Token-level truncated importance sampling (``token_truncate``; TRL's default ``sequence_mask``
    would drop whole multi-turn trajectories), capped at ``vllm_is_cap``; vLLM's context is
    ``max_total_tokens``.
    """
    return dict(
        vllm_mode=rollout_cfg.vllm_mode,
        vllm_server_host=rollout_cfg.vllm_server_host,
        vllm_server_port=int(rollout_cfg.vllm_server_port),
        vllm_server_timeout=float(rollout_cfg.vllm_server_timeout),
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=float(rollout_cfg.vllm_is_cap),
        vllm_importance_sampling_clip_min=None,
        vllm_max_model_length=int(rollout_cfg.max_total_tokens),
    )


def apply_vllm_fields(args: Any, engine: Any) -> None:
    """Set ``vllm_grpo_fields`` of the engine's rollout config on ``args`` (before TRL reads
    them)."""
    import dataclasses
    import warnings

    rcfg = getattr(engine, "cfg", None)
    if rcfg is None or not hasattr(rcfg, "vllm_mode"):
        raise ValueError("rollout.backend = vllm: the rollout engine's config has no vllm_* fields")
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    for k, v in vllm_grpo_fields(rcfg).items():
        old = getattr(args, k, None)
        if k == "vllm_max_model_length" and old is not None:
            continue  # a [train.trl] vllm_max_model_length wins (a longer context is harmless)
        if old != defaults.get(k) and old != v:
            warnings.warn(f"train.trl.{k} = {old!r} is ignored: rollout.vllm_* sets {k} = {v!r}",
                          stacklevel=3)
        setattr(args, k, v)
    if args.vllm_mode == "colocate" and int(getattr(args, "vllm_tensor_parallel_size", 1)) > 1:
        raise ValueError(
            "rollout.backend = vllm with vllm_tensor_parallel_size > 1 in colocate mode is not "
            "supported: the multi-turn loop issues a different number of generate calls on each "
            "process, and a tensor-parallel group needs identical calls. Use tensor parallel size "
            "1, or rollout.vllm_mode = server")


def attach_vllm(self: Any) -> None:
    """Point the engine at TRL's vLLM: its ``LLM`` (colocate) or a ``VLLMClient`` (server). Once."""
    if self._vllm_attached:
        return
    from hindsearch.agent.vllm_backend import (
        VLLMBackend,
        VLLMServerBackend,
        stop_token_ids,
    )

    vg = self.vllm_generation
    tok = self.processing_class
    eos = stop_token_ids(tok, self.accelerator.unwrap_model(self.model))
    if self.vllm_mode == "colocate":
        self.engine.backend = VLLMBackend(vg.llm, eos)
    else:
        client = getattr(vg, "vllm_client", None)  # TRL builds it on the main process only
        if client is None:
            from trl.generation.vllm_client import VLLMClient

            a = self.args
            url = a.vllm_server_base_url or f"http://{a.vllm_server_host}:{a.vllm_server_port}"
            client = VLLMClient(base_url=url, group_port=a.vllm_group_port,
                                connection_timeout=a.vllm_server_timeout)
        self.engine.backend = VLLMServerBackend(
            client, lambda ids: tok.decode(ids, skip_special_tokens=False), eos)
    self._vllm_attached = True


def vllm_wake(self: Any) -> None:
    """Colocate + sleep mode: weights back (re-synced if they were discarded) and the KV cache
    mapped. Server mode on several processes: wait until the main process has pushed this step's
    weights."""
    vg = self.vllm_generation
    if self.vllm_mode == "colocate" and getattr(vg, "enable_sleep_mode", False):
        if getattr(vg, "_llm_weights_sleeping", False):
            vg.sync_weights()  # sleep level 2 discarded them; TRL's sync wakes the weights first
        vg.llm.wake_up(tags=["kv_cache"])
    elif self.vllm_mode == "server" and self.accelerator.num_processes > 1:
        self.accelerator.wait_for_everyone()


def vllm_sleep(self: Any) -> None:
    """Colocate + sleep mode: free vLLM's GPU memory for the update (level 2, as TRL's own
    generate)."""
    vg = self.vllm_generation
    if self.vllm_mode == "colocate" and getattr(vg, "enable_sleep_mode", False):
        vg.llm.sleep(level=2)
        vg._llm_weights_sleeping = True

