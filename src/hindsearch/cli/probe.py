"""``hindsearch probe``: is the hindsight teacher of a checkpoint better than its student?
(``hindsearch.study.probe`` runs it and writes ``probe.json`` + ``probe.md``.)"""

from __future__ import annotations

import argparse

from hindsearch.cli.args import positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe", help="teacher probes: hint gain, query quality at the failed state, decision "
                      "preference, token gaps",
        description="Answers, on N failed greedy training rollouts of a checkpoint, whether the "
                    "hindsight teacher (critique with/without gold, IGSD answer line, neutral "
                    "control) is better than the student.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=None, help="TOML file or preset name (default: tiny-cpu)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="model folder to probe (default: the preset's warmed-up checkpoint, built "
                        "and cached when missing)")
    p.add_argument("--n", type=positive_int, default=64, help="failed rollouts to probe")
    p.add_argument("--questions", type=positive_int, default=256,
                   help="training questions rolled out to find them")
    p.add_argument("--samples", type=positive_int, default=4,
                   help="samples per state for the decision probability")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config field (repeatable)")
    p.add_argument("--out", default=None, help="output folder for probe.json / probe.md")
    p.add_argument("--igsd", action="append", default=None, metavar="SETTING",
                   help="run only IGSD's proposal-and-gate probe under this [igsd] setting "
                        "('key=value,key=value'; '' = the config as it is), on sampled rollouts as "
                        "a training step draws them; repeatable, "
                        "one table row each (igsd.json / igsd.md)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_probe)


def _cmd_probe(args: argparse.Namespace) -> int:
    from hindsearch.cli.train import find_config
    from hindsearch.config import Config
    from hindsearch.cli.args import assembled
    from hindsearch.study.probe import guard_probe_out, probe_checkpoint

    cfg = assembled(Config.load(find_config(args.config), args.set))
    if args.out is not None:
        guard_probe_out(args.out)  # refused before anything is loaded or probed
    probe_checkpoint(cfg, args.checkpoint, n=args.n, questions=args.questions, samples=args.samples,
                     out=args.out, igsd_settings=args.igsd)
    return 0
