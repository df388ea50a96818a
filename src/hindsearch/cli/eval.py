"""``hindsearch eval``: evaluate a model on QA sets with Search-R1 rollouts (greedy by default).

Without ``--data`` the world's dev and test splits; without ``--index`` / ``--retrieval-url`` the
config's retriever. Writes ``OUT/summary.json``, ``OUT/results.md`` and ``OUT/trajectories.jsonl``;
a rerun with the same ``--out`` reuses rows only when the model, decoding, config, retriever and QA
files that made them are the same, and refuses naming what changed otherwise (``--fresh`` starts
anew).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hindsearch.cli.args import RETRIEVAL_URL, assembled, http_url, nonneg_int, positive_int


def parse_data_arg(spec: str) -> list[tuple[str, str]]:
    """``name=path[,name=path...]`` -> ``[(name, path)]`` (clear error on a bad item or a repeated
    name)."""
    out: list[tuple[str, str]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"--data item {item!r} must be name=path")
        name, path = (x.strip() for x in item.split("=", 1))
        if not name or not path:
            raise ValueError(f"--data item {item!r} must be name=path")
        if name in dict(out):
            raise ValueError(f"--data names benchmark {name!r} twice")
        out.append((name, path))
    if not out:
        raise ValueError("--data is empty")
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a model on QA benchmarks (EM/F1 table, resumable)",
                       description="Evaluate a model on QA benchmarks with Search-R1 rollouts "
                                   "(greedy by default): an EM/F1 table per benchmark in "
                                   "OUT/summary.json and OUT/results.md. A rerun with the "
                                   "same --out resumes and redoes the questions whose rows "
                                   "recorded an error.")
    p.add_argument("--model", help="alias (smollm2-135m, tiny-random), HF id or local path "
                                   "(default: config model.name)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--index",
                   help="index folder from `hindsearch index` (default: the config's retriever)")
    g.add_argument(RETRIEVAL_URL, type=http_url, metavar="URL",
                   help="Search-R1-compatible retrieval server URL, the config's retrieval.url "
                        "(default: the config's retriever)")
    p.add_argument("--data", action="append",
                   help="name=path[,name=path...] (repeatable); default: world dev,test")
    p.add_argument("--limit", type=positive_int,
                   help="questions per benchmark (default: eval.limit)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip and count malformed QA rows (each named on stderr) instead of "
                        "failing on the first")
    p.add_argument("--out", required=True, help="output folder (summary.json, results.md, "
                                                "trajectories.jsonl); reruns resume")
    p.add_argument("--config",
                   help="TOML file or shipped preset name (default: tiny-cpu, as for train)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch CPU threads (default: the config's train.threads, else 1 on a busy "
                        "machine or one of 2 cores or fewer, torch's otherwise)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. rollout.max_turns=2")
    p.add_argument("--batch-size", type=positive_int,
                   help="trajectories per batch (default: eval.batch_size)")
    p.add_argument("--sample", action="store_true",
                   help="sample with rollout.temperature/top_p instead of greedy")
    p.add_argument("--seed", type=nonneg_int, help="sampling seed (default: eval.seed)")
    p.add_argument("--fresh", action="store_true",
                   help="start --out anew: remove the rows of an earlier evaluation there instead "
                        "of reusing them (a rerun whose model, decoding, config, retriever or QA "
                        "files differ from the rows' is refused "
                        "without it)")
    p.add_argument("--keep-errors", action="store_true",
                   help="on a rerun, keep rows that recorded an error (e.g. retrieval server down) "
                        "instead of redoing them")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=cmd_eval)


def load_datasets(specs: list[tuple[str, str]], limit: int | None,
                  skip_bad: bool = False) -> dict[str, list[Any]]:
    from hindsearch.data.qa import load_qa_reporting as load_qa

    out = {}
    for name, path in specs:
        if not Path(path).exists():
            raise FileNotFoundError(f"--data {name}={path}: file not found")
        if Path(path).is_dir():
            raise IsADirectoryError(f"--data {name}={path}: is a folder; give a QA file (.jsonl, "
                                    ".json or .parquet)")
        out[name] = load_qa(path, name=name, limit=limit, skip_bad=skip_bad)
        if not out[name]:
            raise ValueError(f"--data {name}={path}: no questions in the file (an evaluation of 0 "
                             "questions means nothing)")
    return out


def cmd_eval(args: argparse.Namespace) -> int:
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.config import Config
    from hindsearch.eval import evaluate
    from hindsearch.models import load_policy
    from hindsearch.retrieval.factory import load_index
    from hindsearch.inputs import open_retriever, resolve_data
    # a file or a preset name, as train and compare take it
    from hindsearch.cli.train import find_config

    from hindsearch.eval import (EvalMismatch, config_record, full_record, model_identity,
                                 qa_file_record, refuse_message, reuse_problem)
    from hindsearch.fsutil import FolderLock, guard_output

    out = guard_output(args.out, "eval", "evaluation folder")

    # a second evaluation fails now, not after loading a model
    FolderLock(out, "evaluation folder").check()
    overrides = list(args.set)
    if args.model:
        overrides.append(f"model.name={json.dumps(args.model)}")
    if args.retrieval_url:
        overrides += ["retrieval.kind=remote", f"retrieval.url={json.dumps(args.retrieval_url)}"]
    # the preset train runs by default, as train takes it
    cfg = Config.load(find_config(args.config), overrides)
    assembled(cfg)  # every name checked, as train checks it
    limit = args.limit if args.limit is not None else cfg.eval.limit
    if args.data:
        specs = [s for spec in args.data for s in parse_data_arg(spec)]
    else:
        from hindsearch.data.world import ensure_world_for

        world = Path(ensure_world_for(cfg.data))
        specs = [("dev", str(world / "dev.jsonl")), ("test", str(world / "test.jsonl"))]
    datasets = load_datasets(specs, limit, args.skip_bad)
    if args.index:
        retriever = load_index(args.index)
    elif cfg.retrieval.kind == "remote" or cfg.retrieval.index_dir:
        retriever = open_retriever(cfg, {"index_dir": cfg.retrieval.index_dir})
    else:  # the world's index, built when missing, as train resolves it
        retriever = open_retriever(cfg, resolve_data(cfg))
    greedy = not args.sample and cfg.eval.greedy
    seed = args.seed if args.seed is not None else cfg.eval.seed
    record = {"model": model_identity(cfg.model.name, cfg.model.gguf_file), **config_record(cfg),
              "retriever": ({"index": str(Path(args.index).resolve()),
                             **qa_file_record(Path(args.index) / "index.json")} if args.index
                            else {"config": cfg.retrieval.kind, "url": cfg.retrieval.url,
                                  "index_dir": cfg.retrieval.index_dir}),
              "data": {name: qa_file_record(path) for name, path in specs}}
    record["retriever"].pop("path", None)
    if not args.fresh and (why := reuse_problem(out, full_record(record, greedy, seed))):
        raise EvalMismatch(refuse_message(out, why))  # before the model loads
    from hindsearch.models import set_threads

    set_threads(args.threads or cfg.train.threads)
    model, tok = load_policy(cfg.model)
    engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=cfg.retrieval.topk)
    res = evaluate(engine, datasets, out_dir=out, batch_size=args.batch_size or cfg.eval.batch_size,
                   greedy=greedy, seed=seed, progress=not args.no_progress,
                   redo_errors=not args.keep_errors, record=record, fresh=args.fresh)
    print(res["table"])
    print(f"\n{res['table_note']}")
    o = res["overall"]
    print(f"\nvalid questions {100 * o.get('validity_rate', 0):.1f}% | "
          f"invalid turns {100 * o.get('invalid_rate', 0):.1f}% | retrieval errors "
          f"{o.get('errors', 0)} | stop reasons {o.get('stop_reasons', {})}")
    print(f"wrote {out / 'summary.json'}, {out / 'results.md'} and {out / 'trajectories.jsonl'}")
    return 0
