"""``hindsearch report RUN_DIR``: one static HTML page per training run or comparison.

The page is rendered by jinja2 (autoescape on) from the templates in ``hindsearch/templates``;
every value read from a run folder is escaped, so markup in a question, critique or metric name
shows as text. It needs no server and no network (a Content-Security-Policy forbids scripts and
any fetch): plots are matplotlib PNGs inlined as base64 and styles are inline. It holds

- **curves** from ``metrics.jsonl`` and ``dev_curve.jsonl``: reward, EM (training rollouts and
  greedy dev EM), step time split first, then searches per rollout, validity, loss parts, the
  HindSearch weights, IGSD gate statistics and lengths; a metric that was not logged shows
  "not recorded";
- the **evaluation** table (``summary.json``'s dev EM before/after RL, ``results.json``'s benchmarks)
  and the **teacher probes** (``probe.json``) as tables;
- a **trajectory browser** over ``samples.jsonl`` (one collapsible ``<details>`` per rollout):
  question, gold answers, each turn (query and retrieved titles), the answer and reward; for failed
  rollouts the judge's critique and the per-token teacher log-probs on the distilled tokens (coloured
  spans: green = the critique teacher prefers the token, red = less; the value is the tooltip); for
  IGSD the verified pairs (student vs teacher query, what each retrieved, IG_S, IG_T, delta, gate).

A *compare dir* (``hindsearch compare --out DIR``: one run folder per (method, seed) with its
``results.json``) gets, from those numbers, the results table, bars per method with error bars
(mean ± sample std over seeds; each method minus GRPO with the paired-bootstrap 95% interval),
``curves.png``, then one section per run.

Samples are read by the names the trainer writes them (``rollout_adapter.sample_records``): each carries
its turns (action, query or answer, retrieved ids and titles), so nothing is parsed from the completion
text. Whatever is missing is reported as "not recorded" rather than failing: runs from before samples
carried their turns show "turns not recorded" for each rollout.

``register(sub)`` adds the ``report`` command. A comparison's numbers come from ``hindsearch.results``;
this module never imports ``hindsearch.compare`` (which imports it to write the page).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from hindsearch.report.env import environment
from hindsearch.report.runs import Run, is_compare_dir, load_run, sub_runs
from hindsearch.report.views import (MAX_SAMPLES_COMPARED, compare_view, run_view, shade_css, token_spans,
                                    turns_of)

__all__ = ["Run", "load_run", "render", "register", "shade_css", "token_spans", "turns_of", "write_report"]


def render(path: str | Path) -> str:
    """The HTML page of a run folder or a compare folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    compare, name = is_compare_dir(p), p.resolve().name
    if not compare and not any((p / f).exists() for f in ("metrics.jsonl", "summary.json", "config.toml")):
        raise ValueError(f"{p} is not a run or comparison folder (no metrics.jsonl, summary.json or config.toml)")
    if compare:
        title = f"hindsearch comparison: {name}"
        runs = [run_view(load_run(r), MAX_SAMPLES_COMPARED) for r in sub_runs(p)]
        cmp = compare_view(p)
    else:
        title = f"hindsearch run: {name}"
        runs, cmp = [run_view(load_run(p))], None
    return environment().get_template("report.html.j2").render(title=title, compare=cmp, runs=runs,
                                                                shades=shade_css())


REPORT_TITLES = ("<title>hindsearch run:", "<title>hindsearch comparison:")


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a page this command wrote (its title says so)."""
    try:
        with path.open("rb") as f:
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


# --------------------------------------------------------------------------- CLI
def _cmd_report(args: argparse.Namespace) -> int:
    out = write_report(args.run_dir, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def register(sub: Any) -> None:
    """Add the ``report`` subcommand."""
    p = sub.add_parser("report", help="static HTML report of a run or comparison folder")
    p.add_argument("run_dir", help="run folder (metrics.jsonl, samples.jsonl) or compare folder")
    p.add_argument("--out", default=None, help="output file (default RUN_DIR/report.html)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_report)
