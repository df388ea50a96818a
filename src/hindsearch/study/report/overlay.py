"""A folder of runs (``hindsearch train`` runs side by side, or a comparison's runs): one table of
their headers and one plot per curve with a line per run (``OVERLAY``), so that runs are compared on
the same axes.

Curves of ``SMOOTH_FROM`` steps or more are drawn as their moving average over their faint per-step
values (``plots.plot_lines(smooth=True)``): GRPO's per-step reward of a few questions is too noisy
to tell seven runs apart otherwise. At most ``MAX_SERIES`` runs are drawn per plot (the first by
name; the page says so)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hindsearch.study.report.header import dig, run_header
from hindsearch.study.report.plots import SMOOTH_FROM, plot_lines, smoothing_window
from hindsearch.study.report.runs import Run, finite, left_out, series, text
from hindsearch.study.report.views import (MAX_SERIES, constant_note, dev_points, guarded,
                                           health_note, panel)

OVERLAY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward (training rollouts)", ("rollout/reward_mean", "reward")),
    ("EM (training rollouts)", ("rollout/em", "em")),
    ("Dev EM (greedy)", ()),
    ("Loss", ("loss",)),
    ("KL to the reference model", ("kl",)),
    ("Entropy (nats per token)", ("entropy",)),
    ("Gradient norm (before clipping)", ("grad_norm",)),
    ("Learning rate", ("learning_rate",)),
    ("Clip ratio (region mean)", ("clip_ratio/region_mean",)),
    ("Searches per rollout", ("rollout/searches_per_rollout", "searches_per_rollout")),
    ("Validity rate", ("rollout/validity_rate", "validity_rate")),
    ("Step time (s)", ("time/step",)),
)
"""Each overlay plot: its title and the metric names it draws, the first a run logged (``()``: dev
EM, from ``dev_points``)."""

TABLE_HEAD = ["run", "method", "model", "LoRA", "steps", "per step", "wall time", "started",
              "git commit", "dev EM base → RL", "reward, last 10 steps"]


def key_of(run: Run, cands: Sequence[str]) -> str | None:
    return next((k for k in cands if any(k in r for r in run.metrics)), None)


def dev_em(run: Run) -> str:
    dev = run.summary.get("dev") if isinstance(run.summary.get("dev"), dict) else {}
    ems = [finite(dig(dev, stage, "em")) for stage in ("base", "rl")]
    return (" → ".join("-" if e is None else f"{100 * e:.1f}" for e in ems)
            if any(e is not None for e in ems) else "-")


def last_reward(run: Run) -> str:
    k = key_of(run, OVERLAY[0][1])
    ys = series(run.metrics, k)[1][-10:] if k else []
    return f"{sum(ys) / len(ys):.3f}" if ys else "-"


def table_row(run: Run) -> list[str | None]:
    head = {h["label"]: h["value"] for h in run_header(run)}
    return [text(run.path.name), head.get("method"), head.get("model"), head.get("LoRA"),
            head.get("steps"), head.get("per step"), head.get("wall time"), head.get("started"),
            head.get("git commit"), dev_em(run), last_reward(run)]


def overlay_view(runs: list[Run]) -> dict[str, Any]:
    """The runs' header table and the overlay plots (``panel`` dicts)."""
    bad: list[str] = []
    rows = [guarded(f"{text(r.path.name)} header", bad, lambda r=r: table_row(r),
                    [text(r.path.name)] + [None] * 10)
            for r in runs]
    drawn, extra = runs[:MAX_SERIES], (f"{MAX_SERIES} of {len(runs)} runs drawn (the first by name)"
                                       if len(runs) > MAX_SERIES else None)
    panels = []
    longest = max((len(r.metrics) for r in drawn), default=0)
    smooth_note = (f"lines: moving average over {smoothing_window(longest)} steps; faint: each step"
                   if longest >= SMOOTH_FROM else None)
    for title, cands in OVERLAY:
        data, left = [], []
        for r in drawn:
            name = text(r.path.name)
            if not cands:
                pts, skipped = dev_points(r)
                data.append((name, [s for s, _ in pts], [v for _, v in pts]))
                left.append((name, skipped))
                continue
            k = key_of(r, cands)
            if k:
                data.append((name, *series(r.metrics, k)))
                left.append((name, left_out(r.metrics, k)))
        why = None
        if not data and title.startswith("KL"):  # the same reason for every run, or none
            whys = {health_note(title, [], r.config) for r in drawn}
            why = whys.pop() if len(whys) == 1 else None
        drawn_any = any(ys for _, _, ys in data)
        note = "; ".join(n for n in (extra, why, smooth_note if cands and drawn_any else None,
                                     constant_note(data) if cands else None) if n) or None
        panels.append(panel(
            title, lambda data=data, title=title, s=bool(cands): plot_lines(data, title, smooth=s),
            left, note))
    head, rows, common = split_common(TABLE_HEAD, rows)
    return {"head": head, "rows": rows, "common": common, "panels": panels, "bad": bad,
            "count": len(runs)}


def split_common(head: list[str],
                 rows: list[list[Any]]) -> tuple[list[str], list[list[Any]], list[list[Any]]]:
    """The columns (after the first) whose value is the same for every run move out of the table
    into ``[[name, value]]`` shown once above it (with one run, nothing moves)."""
    if len(rows) < 2:
        return head, rows, []
    same = [j for j in range(1, len(head)) if len({r[j] for r in rows}) == 1
            and rows[0][j] is not None]
    keep = [j for j in range(len(head)) if j not in same]
    return ([head[j] for j in keep], [[r[j] for j in keep] for r in rows],
            [[head[j], rows[0][j]] for j in same])
