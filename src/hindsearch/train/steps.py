"""Supervised training loops (warm-up SFT, micro pretraining) through transformers' ``Trainer``.

Both loops train on batches planned up front, with the caller's loss, AdamW and LambdaLR schedule.
``run_steps`` hands these to ``Trainer``: one dataset item is one optimizer step's batch,
``optimizers=`` carries the caller's optimizer and schedule unchanged, and ``training_step`` calls
the caller's ``step_fn(model, batch, backward) -> loss``, so the caller can split a batch into
micro-batches. The Trainer brings gradient clipping, the progress bar, logging callbacks, device
placement and accelerate; ``metrics.jsonl`` gets one row per step. In detail: docs/methods.md,
"How the warm-up trains".
"""

from __future__ import annotations

import gc
import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

StepFn = Callable[[Any, Any, Callable[[torch.Tensor], None]], torch.Tensor]


class _Batches(torch.utils.data.Dataset):
    """Item ``i`` = the ``i``-th step's batch, built on access by ``make(i)``."""

    def __init__(self, n: int, make: Callable[[int], Any]) -> None:
        self.n, self.make = n, make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.make(i)


def _step_trainer(step_fn: StepFn, losses: list[float]) -> type:
    """A ``Trainer`` subclass whose ``training_step`` runs ``step_fn`` and appends each step's loss
    to ``losses``."""
    from transformers import Trainer

    class StepTrainer(Trainer):
        # a Trainer hook
        def training_step(self, model, inputs, num_items_in_batch=None):  # noqa: D401
            model.train()
            inputs = self._prepare_inputs(inputs)
            loss = step_fn(model, inputs, self.accelerator.backward).detach()
            losses.append(float(loss))
            return loss

    return StepTrainer


def _metrics_writer(metrics_path: str | Path | None) -> Any:
    """A callback appending one JSON row per logged step (step, loss, lr, grad norm, seconds since
    it was made) to ``metrics_path`` (nothing when None)."""
    from transformers import TrainerCallback

    class Metrics(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if metrics_path is None or not logs or "loss" not in logs:
                return
            row = {"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate"),
                   "grad_norm": logs.get("grad_norm"), "time_s": round(time.time() - self.t0, 2)}
            with Path(metrics_path).open("a") as f:
                f.write(json.dumps(row) + "\n")

    return Metrics()


def _training_args(output_dir: str, n_steps: int, seed: int, max_grad_norm: float,
                   on_cpu: bool) -> Any:
    """``TrainingArguments`` for ``run_steps``: one item per step in order, a log row per step, no
    checkpoints."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=1, max_steps=n_steps, logging_steps=1,
        save_strategy="no", report_to="none", seed=seed, data_seed=seed,
        max_grad_norm=max_grad_norm, train_sampling_strategy="sequential", use_cpu=on_cpu,
        dataloader_pin_memory=False, remove_unused_columns=False, disable_tqdm=True,
    )


@contextmanager
def activation_checkpointing(model: Any, every_n_layers: int) -> Iterator[None]:
    """Checkpoint every ``every_n_layers``-th decoder layer of ``model`` inside the block (0 = leave
    it as it is): those layers keep only their inputs and run their forward again in the backward
    (the same gradients)."""
    if not every_n_layers:
        yield
        return
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                          every_n_layers=every_n_layers)
    try:
        yield
    finally:
        model.activation_checkpointing_disable()


def run_steps(model: Any, n_steps: int, make_batch: Callable[[int], Any], step_fn: StepFn,
              optimizer: torch.optim.Optimizer, scheduler: Any, *, max_grad_norm: float, seed: int,
              desc: str, progress: bool = True, metrics_path: str | Path | None = None,
              callbacks: Sequence[Any] = (), release_memory: bool = True) -> dict[str, Any]:
    """Train ``model`` in place for ``n_steps`` optimizer steps with transformers' ``Trainer``.

    ``make_batch(i)``: step ``i``'s batch (any object; tensors in a dict are moved to the device).
    ``step_fn(model, batch, backward)``: runs the forward and calls ``backward(loss_part)`` once per
    part; returns the step's loss (detached). ``release_memory``: hand freed heap pages back to the
    kernel after every step (``hindsearch.memory.release_memory_callback``; for big models, where a
    step's activations are GBs). Returns ``{"loss": [per step], "steps", "seconds"}``.
    """
    from hindsearch.memory import release_memory_callback
    from hindsearch.train.callbacks import use_progress

    losses: list[float] = []
    if metrics_path is not None:
        Path(metrics_path).unlink(missing_ok=True)
    on_cpu = next(model.parameters()).device.type == "cpu"
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="hindsearch-steps-") as tmp:
        args = _training_args(tmp, n_steps, seed, max_grad_norm, on_cpu)
        trainer = _step_trainer(step_fn, losses)(
            model=model, args=args, train_dataset=_Batches(n_steps, make_batch),
            data_collator=lambda items: items[0], optimizers=(optimizer, scheduler),
            callbacks=[_metrics_writer(metrics_path),
                       *([release_memory_callback()] if release_memory else []),
                       *callbacks])
        use_progress(trainer, desc, show=progress)
        trainer.train()
        del trainer
        # the Trainer's reference cycles hold the optimizer state (2x the weights) until collected
        gc.collect()
    model.eval()
    return {"loss": losses, "steps": n_steps, "seconds": time.time() - t0}


def warmup_cosine(step: int, n_warm: int, total: int) -> float:
    """LR multiplier of step ``step`` (0-based): linear warm-up ``(step + 1) / n_warm`` over
    ``n_warm`` steps, then cosine decay from 1 to 0 over the remaining ``total - n_warm`` steps (for
    ``LambdaLR``)."""
    if step < n_warm:
        return (step + 1) / n_warm
    return 0.5 * (1 + math.cos(math.pi * (step - n_warm) / max(1, total - n_warm)))
