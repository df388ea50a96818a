"""``hindsearch report DIR``: one static HTML page per training run, evaluation, folder of runs or comparison.

The page is rendered by jinja2 (autoescape on) from the templates in ``study/report/templates``;
every value read from a run folder is escaped, so markup in a question, critique or metric name
shows as text. It needs no server and no network (a Content-Security-Policy forbids scripts and
any fetch): plots are matplotlib PNGs inlined as base64 and styles are inline. A run's page holds

- the **header** (``header.run_header``): model, method, LoRA, steps, questions and rollouts per step, wall
  time, start date, git commit and hardware (the last two from the provenance ``fsutil.claim_output`` records
  in the folder's marker; "not recorded" for runs from before it);
- **curves** from ``metrics.jsonl`` and ``dev_curve.jsonl``: reward, EM (training rollouts and greedy dev EM)
  and the step time split first; then the **training health** TRL logs (learning rate, grad norm, KL to the
  reference model, entropy, clip ratios); then searches per rollout, validity, loss parts, the HindSearch
  weights, IGSD gate statistics and lengths. Steps are ticked on integers; a metric that was not logged shows
  "not recorded" (with the reason where the config gives it: no KL when ``train.kl_coef = 0``);
- the **evaluation** table (``summary.json``'s dev EM before/after RL, ``results.json``'s benchmarks)
  and the **teacher probes** (``probe.json``) as tables;
- a **trajectory browser** over ``samples.jsonl`` (``browse``): rollouts grouped by outcome (failed with a
  critique, failed without, succeeded) and hop count as nested ``<details>``, with a table of counts linking
  into each group; per rollout the question, gold answers, each turn (query and retrieved titles, with the
  evidence recall so far where the question's evidence is known, its evidence passages marked), the answer and
  reward; for failed rollouts the judge's critique and the per-token teacher log-probs on the distilled tokens
  (coloured spans: green = the critique teacher prefers the token, red = less; the value is the tooltip); for
  IGSD the verified pairs (student vs teacher query, what each retrieved, IG_S, IG_T, delta, gate).

An *evaluation folder* (``hindsearch eval --out DIR``, ``evals``) gets its header, the benchmark table with each
EM's 95% interval and the macro average's, EM bars with those intervals, the data evaluated, and its
trajectories grouped by outcome and benchmark.

A *folder of runs* (sub-folders holding ``metrics.jsonl``, ``overlay``) gets a table of the runs' headers (what
all share said once) and one plot per curve with a line per run, then one section per run. A *compare dir*
(``hindsearch compare --out DIR``: one run folder per (method, seed) with its ``results.json``) gets, above
that, from those numbers, the results table, bars per method with error bars (mean ± sample std over seeds; each
method minus GRPO with the paired-bootstrap 95% interval) and ``curves.png``.

Samples are read by the names the trainer writes them (``rollout_adapter.sample_records``): each carries
its turns (action, query or answer, retrieved ids and titles), so nothing is parsed from the completion
text. Whatever is missing is reported as "not recorded" rather than failing: runs from before samples
carried their turns show "turns not recorded" for each rollout.

The ``report`` command is ``hindsearch.cli.report``. A comparison's numbers come from ``hindsearch.study.results``;
this module never imports ``hindsearch.study.compare``.
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
    """A folder ``hindsearch compare`` wrote (``compare.json``, ``results.md``) or whose runs hold ``results.json``:
    it gets the comparison's results section; a folder of plain ``train`` runs gets the overlay only."""
    return ((path / "compare.json").exists() or (path / "results.md").exists()
            or any((d / "results.json").exists() for d in sub_runs(path)))


def anchor_of(i: int, name: str) -> str:
    """A page-unique id prefix for run ``i``: its name's letters, digits, ``-`` and ``_``, and its index."""
    return "r" + str(i) + "-" + "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in name)[:40]


def render(path: str | Path) -> str:
    """The HTML page of a run folder, an evaluation folder, a folder of runs or a comparison folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    evaluation, name = is_eval_dir(p), p.resolve().name  # first: an evaluation folder holds a results.md too
    compare = not evaluation and is_compare_dir(p)
    if not compare and not evaluation and not any((p / f).exists() for f in ("metrics.jsonl", "summary.json", "config.toml")):
        raise ValueError(f"{p} is not a run, evaluation or comparison folder (no metrics.jsonl, summary.json, "
                         f"config.toml or trajectories.jsonl)")
    cmp = overlay = ev = None
    if evaluation:
        title, runs, ev = f"hindsearch evaluation: {name}", [], eval_view(p)
    elif compare:
        loaded = [load_run(r) for r in sub_runs(p)]
        cmp = compare_view(p) if has_comparison(p) else None
        title = f"hindsearch comparison: {name}" if cmp is not None else f"hindsearch runs: {name}"
        overlay = overlay_view(loaded)
        runs = [run_view(r, MAX_SAMPLES_COMPARED, anchor_of(i, r.path.name)) for i, r in enumerate(loaded)]
    else:
        title = f"hindsearch run: {name}"
        runs = [run_view(load_run(p))]
    return environment().get_template("report.html.j2").render(title=title, compare=cmp, overlay=overlay,
                                                                evaluation=ev, runs=runs, shades=shade_css())


REPORT_TITLES = ("<title>hindsearch run:", "<title>hindsearch comparison:", "<title>hindsearch runs:",
                 "<title>hindsearch evaluation:")


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a page this command wrote (its title says so)."""
    from hindsearch.fsutil import open_regular

    try:
        with open_regular(path) as f:  # a FIFO or a device at --out is not a report (and is never waited on)
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return any(t in head for t in REPORT_TITLES)


def check_report_out(out_path: Path) -> None:
    """Refuse an ``--out`` that would replace anything but an earlier report: a folder, a file of a run
    folder (``metrics.jsonl``, ``config.toml`` ...), or any other file."""
    if out_path.is_dir():
        raise IsADirectoryError(f"--out {out_path}: is a folder; give the page's file name, e.g. {out_path / 'report.html'}")
    if out_path.exists() and not _is_report(out_path):
        raise FileExistsError(f"--out {out_path}: exists and is not a hindsearch report, so the page would overwrite "
                              f"it; choose a new file name (an earlier report is replaced)")


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) and return its path. The page replaces only an
    earlier report (``check_report_out``); it is written through a temporary file and a rename."""
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
