"""``hindsearch report DIR``: the static HTML page of a run, evaluation, folder of runs or
comparison (``hindsearch.study.report`` renders it)."""

from __future__ import annotations

import argparse
from typing import Any

from hindsearch.study.report import write_report


def _cmd_report(args: argparse.Namespace) -> int:
    out = write_report(args.run_dir, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def register(sub: Any) -> None:
    """Add the ``report`` subcommand."""
    p = sub.add_parser("report",
                       help="static HTML report of a run, evaluation, runs or comparison folder")
    p.add_argument("run_dir", help="run folder (metrics.jsonl, samples.jsonl), evaluation folder "
                                   "(hindsearch eval --out), folder of runs, or compare folder")
    p.add_argument("--out", default=None, help="output file (default RUN_DIR/report.html)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_report)
