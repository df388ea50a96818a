"""The trainers' ``TrainerCallback``s (step timing, ``metrics.jsonl`` and ``samples.jsonl`` writers,
the EMA teachers, the finite-weights check, a stop at a step's end, the progress bar) and
``gather_metrics``, the reduction of a process's step metrics over all processes before they go into
TRL's ``_metrics``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from hindsearch.records import Trajectory
from hindsearch.train import rollout_adapter as ra

def gather_metrics(metrics: Mapping[str, float], accelerator: Any,
                   summed: Callable[[str], bool] = lambda _k: False) -> dict[str, float]:
    """``metrics`` of this process reduced over all processes: the sum for keys ``summed(key)``,
    else the mean over the processes that logged the key. One process: returned as is. Every process
    must call it (two collectives: the union of the keys, sorted so every rank reduces them in the
    same order, then the values)."""
    if accelerator.num_processes == 1:
        return dict(metrics)
    from accelerate.utils import gather_object

    keys = sorted(set(gather_object(list(metrics))))
    if not keys:
        return {}
    local = torch.tensor([[float(metrics.get(k, 0.0)), float(k in metrics)] for k in keys],
                         dtype=torch.float64, device=accelerator.device)
    total = accelerator.gather(local[None]).sum(0)  # [P, K, 2] -> [K, 2]
    return {k: t if summed(k) else t / c for k, (t, c) in zip(keys, total.tolist()) if c > 0}


# ---------------------------------------------------------------------- callbacks
class FiniteWeights(TrainerCallback):
    """After each optimizer step, before it is logged or saved: ``check(step)``
    (``AtomicCheckpoints. check_finite_weights``) raises when a weight went NaN or inf, so no later
    step trains on it."""

    def __init__(self, check: Callable[[int], None]) -> None:
        self.check = check

    def on_step_end(self, args, state, control, **kwargs):
        self.check(state.global_step)


class StepTimer(TrainerCallback):
    """``time/*`` of each optimizer step, recorded at its end: the parts the trainer times
    (``part``: rollout, reward, aux_prepare), the step's wall time ``time/step`` and process CPU
    time ``time/step_cpu`` (all threads; robust to a busy machine) from ``on_step_begin`` to
    ``on_step_end``, and ``time/update`` = the rest."""

    PARTS = ("rollout", "reward", "aux_prepare")

    def __init__(self, record: Callable[[Mapping[str, float]], None]) -> None:
        self.record = record
        self.parts = dict.fromkeys(self.PARTS, 0.0)
        self.t0 = self.c0 = 0.0

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Add the block's wall time to part ``name`` of the current step."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - t0

    def on_step_begin(self, args, state, control, **kwargs):
        self.parts = dict.fromkeys(self.PARTS, 0.0)
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        total = time.perf_counter() - self.t0
        row = {f"time/{k}": v for k, v in self.parts.items()}
        row["time/update"] = max(total - sum(self.parts.values()), 0.0)
        row["time/step"] = total
        row["time/step_cpu"] = time.process_time() - self.c0
        self.record(row)


class MetricsWriter(TrainerCallback):
    """One line per optimizer step in ``run_dir/metrics.jsonl`` (main process): ``step`` and every
    logged value (TRL's metrics and ours, as TRL's ``log`` hands them to the callbacks)."""

    def __init__(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run_dir is None or not state.is_world_process_zero or not logs:
            return
        # a training step's log, not the end-of-training summary
        if "loss" not in logs or "train_runtime" in logs:
            return
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if _jsonable(v)}}
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


class SamplesWriter(TrainerCallback):
    """Up to ``k`` rollouts per optimizer step in ``run_dir/samples.jsonl``
    (``rollout_adapter.sample_records``: failed ones first, with their turns and the terms'
    samples), written when the step ends."""

    def __init__(self, run_dir: Path | None, k: int) -> None:
        self.run_dir, self.k = run_dir, k
        self.pending: list[dict[str, Any]] = []

    def add(self, trajs: Sequence[Trajectory],
            aux_samples: Mapping[str, Sequence[dict]], step: int) -> None:
        """Keep the records of a generation batch of step ``step`` (1-based) until the step ends."""
        if self.run_dir is not None and self.k > 0:
            self.pending += ra.sample_records(trajs, aux_samples, self.k, step)

    def on_step_end(self, args, state, control, **kwargs):
        if not self.pending:
            return
        with (self.run_dir / "samples.jsonl").open("a") as f:
            for r in self.pending:
                f.write(json.dumps(r, default=str) + "\n")
        self.pending = []


class EMATeachers(TrainerCallback):
    """After each optimizer step each EMA teacher (a full copy of the policy per decay) moves toward
    the policy, ``ema <- ema + (1 - decay) (policy - ema)``. Under ZeRO-3 the policy's shards are
    gathered for the update on every process (TRL's ``SyncRefModelCallback`` pattern)."""

    def __init__(self, emas: Mapping[float, Any], accelerator: Any) -> None:
        self.emas, self.accelerator = dict(emas), accelerator

    @staticmethod
    @torch.no_grad()
    def update(ema: torch.nn.Module, policy: torch.nn.Module, decay: float) -> None:
        for pe, pp in zip(ema.parameters(), policy.parameters(), strict=True):
            pe.lerp_(pp.detach().to(pe.dtype), 1.0 - decay)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        from accelerate.state import AcceleratorState

        policy = self.accelerator.unwrap_model(model)
        plugin = AcceleratorState().deepspeed_plugin
        gathered = contextlib.nullcontext()
        if plugin is not None and plugin.zero_stage == 3:
            import deepspeed  # optional: gpu

            # read only: no modifier rank
            gathered = deepspeed.zero.GatheredParameters(list(policy.parameters()))
        with gathered:
            for decay, ema in self.emas.items():
                self.update(ema, policy, decay)


class StopAtStepEnd(TrainerCallback):
    """Once ``requested()`` is true, the step that ends saves a checkpoint and training stops there
    (the Trainer's own save and stop at a step boundary: ``control.should_save``,
    ``control.should_training_stop``)."""

    def __init__(self, requested: Callable[[], bool]) -> None:
        self.requested = requested

    def on_step_end(self, args, state, control, **kwargs):
        if self.requested():
            control.should_save = True
            control.should_training_stop = True
        return control


def _jsonable(v: Any) -> bool:
    return v is None or isinstance(v, (int, float, str, bool))


def progress_callback(desc: str, unit: str = "steps", postfix: tuple[str, ...] = ("loss",)) -> Any:
    """A Trainer callback in place of transformers' ``ProgressCallback``: a bar labelled ``desc`` on
    a terminal, plain progress lines elsewhere (``hindsearch.progress``), the logged ``postfix``
    keys shown beside it, and no log dict printed per step (the metrics file has them). The Trainer
    ends a step before it logs the step, so the bar moves on when the step's log arrives (or at the
    next step, or the end, for a step that logs nothing): a line never pairs a step's count with the
    values of the step before."""
    from transformers import ProgressCallback

    from hindsearch.progress import progress_bar

    class Bar(ProgressCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.training_bar = progress_bar(state.max_steps, desc, unit=unit,
                                                 initial=state.global_step)
            self.current_step = self.shown_step = state.global_step

        def _advance(self) -> None:
            if self.training_bar is not None and self.current_step > self.shown_step:
                self.training_bar.update(self.current_step - self.shown_step)
            self.shown_step = self.current_step

        def on_step_end(self, args, state, control, **kwargs):
            self._advance()  # a step that logged nothing
            self.current_step = state.global_step

        def on_log(self, args, state, control, logs=None, **kwargs):
            shown = {k.split("/")[-1]: f"{logs[k]:.3f}" for k in postfix
                     if logs and isinstance(logs.get(k), (int, float))}
            if self.training_bar is not None and shown:
                self.training_bar.set_postfix(shown, refresh=False)
            self._advance()

        def on_train_end(self, args, state, control, **kwargs):
            self._advance()
            super().on_train_end(args, state, control, **kwargs)

    return Bar()


def use_progress(trainer: Any, desc: str, postfix: tuple[str, ...] = ("loss",),
                 show: bool = True) -> None:
    """Replace transformers' ``ProgressCallback`` / ``PrinterCallback`` of ``trainer`` by
    ``progress_callback`` (nothing shown with ``show = False``): one bar or plain lines, never a log
    dict per step."""
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if show:
        trainer.add_callback(progress_callback(desc, postfix=postfix))
