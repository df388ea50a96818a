"""Lockstep forwards: every rank runs the same number of forwards through a sharded model.

Under ZeRO-3 or FSDP each forward is a chain of collectives, so ranks with data-dependent work would
hang. Inside a region (``lockstep(dummy)``, entered by every rank at the same point, one model) each
forward is announced with ``forward(model, **inputs)``; a rank with less work answers with
``dummy()`` pad forwards until every rank is done. Regions do not nest (an inner one joins the
outer). With one process (``active()`` false) nothing here runs: same forwards, same results bit for
bit. Only the model core (``core.decode``, ``core.scoring``) opens regions. Which models are
sharded: docs/gpu.md, "Multi-GPU".
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
    """Whether ``torch.distributed`` is initialised with more than one process (else nothing is
    synced)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _device() -> torch.device:
    """Where the all-reduce tensor lives: the current CUDA device under NCCL, else the CPU
    (gloo)."""
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

    Call it once per process after a run that ended well (never after an error: a rank that fails
    while another still waits in a collective would hang in the destroy). Without it, gloo's worker
    threads outlive the interpreter's finalisation and abort the process with SIGABRT ("terminate
    called without an active exception") after the work is done and saved, so ``accelerate launch``
    reports a failed run.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True


def end_process(rc: int) -> NoReturn:
    """End a rank of a multi-process run that ended well (after ``close``), skipping the
    interpreter's finalisation.

    ``close`` does not stop gloo's worker threads where DDP's reducer or FSDP's device mesh still
    holds the group from C++ (their native threads are still there after the destroy and a
    ``gc.collect``). Their teardown during the interpreter's finalisation then sometimes aborts a
    finished rank with SIGABRT ("terminate called without an active exception"): 1 of about 32
    two-rank test runs on 2 CPU cores, and once in CI. Everything the run writes is closed by then,
    so this waits for non-daemon threads, runs the ``atexit`` handlers (trackers, logging), flushes
    the standard streams and leaves with ``os._exit(rc)``.
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
    """A region's dummy: one no-grad forward of a single pad token through ``model`` (only the last
    logit kept)."""

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
