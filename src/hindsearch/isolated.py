"""Runs in fresh spawned processes: ``run_isolated`` runs one and waits (several at once:
``compare``'s ``ProcessPoolExecutor``, one fresh process per run).

A run's models, trainer and framework state are freed when its process exits (in one process, memory
grew by ~1.5 GB per SmolLM2 run), and a crash names the run that failed. Stopping the parent (Ctrl-C
or SIGTERM) stops every child (``stopped_on_exit``), so an interrupted comparison leaves no orphan
training on the CPU.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any


@contextmanager
def stopped_on_exit():
    """Yields a list to put child processes in; on leaving (normally, on an exception, or on
    SIGTERM, which is turned into ``SystemExit`` while inside) every child still alive is
    terminated, then killed after 30 s."""
    import signal

    def _term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        prev = signal.signal(signal.SIGTERM, _term)
    except ValueError:  # not the main thread: signals stay as they are
        prev = None
    procs: list[Any] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def run_isolated(target: Any, args: tuple, name: str, on_start: Any = None) -> int | None:
    """Run ``target(*args)`` in a spawned process and wait; returns its exit code.

    Stopping the parent (Ctrl-C or SIGTERM) stops the child too, so an interrupted comparison
    leaves no orphan training on the CPU (the run resumes from its checkpoint next time).
    ``on_start(pid)`` is called once the child runs.
    """
    import multiprocessing as mp

    with stopped_on_exit() as procs:
        proc = mp.get_context("spawn").Process(target=target, args=args, name=name)
        procs.append(proc)
        proc.start()
        if on_start is not None:
            on_start(proc.pid)
        proc.join()
        return proc.exitcode

