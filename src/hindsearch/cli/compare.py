"""``hindsearch compare``: train and evaluate several methods x seeds from one warmed-up checkpoint,
then write the report (the protocol is ``hindsearch.study.compare``'s)."""

from __future__ import annotations

import argparse
from typing import Any

from hindsearch.cli.args import assembled, positive_int
from hindsearch.cli.train import find_config
from hindsearch.study.compare import (METHOD_ALIASES, parse_methods, parse_seeds,
                                      parse_steps, run_compare)
from hindsearch.config import Config


def main_compare(args: argparse.Namespace) -> int:
    """Entry point of ``hindsearch compare`` (arguments defined in ``register``)."""
    # a TOML file or a shipped preset name, as for ``hindsearch train``
    config = str(find_config(args.config))
    # imports its plugins: their methods are valid --methods
    assembled(Config.load(config, args.overrides))
    methods, seeds = parse_methods(args.methods), parse_seeds(args.seeds)
    md = run_compare(config, methods, seeds, args.out, steps=args.steps, overrides=args.overrides,
                     mini=args.mini, test_limit=args.test_limit, mini_limit=args.mini_limit,
                     jobs=getattr(args, "jobs", 1), probe=getattr(args, "probe", 0),
                     sampled=getattr(args, "sampled", None) or 0,
                     states=getattr(args, "states", None) or 0,
                     eval_at=parse_steps(getattr(args, "eval_at", None) or ""))
    print(md)
    if not args.no_report:
        from hindsearch.study.report import write_report

        print(f"report: {write_report(args.out)}")
    return 0


def register(sub: Any) -> None:
    """Add the ``compare`` subcommand."""
    c = sub.add_parser("compare", help="train and evaluate several methods x seeds from one "
                                       "warmed-up checkpoint")
    c.add_argument("--config", default="tiny-cpu",
                   help="base config: a TOML file or a shipped preset name, as for 'hindsearch "
                        "train'")
    c.add_argument("--methods", default="grpo,hindsearch,hindsearch-nogold,igsd",
                   help="comma list of " + ", ".join(METHOD_ALIASES))
    c.add_argument("--seeds", default="0,1", help="comma list of training seeds")
    c.add_argument("--steps", type=positive_int, default=None,
                   help="RL steps per run (default: the preset's train.steps)")
    c.add_argument("--mini", default=None,
                   help="folder from 'hindsearch data mini' (adds the seven mini benchmarks)")
    c.add_argument("--mini-limit", type=positive_int, default=None,
                   help="questions per mini benchmark (default: the preset's eval.limit)")
    c.add_argument("--test-limit", type=positive_int, default=None,
                   help="world test questions (default: all)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run (repeatable)")
    c.add_argument("--out", required=True, help="comparison folder (resumable)")
    c.add_argument("--no-report", action="store_true", help="do not write DIR/report.html")
    c.add_argument("--jobs", type=positive_int, default=1,
                   help="runs trained at once; each trains with the thread count recorded with the "
                        "start (1), whatever --jobs")
    c.add_argument("--probe", type=positive_int, default=0, metavar="N",
                   help="probe the starting checkpoint on N failed training rollouts, into "
                        "DIR/probe.json, and each run's final checkpoint, into RUN/probe.json "
                        "(default: no probe)")
    c.add_argument("--sampled", type=positive_int, default=None, metavar="K",
                   help="also draw K samples per test question of each run at the rollout "
                        "temperature: sampled EM, pass@K, evidence recall (default: greedy only)")
    c.add_argument("--states", type=positive_int, default=None, metavar="N",
                   help="also measure each run on N held-out failed two-hop states of the start "
                        "(test split): sampled P(search again), bridge-query hit (default: none)")
    c.add_argument("--eval-at", default=None, metavar="STEPS",
                   help="comma list of steps after which each run is also evaluated greedily on "
                        "the world test split (EM along the way: sample efficiency; default: the "
                        "end only)")
    c.add_argument("--debug", action="store_true", help="show tracebacks")
    c.set_defaults(func=main_compare)
