"""The report's matplotlib figures, inlined as base64 PNGs (no file, no network).

Every label is plain text (``plain``: no mathtext, so a metric named ``loss/$x^$`` is drawn as
written; a lone surrogate or a control character is drawn as its escape), and only ``plottable``
numbers are drawn: NaN, infinities and magnitudes past ``PLOT_LIMIT`` are left out (the page lists
them under the plot)."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from hindsearch.study.report.runs import clean, plottable, series
from hindsearch.study.results import moving_average

MAX_LABEL = 60
"""Characters of a label drawn (a longer metric name is cut with an ellipsis)."""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain(label: Any) -> str:
    """A label as matplotlib draws it verbatim (with ``parse_math=False``): control characters
    escaped, lone surrogates escaped (FreeType refuses them), cut to ``MAX_LABEL`` characters."""
    s = clean(str(label))
    s = "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in s)
    return s if len(s) <= MAX_LABEL else s[:MAX_LABEL - 1] + "…"


LEGEND_BELOW = 3
"""A legend with this many entries or more is drawn below the plot (in up to 3 columns), not over
the lines."""


def legend(ax: Any, **kw: Any) -> None:
    """The legend with its texts taken verbatim (no mathtext): over the plot where it covers least
    when it is short, below the plot when it has ``LEGEND_BELOW`` entries or more; 8 pt, so it reads
    at the page's size."""
    n = len(ax.get_legend_handles_labels()[0])
    if not n:
        return
    kw.setdefault("fontsize", 7.5 if n >= LEGEND_BELOW else 8)
    if n >= LEGEND_BELOW:
        kw.update(loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=min(3, n), frameon=False)
    else:
        kw.setdefault("framealpha", 0.7)
    for t in ax.legend(**kw).get_texts():
        t.set_parse_math(False)


def integer_steps(ax: Any) -> None:
    """Ticks on whole steps only (a two-step run is not labelled 1.25, 1.5, 1.75)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def distinct_digits(values: Sequence[float], least: int = 3, most: int = 15) -> int:
    """The fewest significant digits (at least ``least``) at which ``values`` are written apart
    (``%.Ng``): ticks 0.81202, 0.81204, ... of a small range need more than three."""
    n = len(set(values))
    for d in range(least, most + 1):
        if len({f"{v:.{d}g}" for v in values}) == n:
            return d
    return most


def plain_y(ax: Any) -> None:
    """y tick labels as values (``%.Ng``, N = 3 or as many as the ticks need to differ:
    ``distinct_digits``), not as an offset or a power of ten above the axis: a learning rate of
    2e-05 reads 2e-05."""
    from matplotlib.ticker import Formatter

    class Plain(Formatter):
        digits = 3

        def set_locs(self, locs: Sequence[float]) -> None:
            self.digits = distinct_digits(list(locs))

        def __call__(self, v: float, pos: Any = None) -> str:
            return f"{v:.{self.digits}g}"

    ax.yaxis.set_major_formatter(Plain())


def axes(title: str, xlabel: str = "step") -> tuple[Any, Any]:
    """A figure and its axes with the report's sizes: 10 pt title, 8 pt labels and ticks."""
    fig, ax = _pyplot().subplots(figsize=(4.4, 2.7))
    ax.set_title(plain(title), fontsize=10, parse_math=False)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(labelsize=8)
    return fig, ax


def fig_to_b64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


DPI = 100
"""Pixels per inch of the PNGs (a 4.4 x 2.7 inch plot is 440 x 270 pixels: three abreast on a wide
screen)."""

SMOOTH_FROM = 15
"""With ``smooth``, a series of this many points or more is drawn as its moving average over about a
tenth of its points (at least 3), over its per-step values drawn faint."""


def smoothing_window(n: int) -> int:
    return max(3, n // 10)


def plot_lines(data: Sequence[tuple[str, list[float], list[float]]], title: str,
               smooth: bool = False) -> str | None:
    """Base64 PNG of ``(label, steps, values)`` lines (None when none has a value). ``smooth``:
    series of ``SMOOTH_FROM`` points or more are drawn as a moving average over their faint per-step
    values."""
    pts = [(k, [(x, y) for x, y in zip(xs, ys) if plottable(x) and plottable(y)])
           for k, xs, ys in data]
    pts = [(k, xy) for k, xy in pts if xy]
    if not pts:
        return None
    fig, ax = axes(title)
    for k, xy in pts:
        xs, ys = [x for x, _ in xy], [y for _, y in xy]
        if smooth and len(xy) >= SMOOTH_FROM:
            (line,) = ax.plot(xs, ys, lw=0.8, alpha=0.3)
            ax.plot(xs, moving_average(ys, smoothing_window(len(ys))), lw=1.6,
                    color=line.get_color(), label=plain(k))
        else:
            ax.plot(xs, ys, marker="o" if len(xy) < 30 else None, ms=3, label=plain(k))
    integer_steps(ax)
    plain_y(ax)
    legend(ax)
    ax.grid(alpha=0.3)
    return fig_to_b64(fig)



def time_plot(rows: list[dict[str, Any]], keys: list[str]) -> str | None:
    """Base64 PNG: stacked bars of the step time split (seconds) per step."""
    if not keys or not rows:
        return None
    from hindsearch.study.report.runs import step_of

    steps = [step_of(r, i) for i, r in enumerate(rows)]
    keys = [k for k in keys if any(plottable(r.get(k)) for r in rows)]
    if not keys:
        return None
    fig, ax = axes("Step time split (s)")
    bottom = [0.0] * len(rows)
    for k in keys:
        vals = [float(r[k]) if plottable(r.get(k)) else 0.0 for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=plain(k.removeprefix("time/")))
        bottom = [b + v for b, v in zip(bottom, vals)]
    integer_steps(ax)
    legend(ax)
    return fig_to_b64(fig)


def bar_plot(groups: Sequence[str], bars: dict[str, list[tuple[float, float, float] | None]],
             title: str, ylabel: str, zero_line: bool = False,
             show_legend: bool = True) -> str | None:
    """Base64 PNG of grouped bars: per group (x), one bar per key of ``bars`` at ``value`` with the
    error bar from ``low`` to ``high`` (``(value, low, high)``; None leaves the bar out). None when
    nothing to draw."""
    bars = {k: [v if v is not None and all(plottable(x) for x in v) else None for v in vals]
            for k, vals in bars.items()}
    if not groups or not any(v for vals in bars.values() for v in vals):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(groups) * max(1, len(bars)) ** 0.5), 2.8))
    width = 0.8 / max(1, len(bars))
    for i, (name, vals) in enumerate(bars.items()):
        xs = [g + (i - (len(bars) - 1) / 2) * width for g, v in enumerate(vals) if v is not None]
        pts = [v for v in vals if v is not None]
        if pts:
            ax.bar(xs, [p[0] for p in pts], width, label=plain(name),
                   yerr=[[p[0] - p[1] for p in pts], [p[2] - p[0] for p in pts]], capsize=3,
                   error_kw={"lw": 1})
    if zero_line:
        ax.axhline(0, color="#444", lw=0.8)
    ax.set_xticks(range(len(groups)), [plain(g) for g in groups], fontsize=8,
                  rotation=20 if len(groups) > 4 else 0, parse_math=False)
    ax.set_title(plain(title), fontsize=10, parse_math=False)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=8)
    if show_legend:
        legend(ax)
    ax.grid(alpha=0.3, axis="y")
    return fig_to_b64(fig)
