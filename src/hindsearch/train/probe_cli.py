"""``hindsearch probe``: is the hindsight teacher of a checkpoint better than its student?

Runs ``hindsearch.hindsight.probe.run_probe`` on failed greedy training rollouts of one checkpoint and
writes ``probe.json`` + ``probe.md`` (one table) into ``--out`` (default: the checkpoint folder, or the
config's run folder when the checkpoint is the preset's warm-up).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    from hindsearch.cli import positive_int

    p = sub.add_parser(
        "probe", help="teacher probes: hint gain, query quality at the failed state, decision preference, token gaps",
        description="Answers, on N failed greedy training rollouts of a checkpoint, whether the hindsight teacher "
                    "(critique with/without gold, IGSD answer line, neutral control) is better than the student.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=None, help="TOML file or preset name (default: tiny-cpu)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="model folder to probe (default: the preset's warmed-up checkpoint, built and cached when missing)")
    p.add_argument("--n", type=positive_int, default=64, help="failed rollouts to probe")
    p.add_argument("--questions", type=positive_int, default=256, help="training questions rolled out to find them")
    p.add_argument("--samples", type=positive_int, default=4, help="samples per state for the decision probability")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one config field (repeatable)")
    p.add_argument("--out", default=None, help="output folder for probe.json / probe.md")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_probe)


def probe_checkpoint(cfg: Any, checkpoint: str | None, n: int = 64, questions: int = 256, samples: int = 4,
                     out: str | Path | None = None, log: Any = print,
                     loaded: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Load the checkpoint (or warm the preset up), probe it, write ``probe.json``; returns the result.
    ``loaded``: the checkpoint's model and tokenizer, when the caller has them (not loaded again)."""
    from dataclasses import replace

    from hindsearch.hindsight.probe import format_probe, run_probe, write_probe
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.setup import eval_engine, prepare
    from hindsearch.train.warmup import ensure_warmup, select_records

    setup = prepare(cfg)
    train, retriever = setup.train, setup.retriever
    if checkpoint is None:
        model, tok = load_policy(cfg.model)
        if cfg.warmup.enabled:
            checkpoint = str(ensure_warmup(cfg, model, tok, retriever, train, cache_dir() / "warmup"))
        else:
            checkpoint = cfg.model.name
    model, tok = loaded or load_policy(replace(cfg.model, name=str(checkpoint), gguf_file=None))
    model.eval()
    engine = eval_engine(cfg, model, tok, retriever)
    recs = select_records(train, questions, cfg.train.seed + 7)
    import torch

    with torch.no_grad():
        res = run_probe(engine, recs, cfg, n=n, samples=samples, seed=cfg.train.seed, log=log)
    res["checkpoint"] = str(checkpoint)
    where = Path(out) if out else (Path(checkpoint) if Path(checkpoint).is_dir() else Path(cfg.out))
    path = write_probe(res, guard_probe_out(where))
    log(format_probe(res))
    log(f"probe: {path} ({res['seconds']:.0f}s)")
    return res


def guard_probe_out(out: str | Path) -> Path:
    """Where ``probe.json`` / ``probe.md`` may go: a new or empty folder, a probe folder, or a folder hindsearch
    made that a probe belongs in (a model or checkpoint folder, a run or comparison folder, one with an earlier
    probe). Anything else (a user's folder, the current folder) is refused in one line, before the probe runs."""
    from hindsearch.fsutil import UnsafeOutput, check_replaceable, claim_output, output_kind

    def ours(f: Path) -> bool:
        kind = output_kind(f)
        legacy = (f / "config.json").exists() or (f / "probe.json").exists() or (f / "compare.json").exists()
        return kind in ("probe", "run", "compare") or (kind is None and legacy)

    if not str(out).strip():
        raise UnsafeOutput("--out is empty (it would write into the current folder); give a new folder")
    folder = check_replaceable(out, ours, "probe folder")
    if not folder.exists() or not any(folder.iterdir()):
        claim_output(folder, "probe")
    return folder


def _cmd_probe(args: argparse.Namespace) -> int:
    from hindsearch.config import Config
    from hindsearch.train.cli import find_config

    cfg = Config.load(find_config(args.config), args.set).validate()
    if args.out is not None:
        guard_probe_out(args.out)  # refused before anything is loaded or probed
    probe_checkpoint(cfg, args.checkpoint, n=args.n, questions=args.questions, samples=args.samples, out=args.out)
    return 0
