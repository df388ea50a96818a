"""Behaviour fingerprint of the package, to hold a refactoring against: same inputs, same outputs.

    python benchmarks/equivalence.py --model MODEL_DIR --world WORLD_DIR --out before.json
    # ... change the code ...
    python benchmarks/equivalence.py --model MODEL_DIR --world WORLD_DIR --out after.json
    python benchmarks/equivalence.py --diff before.json after.json

``MODEL_DIR`` is a model that follows the protocol (so rollouts search, read and answer, and the hindsight terms
have search actions to distil): a warm-up output folder of a micro preset, say. ``WORLD_DIR`` is a world folder
with ``test.jsonl``, ``train.jsonl`` and ``index-bm25/`` (``hindsearch world`` + ``hindsearch index``).

What it records (one JSON file; ``--diff`` prints what changed, part by part, and exits 1 on any change):

- ``greedy``: every field of greedy trajectories on ``--questions`` test questions (ids, masks, spans, docs,
  log-probs, answers, stop reasons), run through the rollout engine as ``hindsearch eval`` runs it;
- ``sampled``: the same questions sampled (seed 0, 2 per question): per-trajectory digests (these may change if
  the decode loop draws in another order) and their EM / searches / length distribution;
- ``train/<method>``: two steps of ``hindsearch train`` for grpo, hindsearch, igsd and hindsearch+igsd (oracle
  judge, no warm-up): every ``metrics.jsonl`` value except timings and memory, and the sha256 of the final
  weights, tensor by tensor;
- ``cli``: every subcommand's ``--help`` text, and the retrieval server's ``/openapi.json``.

Run it with one torch thread (``OMP_NUM_THREADS=1``); it takes a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

METHODS = ("grpo", "hindsearch", "igsd", "hindsearch+igsd")
VOLATILE = ("time", "memory/", "perf/", "rss", "samples_per_second", "steps_per_second")
"""Metric keys holding any of these words are timings or memory: left out of the fingerprint."""


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rollouts(model_dir: str, world: Path, n: int, sets: list[str] | None = None) -> dict[str, Any]:
    import torch

    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.config import Config
    from hindsearch.data.qa import load_qa
    from hindsearch.models import load_policy
    from hindsearch.retrieval.factory import load_index

    cfg = Config.load(None, [f'model.name="{model_dir}"', 'model.device="cpu"', "rollout.max_turns=3",
                             "rollout.max_new_tokens_per_turn=48", "rollout.max_total_tokens=1024",
                             "rollout.temperature=0.7", *(sets or [])])
    torch.manual_seed(0)
    model, tok = load_policy(cfg.model)
    retriever = load_index(world / "index-bm25")
    records = load_qa(world / "test.jsonl")[:n]
    engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=2)
    greedy = [asdict(t) for t in engine.rollout(records, greedy=True)]
    sampled = engine.rollout(records, num_generations=2, seed=0)
    lengths = [len(t.completion_ids) for t in sampled]
    return {
        "greedy": {"digest": digest(greedy), "trajectories": greedy},
        "sampled": {
            "digests": [digest(asdict(t)) for t in sampled],
            "em_mean": statistics.fmean(t.em for t in sampled),
            "searches_mean": statistics.fmean(sum(1 for x in t.turns if x.action == "search") for t in sampled),
            "length_mean": statistics.fmean(lengths),
            "length_median": statistics.median(lengths),
        },
    }


def weights_sha(folder: Path) -> str:
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        sd = load_file(str(f))
        for k in sorted(sd):
            h.update(k.encode())
            h.update(str(sd[k].dtype).encode() + str(tuple(sd[k].shape)).encode())
            h.update(sd[k].contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def train(model_dir: str, world: Path, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method in METHODS:
        run = tmp / method.replace("+", "_")
        sets = [f'method="{method}"', f'model.name="{model_dir}"', 'model.device="cpu"', f'data.train="{world}/train.jsonl"',
                f'data.dev="{world}/dev.jsonl"', f'retrieval.index_dir="{world}/index-bm25"',
                'retrieval.kind="bm25"', "retrieval.topk=2", "rollout.max_turns=3", "rollout.max_new_tokens_per_turn=48",
                "rollout.max_total_tokens=1024", "rollout.temperature=0.7", "rollout.num_generations=4",
                "warmup.enabled=false", "train.steps=2", "train.questions_per_step=2", "train.save_steps=2",
                "train.lr=2e-5", "train.kl_coef=0.0", "train.eval_limit=4", "train.samples_per_step=4",
                'hindsearch.judge_kind="oracle"', "hindsearch.lam=2.0", 'hindsearch.distill_on="decision_query"',
                "igsd.lam=1.0", "igsd.max_positions_per_rollout=1", "igsd.n_controls=1", "igsd.max_query_tokens=24"]
        cmd = [sys.executable, "-m", "hindsearch.cli", "train", "--out", str(run), "--threads", "1"]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"train {method} failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
        rows = []
        for line in (run / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            rows.append({k: v for k, v in sorted(r.items()) if not any(w in k for w in VOLATILE)})
        out[method] = {"metrics": rows, "final_weights": weights_sha(run / "final"),
                       "summary_dev": json.loads((run / "summary.json").read_text()).get("dev")}
    return out


def cli_texts() -> dict[str, Any]:
    from hindsearch.cli import build_parser

    parser = build_parser()
    texts = {"hindsearch": parser.format_help()}
    for action in parser._subparsers._group_actions:  # noqa: SLF001 - argparse keeps its subparsers here
        for name, sub in action.choices.items():
            texts[name] = sub.format_help()
            for a in sub._actions:  # noqa: SLF001
                choices = getattr(a, "choices", None)
                for n2, s2 in (choices.items() if isinstance(choices, dict) else ()):
                    if hasattr(s2, "format_help"):
                        texts[f"{name} {n2}"] = s2.format_help()
    from hindsearch.retrieval.server import create_app

    class _Null:
        def retrieve(self, queries, k):
            return [[] for _ in queries]

    app = create_app(_Null(), docs=True)
    texts["/openapi.json"] = json.dumps(app.openapi(), sort_keys=True, indent=1)
    return texts


def diff(a: dict[str, Any], b: dict[str, Any]) -> int:
    bad = 0
    for part in sorted(set(a) | set(b)):
        x, y = a.get(part), b.get(part)
        if x == y:
            print(f"{part:28s} identical")
            continue
        if part == "sampled" and x and y:
            same = sum(p == q for p, q in zip(x["digests"], y["digests"]))
            print(f"{part:28s} {same}/{len(x['digests'])} trajectories identical; "
                  + ", ".join(f"{k} {x[k]:.3f} -> {y[k]:.3f}" for k in x if k != "digests"))
            bad += 1
            continue
        bad += 1
        if isinstance(x, dict) and isinstance(y, dict):
            keys = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
            print(f"{part:28s} CHANGED: {', '.join(keys)[:300]}")
            if part.startswith("train/") and "metrics" in keys:
                for i, (r, s) in enumerate(zip(x.get("metrics", []), y.get("metrics", []))):
                    ks = [k for k in sorted(set(r) | set(s)) if not _close(r.get(k), s.get(k))]
                    for k in ks[:12]:
                        print(f"    step {i + 1} {k}: {r.get(k)} -> {s.get(k)}")
        else:
            print(f"{part:28s} CHANGED")
    return 1 if bad else 0


def _close(u: Any, v: Any) -> bool:
    if isinstance(u, float) and isinstance(v, float):
        return u == v or (math.isnan(u) and math.isnan(v))
    return u == v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a protocol-following model folder")
    ap.add_argument("--world", help="a world folder with test.jsonl, train.jsonl and index-bm25/")
    ap.add_argument("--out", help="the JSON file to write")
    ap.add_argument("--questions", type=int, default=24, help="test questions rolled out (greedy and sampled)")
    ap.add_argument("--parts", default="rollouts,train,cli", help="comma-separated: rollouts, train, cli")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override of the rollouts part (e.g. rollout.sampler=inverse_cdf), applied last")
    ap.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two fingerprints")
    args = ap.parse_args(argv)
    if args.diff:
        a, b = (json.loads(Path(p).read_text()) for p in args.diff)
        return diff(a, b)
    if not (args.out and ("cli" == args.parts or (args.model and args.world))):
        ap.error("--out, --model and --world are needed (or --diff)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["COLUMNS"] = "100"  # argparse wraps --help to the terminal width
    parts = set(args.parts.split(","))
    world = Path(args.world).resolve() if args.world else Path()
    model = str(Path(args.model).resolve()) if args.model else ""
    result: dict[str, Any] = {}
    if "cli" in parts:
        result["cli"] = cli_texts()
    if "rollouts" in parts:
        result.update(rollouts(model, world, args.questions, args.set))
    if "train" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            for k, v in train(model, world, Path(tmp)).items():
                result[f"train/{k}"] = v
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
    print(f"wrote {args.out}: " + ", ".join(f"{k} {digest(v)}" for k, v in sorted(result.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
