"""Lockstep forwards across processes: every rank runs the same number of forwards through a sharded model.

Why: under DeepSpeed ZeRO-3 or FSDP a model's weights are split over the ranks, and every forward
all-gathers them layer by layer: a forward is a sequence of collectives that every rank must join.
The hindsight path runs a data-dependent number of forwards on each rank (judge and teacher forwards
only for failed rollouts, IGSD's completions and scores only for verified positions, greedy decode
loops that stop when their rows close ``</search>``, rollout turns that end at different steps). A
rank with less work would move on to the next collective (the gradient all-reduce) while another
still gathers weights: training hangs.

The rule (the ``synced_gpus`` idea of ``transformers.generate``, applied to whole regions):

- a **region** (``lockstep(dummy)``) is a stretch of code that every rank enters at the same point
  (the code reaching it must not depend on the rank's data) and whose forwards all go through ONE model;
- inside it, every forward is announced with ``forward(model, **inputs)``: one all-reduce (max) of a flag saying
  "I run a forward now", then the forward;
- a rank leaving the region keeps answering that all-reduce with "no" and, whenever another rank
  said "yes", runs ``dummy()`` (one forward of one pad token through the same model; its result is
  discarded), until every rank says "no". So every rank runs ``max_r forwards_r`` forwards in the
  region, and the forwards' collectives pair up one to one. The cost is one 1-element all-reduce per
  forward and, on the ranks with less work, 1-token forwards while they would otherwise wait.

Regions do not nest: a ``lockstep`` opened inside another one joins the outer region (callers only
nest regions of the same model). Nothing here does anything unless ``torch.distributed`` is
initialised with more than one process (``active()``): a single process runs exactly the code and
the forwards it ran before (no collective, no dummy forward, same results bit for bit).

Who opens the regions: the model core does, and nobody else. Every decode (``core.decode``) and every scoring
call (``core.scoring``) is one region around all its forwards (every rank calls it at the same point, with its own
rows, none included), so no caller needs to know about the lockstep. The regions of one training step:

==============================  ======================================  =====================================
region                          model                                   sharded under ZeRO-3 / FSDP?
==============================  ======================================  =====================================
policy rollout (HF backend)     the policy (TRL's unwrapped model)      yes under FSDP, and under ZeRO-3 with
                                                                        ``ds3_gather_for_generation = False``
LM judge critiques (decode)     ``frozen`` (default) or judge_model     see below
teacher log-probs (HindSearch,  ``frozen`` / ``live`` (policy) / ``ema``  see below
neutral control, IGSD propose)
IGSD matched completion         the policy                              yes
IGSD utility scoring            the policy                              yes
==============================  ======================================  =====================================

Which models are sharded (``train/run.py: build_trainer``):

- the **policy** is ``accelerator.prepare``'d: sharded under ZeRO-3 and FSDP (TRL's rollout gathers
  it for generation only when ``ds3_gather_for_generation`` is true; FSDP is never gathered);
- ``frozen`` with ``train.kl_coef > 0`` (the presets) and no LoRA is TRL's ``ref_model``, which TRL
  prepares with ``prepare_deepspeed`` / ``prepare_fsdp``: **sharded**;
- ``frozen`` with ``train.kl_coef = 0`` or LoRA is ``copy.deepcopy(policy)`` taken before the trainer
  exists, and ``ema`` is always such a copy, and a separate ``hindsearch.judge_model`` is loaded by
  ``models.load_policy``: these are **unsharded frozen copies** (never ``accelerator.prepare``'d),
  a full copy of the weights on every rank: ``n_params x bytes_per_param`` each, e.g. Qwen2.5-3B
  (3.09e9 params) in bf16 = 6.2 GB per copy per GPU, Qwen2.5-7B (7.62e9) = 15.2 GB. Their
  forwards issue no collective, so they would not need the lockstep; they go through it anyway
  (one uniform rule, no shardedness detection that could be wrong), which costs one 1-element
  all-reduce per forward and dummy forwards on a rank that would otherwise wait.

The loss side needs nothing here: the hindsight losses reuse the hidden states of TRL's own training
forward (the same number on every rank) and apply the LM head once per ``compute_loss`` on every
rank, even with no selected position (a single process skips the LM head, and the hidden-state capture,
on a micro-batch with nothing to distil: no collective to pair there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, NoReturn, TypeVar

import torch

T = TypeVar("T")

_region: Callable[[], Any] | None = None
"""The dummy forward of the open region (None: no region open)."""


def active() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one process (else nothing is synced)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _device() -> torch.device:
    """Where the all-reduce tensor lives: the current CUDA device under NCCL, else the CPU (gloo)."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(flag: bool) -> bool:
    """``flag`` OR-ed over all ranks (one all-reduce, max); ``flag`` itself in a single process."""
    if not active():
        return flag
    import torch.distributed as dist

    t = torch.tensor([int(flag)], dtype=torch.int32, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


@contextmanager
def lockstep(dummy: Callable[[], Any]) -> Iterator[None]:
    """A region in which every rank runs the same number of forwards (module docstring).

    ``dummy()`` runs one throw-away forward through the region's model; it is called on leaving the
    region for each forward another rank still announces. No-op in a single process, and inside an
    already open region (which it joins).
    """
    global _region
    if _region is not None or not active():
        yield
        return
    _region = dummy
    try:
        yield
    finally:
        _region = None
        while any_rank(False):
            dummy()


def forward(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` (one forward), announced to the
    other ranks when a region is open; exactly ``fn(*args, **kwargs)`` otherwise."""
    if _region is not None:
        any_rank(True)
    return fn(*args, **kwargs)


def close() -> bool:
    """Destroy ``torch.distributed``'s process group, if one is initialised; whether one was.

    Call it once per process after a run that ended well (never after an error: a rank that fails while
    another still waits in a collective would hang in the destroy). Without it, gloo's worker threads
    outlive the interpreter's finalisation and abort the process with SIGABRT ("terminate called without
    an active exception") after the work is done and saved, so ``accelerate launch`` reports a failed run.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True


def end_process(rc: int) -> NoReturn:
    """End a rank of a multi-process run that ended well (after ``close``), skipping the interpreter's finalisation.

    ``close`` does not stop gloo's worker threads where DDP's reducer or FSDP's device mesh still holds the group
    from C++ (their native threads are still there after the destroy and a ``gc.collect``). Their teardown during
    the interpreter's finalisation then sometimes aborts a finished rank with SIGABRT ("terminate called without
    an active exception"): 1 of about 32 two-rank test runs on 2 CPU cores, and once in CI. Everything the run writes is
    closed by then, so this waits for non-daemon threads, runs the ``atexit`` handlers (trackers, logging),
    flushes the standard streams and leaves with ``os._exit(rc)``.
    """
    import atexit
    import logging
    import os
    import sys
    import threading

    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a closed or broken stream
            stream.flush()
    os._exit(rc)


def pad_forward(model: Any, pad_id: int) -> Callable[[], None]:
    """A region's dummy: one no-grad forward of a single pad token through ``model`` (only the last logit kept)."""

    def run() -> None:
        dev = next(model.parameters()).device
        ids = torch.full((1, 1), int(pad_id), dtype=torch.long, device=dev)
        kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        with torch.no_grad():
            try:
                model(**kw, logits_to_keep=1)
            except TypeError:  # architectures without logits_to_keep
                model(**kw)

    return run
