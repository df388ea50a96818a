"""Resident memory of the process: glibc allocator tuning and per-stage peak RSS.

Memory is read from the kernel (``/proc/self/status``: ``VmRSS`` now, ``VmHWM`` peak), since
``tracemalloc`` does not see torch's allocations. ``StageMemory`` samples ``VmRSS`` on a background
thread and records, for each ``with mem.stage(name):`` block, its peak RSS and wall time.
``tune_malloc()`` sets glibc's allocator from code (``mallopt``) as ``MALLOC_ARENA_MAX=2
MALLOC_TRIM_THRESHOLD_=32MiB MALLOC_MMAP_THRESHOLD_=1MiB`` would; an allocator variable already set
in the environment wins. What each setting does: docs/benchmarks.md, "glibc malloc settings".
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# glibc's mallopt parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MALLOC_SETTINGS = {  # mallopt parameter -> (environment variable that overrides it, value)
    M_ARENA_MAX: ("MALLOC_ARENA_MAX", 2),
    M_TRIM_THRESHOLD: ("MALLOC_TRIM_THRESHOLD_", 32 * 1024 * 1024),
    M_MMAP_THRESHOLD: ("MALLOC_MMAP_THRESHOLD_", 1024 * 1024),
}
_tuned: dict[str, int] | None = None


def tune_malloc() -> dict[str, int]:
    """Apply ``MALLOC_SETTINGS`` with glibc's ``mallopt`` (once per process); returns what was set.

    Does nothing (returns ``{}``) off Linux/glibc, when ``HINDSEARCH_MALLOC_TUNE=0``, and for each
    setting whose environment variable is already set. Call it as early as possible: arenas that
    already exist keep their memory.
    """
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = {}
    if not sys.platform.startswith("linux") or os.environ.get("HINDSEARCH_MALLOC_TUNE", "1") == "0":
        return _tuned
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return _tuned
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    for param, (env, value) in MALLOC_SETTINGS.items():
        if env not in os.environ and mallopt(param, value) == 1:
            _tuned[env] = value
    return _tuned


def release_free_memory(collect: bool = True) -> bool:
    """Hand the heap's free pages back to the kernel (glibc ``malloc_trim(0)``, which also releases
    free pages inside the heap, not only at its top), after a full Python garbage collection with
    ``collect``. Returns whether ``malloc_trim`` ran. The main job calls it between stages (with
    ``collect``), so one stage's freed activations and caches do not stay resident under the next
    stage's peak. ``gc.collect()`` can take a second in a large process (a test session): per
    optimizer step, pass ``collect=False``."""
    import gc

    if collect:
        gc.collect()
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def release_memory_callback() -> Any:
    """A ``TrainerCallback`` that hands freed heap pages back to the kernel after every optimizer
    step (``release_free_memory(collect=False)``: no garbage collection, which costs up to a second
    per call in a large process): the next step's rollouts and update do not start on top of the
    last step's freed activations."""
    from transformers import TrainerCallback

    class Release(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            release_free_memory(collect=False)

    return Release()


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """Resident set size now, MiB (0.0 where ``/proc`` is unavailable)."""
    kb = _status_kb("VmRSS")
    return kb / 1024 if kb is not None else 0.0


def hwm_mb() -> float:
    """Peak resident set size of the process so far (``VmHWM``), MiB (0.0 where unavailable)."""
    kb = _status_kb("VmHWM")
    return kb / 1024 if kb is not None else 0.0


class StageMemory:
    """Peak RSS and wall time per named stage, from a sampler thread.

    ``stages[name] = {"peak_rss_mb", "start_rss_mb", "end_rss_mb", "seconds", "cpu_seconds"}``
    (``cpu_seconds``: the process's CPU time, user + system, all threads; on a shared machine it
    compares runs better than wall time); a stage entered twice keeps the larger peak and adds the
    seconds. The thread runs only while a stage is open.
    """

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.stages: dict[str, dict[str, float]] = {}
        self._peak = 0.0
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None

    def _sample(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            r = rss_mb()
            with self._lock:
                self._peak = max(self._peak, r)

    @contextmanager
    def stage(self, name: str, release: bool = True) -> Iterator[None]:
        """Measure the block as stage ``name`` (not reentrant: stages do not nest); with
        ``release``, first ``release_free_memory()`` so the stage does not start on the previous
        stage's freed memory."""
        if release:
            release_free_memory()
        start = rss_mb()
        with self._lock:
            self._peak = start
        stop = threading.Event()
        thread = threading.Thread(target=self._sample, args=(stop,),
                                  name=f"rss-{name}", daemon=True)
        thread.start()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            end = rss_mb()
            with self._lock:
                peak = max(self._peak, end)
            prev = self.stages.get(name)
            row = {"peak_rss_mb": round(peak, 1), "start_rss_mb": round(start, 1),
                   "end_rss_mb": round(end, 1), "seconds": round(time.perf_counter() - t0, 2),
                   "cpu_seconds": round(time.process_time() - c0, 2)}
            if prev is not None:
                row["peak_rss_mb"] = max(row["peak_rss_mb"], prev["peak_rss_mb"])
                row["start_rss_mb"] = prev["start_rss_mb"]
                row["seconds"] = round(row["seconds"] + prev["seconds"], 2)
                row["cpu_seconds"] = round(row["cpu_seconds"] + prev["cpu_seconds"], 2)
            self.stages[name] = row

    def summary(self) -> dict[str, Any]:
        """``{"stages": {...}, "peak_rss_mb": VmHWM of the process, "malloc": tune_malloc()'s
        settings}``."""
        return {"stages": dict(self.stages), "peak_rss_mb": round(hwm_mb(), 1),
                "malloc": dict(_tuned or {})}


def format_memory_table(mem: dict[str, Any]) -> str:
    """Plain-text table of ``StageMemory.summary()``: stage, peak RSS (MiB), RSS at the end, wall
    and CPU seconds."""
    head = f"{'stage':<16}{'peak RSS MiB':>14}{'end RSS MiB':>13}{'wall s':>9}{'CPU s':>9}"
    lines = [head, "-" * len(head)]
    for name, r in mem.get("stages", {}).items():
        lines.append(f"{name:<16}{r['peak_rss_mb']:>14.0f}{r['end_rss_mb']:>13.0f}"
                     f"{r['seconds']:>9.1f}{r.get('cpu_seconds', 0.0):>9.1f}")
    lines.append(f"{'process peak':<16}{mem.get('peak_rss_mb', 0.0):>14.0f}")
    return "\n".join(lines)
