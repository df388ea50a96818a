"""Progress on long work: a tqdm bar on a terminal, plain progress lines everywhere else.

A bar redraws itself with carriage returns, and a log file keeps every redraw, so bars are drawn
only when stderr is a terminal. Elsewhere ``progress_bar`` returns a ``PlainProgress``, which writes
one whole line at the start, at most one every ``PLAIN_EVERY_S`` seconds, and one at the end.
``quiet_upstream_bars`` (called by the CLI at start) turns the upstream libraries' own bars off in
the same case. The lines: docs/runs.md, "Progress lines".
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

PLAIN_EVERY_S = 30.0
"""Seconds between two plain progress lines (the first and the last are always written)."""


def interactive(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr) is a terminal, where a redrawn bar is readable."""
    s = stream if stream is not None else sys.stderr
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class PlainProgress:
    """The part of tqdm's interface hindsearch uses (``update``, ``set_postfix``, ``close``, ``n``,
    ``total``), written as whole lines to ``stream`` (default stderr): at the start, at most every
    ``every_s`` seconds, at the end. ``clock`` is injectable for tests."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", initial: int = 0,
                 every_s: float = PLAIN_EVERY_S, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.every_s, self.stream, self.clock = every_s, stream, clock
        self.postfix: dict[str, Any] = {}
        self.t0 = self.last = clock()
        self.start_n = initial
        self.closed = False
        self._write()

    def line(self) -> str:
        """The progress line as it stands."""
        elapsed = self.clock() - self.t0
        head = f"{self.desc}: {self.n}"
        if self.total:
            head += f"/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%)"
        else:
            head += f" {self.unit}"
        parts = [head, f"{_clock(elapsed)} elapsed"]
        done = self.n - self.start_n
        if self.total and done > 0 and self.n < self.total:
            parts.append(f"eta {_clock(elapsed / done * (self.total - self.n))}")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return ", ".join(parts)

    def _write(self) -> None:
        s = self.stream if self.stream is not None else sys.stderr
        print(self.line(), file=s, flush=True)
        self.written = (self.n, dict(self.postfix))
        self.last = self.clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last >= self.every_s:
            self._write()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            # unless the last line already says where it ended (its elapsed time aside)
            if (self.n, self.postfix) != self.written:
                self._write()


def progress_bar(total: int | None, desc: str, unit: str = "it", initial: int = 0,
                 **kwargs: Any) -> Any:
    """A tqdm bar on a terminal, else a ``PlainProgress`` (same calls: ``update``, ``set_postfix``,
    ``close``)."""
    if interactive():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, initial=initial,
                    dynamic_ncols=True, **kwargs)
    return PlainProgress(total, desc, unit=unit, initial=initial)


UPSTREAM_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"
"""huggingface_hub's switch, read when it is imported; transformers' own bars (weight loading)
follow it."""

TQDM_ENV = "TQDM_DISABLE"
"""tqdm's switch for bars that bypass huggingface_hub's, read when tqdm is imported."""


def quiet_upstream_bars(environ: Any = None) -> bool:
    """Off a terminal, turn transformers' and huggingface_hub's own progress bars off (an
    environment switch read when they are imported, so nothing heavy loads here; where they are
    imported already, their own switches too); a user's own setting wins. Returns whether it did."""
    import os

    env = os.environ if environ is None else environ
    if interactive() or UPSTREAM_BARS_ENV in env:
        return False
    env[UPSTREAM_BARS_ENV] = "1"
    # plain tqdm bars (transformers' GGUF conversion), read when tqdm is imported
    env.setdefault(TQDM_ENV, "1")
    # already imported (``run_train`` called from Python): their switches, read at each bar
    if environ is None:
        if "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
    return True
