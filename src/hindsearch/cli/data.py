"""Data commands: ``hindsearch world`` (the fictional world, cached by seed, size and generator
version) and ``hindsearch data fetch|mini`` (the paper-scale QA sets and index from the Hub; the
mini-wiki and its seven benchmarks from local real-data slices)."""

from __future__ import annotations

import argparse
import json
import time

from hindsearch.cli.args import http_url, nonneg_int, positive_float, positive_int
from hindsearch.data.fetch import WHAT


def cmd_world(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hindsearch.data.world import ensure_world, generate_world, world_is_current, write_world
    from hindsearch.fsutil import check_replaceable, json_marker, publish, staging

    out = Path(args.out)
    cached = world_is_current(out, args.seed, args.entities) and not args.force
    # a rebuild replaces the folder: only a world folder (world.json) or an empty one
    if not cached:
        check_replaceable(out, json_marker("world.json", "generator_version"), "world folder")
    t0 = time.perf_counter()
    if args.force:
        with staging(out) as tmp:
            write_world(generate_world(args.seed, args.entities), tmp)
            publish(tmp, out)
    else:
        ensure_world(out, seed=args.seed, n_entities=args.entities)
    dt = time.perf_counter() - t0
    meta = json.loads((out / "world.json").read_text())
    c = meta["counts"]
    print(f"world (seed {meta['seed']}, {meta['n_entities']} entities) in {out}: "
          + ("cached, not rebuilt" if cached else f"built in {dt:.2f} s"))
    print(f"passages: {c['passages']}")
    for split in ("train", "dev", "test"):
        s = c[split]
        print(f"{split:<6} {s['questions']:>5} questions ({s['one_hop']} one-hop, {s['two_hop']} "
              "two-hop)")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from hindsearch.data.fetch import fetch
    from hindsearch.retrieval.dense import faiss_shape

    fetch(args.what, args.out, endpoint=args.endpoint, verify=not args.no_verify,
          etag_timeout=args.connect_timeout, index_shape=faiss_shape)
    return 0


def cmd_mini(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hindsearch.data.mini import build_mini
    from hindsearch.fsutil import claim_output, guard_output

    if not Path(args.shared).is_dir():
        raise FileNotFoundError(f"--shared {args.shared}: folder not found")
    # the files are written in place: only into a new or empty folder, or an earlier mini-wiki
    out = guard_output(args.out, "mini", "mini-wiki folder", protect=(args.shared,))
    created = not out.exists()
    claim_output(out, "mini")
    try:
        build_mini(args.shared, out, dev_fraction=args.dev_fraction)
    except BaseException:
        if created:  # a failed first build leaves nothing behind
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("world",
                       help="build the fictional world (corpus + train/dev/test questions)",
                       description="Build the fictional world: corpus.jsonl and "
                                   "train/dev/test.jsonl (cached; an existing "
                                   "--out is replaced only when it is a world folder or empty).")
    w.add_argument("--out", required=True, help="output folder (new, empty, or an earlier world)")
    w.add_argument("--seed", type=nonneg_int, default=0, help="generator seed")
    w.add_argument("--entities", type=positive_int, default=None,
                   help="number of entities, at least 40 (default: about 2,000, one passage each)")
    w.add_argument("--force", action="store_true",
                   help="rebuild even when the folder is up to date")
    w.set_defaults(func=cmd_world)

    d = sub.add_parser("data", help="real QA data: fetch from the HF hub, or build the mini-wiki")
    dsub = d.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    d.set_defaults(func=lambda a: (d.print_help(), 2)[1])
    f = dsub.add_parser("fetch",
                        help="download train / test sets / wiki-18 / its e5 index (needs network)",
                        description="Download the Search-R1 training set, the seven FlashRAG test "
                                    "sets, the wiki-18 corpus or Search-R1's prebuilt e5 FAISS "
                                    "index from the Hugging Face hub with huggingface_hub "
                                    "(cached by ETag, dropped connections resumed, HF_TOKEN for "
                                    "auth, HF_HUB_OFFLINE=1 for what is on disk already). Row "
                                    "counts are checked and each file's commit is "
                                    "recorded in OUT/fetch.json.")
    f.add_argument("--what", choices=WHAT, default="test",
                   help="train: nq_hotpotqa_train/{train,test}.parquet; test: the 7 FlashRAG "
                        "benchmark files; wiki18: wiki18/wiki-18.jsonl.gz (21M passages); e5index: "
                        "wiki18/e5_Flat.index (about 65 GB); all: everything")
    f.add_argument("--out", required=True, help="output folder (one subfolder per dataset)")
    f.add_argument("--endpoint", type=http_url, default=None,
                   help="hub URL (default: $HF_ENDPOINT, else https://huggingface.co)")
    f.add_argument("--connect-timeout", type=positive_float, default=10.0,
                   help="seconds to wait for the hub's answer about each file (HF_HUB_ETAG_TIMEOUT "
                        "overrides it)")
    f.add_argument("--no-verify", action="store_true", help="skip the row-count check")
    f.set_defaults(func=cmd_fetch)
    m = dsub.add_parser("mini", help="build the mini-wiki corpus and seven benchmark files from "
                                     "local slices")
    m.add_argument("--shared", required=True,
                   help="folder of real data slices: the files docs/data.md lists (corpus slices, "
                        "benchmark test sets, HotpotQA/MuSiQue train slices); a missing one is "
                        "skipped and named")
    m.add_argument("--out", required=True,
                   help="output folder (new, empty, or an earlier mini-wiki)")
    m.add_argument("--dev-fraction", type=float, default=0.1,
                   help="share of the kept training questions written to dev.jsonl (the rest to "
                        "train.jsonl)")
    m.set_defaults(func=cmd_mini)
