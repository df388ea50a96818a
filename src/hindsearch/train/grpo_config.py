"""TRL's ``GRPOConfig`` from a hindsearch config: the fields our keys own, our defaults for the
rest, and the ``[train.trl]`` pass-through (our keys win, with a warning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hindsearch.config import Config, ConfigError

# GRPOConfig fields that our own keys set: a [train.trl] entry for one of them is overridden (with a
# warning).
OWNED_GRPO_FIELDS = {
    "output_dir": "out", "per_device_train_batch_size": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.micro_batch_size",
    "steps_per_generation": "train.micro_batch_size",
    "num_generations": "rollout.num_generations",
    "max_completion_length": "rollout.max_total_tokens",
    "temperature": "rollout.temperature", "top_p": "rollout.top_p", "learning_rate": "train.lr",
    "beta": "train.kl_coef", "epsilon": "train.epsilon", "loss_type": "train.loss_type",
    "max_steps": "train.steps", "save_steps": "train.save_steps", "seed": "train.seed",
    "use_cpu": "model.device", "bf16": "model.dtype",
    "fp16": "model.dtype", "gradient_checkpointing": "train.gradient_checkpointing",
    "use_vllm": "rollout.backend",
}
# our defaults for GRPOConfig fields no key of ours sets; [train.trl] replaces them
GRPO_DEFAULTS = {
    "lr_scheduler_type": "constant", "save_total_limit": 2, "logging_steps": 1, "report_to": "none",
    "vllm_mode": "colocate", "log_completions": False, "disable_tqdm": False,
}


def grpo_args(cfg: Config, output_dir: str | Path, num_processes: int = 1) -> Any:
    """``GRPOConfig`` from our config: one optimizer step per generation batch of
    ``questions_per_step * num_generations`` rollouts (split evenly over processes).

    Field values: ``GRPO_DEFAULTS``, replaced by ``[train.trl]``, replaced by the fields our keys
    set (``OWNED_GRPO_FIELDS``; a differing ``[train.trl]`` value for one of them is warned
    about)."""
    import warnings

    from trl import GRPOConfig

    g = cfg.rollout.num_generations
    total = cfg.train.questions_per_step * g
    if total % num_processes:
        raise ConfigError(f"train.questions_per_step * rollout.num_generations = {total} must be "
                          f"divisible by the number of processes ({num_processes})")
    from hindsearch.models import resolve_device

    on_cpu = resolve_device(cfg.model.device).type == "cpu"
    per_device = total // num_processes
    micro = cfg.train.micro_batch_size or per_device  # rollouts per forward/backward
    if per_device % micro:
        raise ConfigError(f"train.micro_batch_size = {micro} must divide the rollouts per process "
                          f"({per_device})")
    ours = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=per_device // micro,
        steps_per_generation=per_device // micro,
        num_generations=g,
        max_completion_length=cfg.rollout.max_total_tokens,
        temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
        top_p=cfg.rollout.top_p,
        learning_rate=cfg.train.lr,
        beta=cfg.train.kl_coef,
        epsilon=cfg.train.epsilon,
        loss_type=cfg.train.loss_type,
        max_steps=cfg.train.steps,
        save_steps=cfg.train.save_steps,
        seed=cfg.train.seed,
        use_cpu=on_cpu,
        bf16=cfg.model.dtype == "bfloat16" and not on_cpu,
        fp16=cfg.model.dtype == "float16" and not on_cpu,
        gradient_checkpointing=cfg.train.gradient_checkpointing,
        use_vllm=cfg.rollout.backend == "vllm",
    )
    for k, v in cfg.train.trl.items():
        if k in ours and v != ours[k]:
            warnings.warn(f"train.trl.{k} = {v!r} is ignored: "
                          f"{OWNED_GRPO_FIELDS.get(k, 'our config')} sets "
                          f"{k} = {ours[k]!r}", stacklevel=2)
    kw = {**GRPO_DEFAULTS, "dataloader_pin_memory": not on_cpu, **cfg.train.trl, **ours}
    n = cfg.train.checkpoint_every_n_layers
    # one entry of the dict: [train.trl]'s other entries stay
    if cfg.train.gradient_checkpointing and n > 1:
        gc_kw = dict(kw.get("gradient_checkpointing_kwargs") or {})
        if gc_kw.get("every_n_layers", n) != n:
            warnings.warn("train.trl.gradient_checkpointing_kwargs.every_n_layers = "
                          f"{gc_kw['every_n_layers']!r} is ignored: "
                          f"train.checkpoint_every_n_layers sets it to {n}", stacklevel=2)
        kw["gradient_checkpointing_kwargs"] = {**gc_kw, "every_n_layers": n}
    # TRL loads the reference model itself, with these: Hub kernels as on the policy
    if cfg.train.kl_coef > 0:
        # (TRL 1.16 then logs that model_init_kwargs "will be ignored": true of the policy, not of
        # the reference)
        kw["model_init_kwargs"] = {**(kw.get("model_init_kwargs") or {}),
                                   "use_kernels": cfg.model.hub_kernels}
    return GRPOConfig(**kw)


def route_every_n_layers(model: Any) -> None:
    """Make ``model.gradient_checkpointing_enable(kwargs)`` honour ``kwargs["every_n_layers"]``.

    transformers 5 takes ``every_n_layers`` as a keyword of ``gradient_checkpointing_enable`` and
    pops it from the Trainer's ``gradient_checkpointing_kwargs`` itself; TRL 1.16's GRPO re-enables
    checkpointing after each no-grad forward with
    ``gradient_checkpointing_enable(args.gradient_checkpointing_kwargs)``, which would hand the
    entry to ``torch.utils.checkpoint`` ("Unexpected keyword arguments: every_n_layers"). The model
    instance's method is wrapped (once) to move the entry to the keyword, so every enable call
    checkpoints the same layers."""
    enable = model.gradient_checkpointing_enable
    if getattr(enable, "_routes_every_n_layers", False):
        return

    def gradient_checkpointing_enable(gradient_checkpointing_kwargs: dict | None = None,
                                      **kwargs: Any) -> Any:
        gc_kw = dict(gradient_checkpointing_kwargs or {})
        n = gc_kw.pop("every_n_layers", None)
        if n is not None:
            kwargs.setdefault("every_n_layers", n)
        return enable(gradient_checkpointing_kwargs=gc_kw or None, **kwargs)

    gradient_checkpointing_enable._routes_every_n_layers = True  # type: ignore[attr-defined]
    model.gradient_checkpointing_enable = gradient_checkpointing_enable
