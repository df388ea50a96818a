"""``hindsearch report DIR``: one static HTML page per training run, evaluation, folder of runs or
comparison.

Rendered by jinja2 from ``templates/`` with autoescape: every value read from a folder shows as
text, and what is missing or unreadable is named rather than failing the page. No script runs and
nothing is fetched (the page's Content-Security-Policy forbids both; plots are inline PNGs). What
each page shows: docs/runs.md, "The report". A comparison's numbers come from ``study.results``;
this package never imports ``study.compare``.
"""

from __future__ import annotations

import os
from pathlib import Path

from hindsearch.study.report.env import environment
from hindsearch.study.report.evals import eval_view
from hindsearch.study.report.overlay import overlay_view
from hindsearch.study.report.runs import Run, is_compare_dir, is_eval_dir, load_run, sub_runs
from hindsearch.study.report.views import (MAX_SAMPLES_COMPARED, compare_view, run_view, shade_css,
                                           token_spans, turns_of)

__all__ = ["Run", "load_run", "render", "shade_css", "token_spans", "turns_of", "write_report"]


def has_comparison(path: Path) -> bool:
    """A folder ``hindsearch compare`` wrote (``compare.json``, ``results.md``) or whose runs hold
    ``results.json``: it gets the comparison's results section; a folder of plain ``train`` runs
    gets the overlay only."""
    return ((path / "compare.json").exists() or (path / "results.md").exists()
            or any((d / "results.json").exists() for d in sub_runs(path)))


def anchor_of(i: int, name: str) -> str:
    """A page-unique id prefix for run ``i``: its name's letters, digits, ``-`` and ``_``, and its
    index."""
    return "r" + str(i) + "-" + "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_"
                                        for c in name)[:40]


def render(path: str | Path) -> str:
    """The HTML page of a run folder, an evaluation folder, a folder of runs or a comparison
    folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    # first: an evaluation folder holds a results.md too
    evaluation, name = is_eval_dir(p), p.resolve().name
    compare = not evaluation and is_compare_dir(p)
    if not compare and not evaluation and not any(
            (p / f).exists() for f in ("metrics.jsonl", "summary.json", "config.toml")):
        raise ValueError(f"{p} is not a run, evaluation or comparison folder (no metrics.jsonl, "
                         f"summary.json, config.toml or trajectories.jsonl)")
    cmp = overlay = ev = None
    if evaluation:
        title, runs, ev = f"hindsearch evaluation: {name}", [], eval_view(p)
    elif compare:
        loaded = [load_run(r) for r in sub_runs(p)]
        cmp = compare_view(p) if has_comparison(p) else None
        title = f"hindsearch comparison: {name}" if cmp is not None else f"hindsearch runs: {name}"
        overlay = overlay_view(loaded)
        runs = [run_view(r, MAX_SAMPLES_COMPARED, anchor_of(i, r.path.name))
                for i, r in enumerate(loaded)]
    else:
        title = f"hindsearch run: {name}"
        runs = [run_view(load_run(p))]
    return environment().get_template("report.html.j2").render(
        title=title, compare=cmp, overlay=overlay, evaluation=ev, runs=runs, shades=shade_css())


REPORT_TITLES = ("<title>hindsearch run:", "<title>hindsearch comparison:",
                 "<title>hindsearch runs:", "<title>hindsearch evaluation:")


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a page this command wrote (its title says so)."""
    from hindsearch.fsutil import open_regular

    try:
        # a FIFO or a device at --out is not a report (and is never waited on)
        with open_regular(path) as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return any(t in head for t in REPORT_TITLES)


def check_report_out(out_path: Path) -> None:
    """Refuse an ``--out`` that would replace anything but an earlier report: a folder, a file of a
    run folder (``metrics.jsonl``, ``config.toml`` ...), or any other file."""
    if out_path.is_dir():
        raise IsADirectoryError(f"--out {out_path}: is a folder; give the page's file name, e.g. "
                                f"{out_path / 'report.html'}")
    if out_path.exists() and not _is_report(out_path):
        raise FileExistsError(f"--out {out_path}: exists and is not a hindsearch report, so the "
                              "page would overwrite it; choose a new file name (an earlier report "
                              "is replaced)")


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) and return its path. The page replaces only
    an earlier report (``check_report_out``); it is written through a temporary file and a
    rename."""
    from hindsearch.fsutil import expand_out

    out_path = expand_out(out) if out else expand_out(path) / "report.html"
    check_report_out(out_path)
    text = render(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path
