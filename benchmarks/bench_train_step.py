"""Step-time breakdown of a training preset (default: tiny-cpu) per method.

For each method, the same starting policy (the cached warm-up checkpoint with ``--warmup``, else the
base model) trains ``--steps`` real GRPO steps through ``HindsearchGRPOTrainer``; the table shows the
median over steps of the time split logged in ``metrics.jsonl`` (rollout / reward / aux prepare /
update = forward+backward+optimizer incl. reference log-probs) and each method's step time relative
to grpo, all measured in one run.

    python benchmarks/bench_train_step.py --steps 3 --methods grpo,hindsearch,igsd [--warmup] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

AUX_KEYS = ("hind/", "igsd/")
DETAIL = {  # per method family: (column title, metrics key) of the aux cost table
    "hind": [("failed", "hind/failed"), ("critiques", "hind/critiques"), ("judge s", "hind/judge_time"),
             ("teacher s", "hind/teacher_time")],
    "igsd": [("failed", "igsd/failed"), ("verified", "igsd/positions_verified"), ("proposal s", "igsd/time_proposal"),
             ("complete s", "igsd/time_completion"), ("retrieve s", "igsd/time_retrieval"),
             ("score s", "igsd/time_scoring"), ("ret calls", "igsd/retrieval_calls"),
             ("cache hit", "igsd/cache_hit_rate"), ("util evals", "igsd/utility_evals")],
}
KEYS = ("time/rollout", "time/reward", "time/aux_prepare", "time/update", "time/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny-cpu")
    ap.add_argument("--methods", default="grpo")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", action="store_true", help="start from the (cached) warmed-up policy")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()

    import torch

    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.config import Config
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.train.cli import find_config
    from hindsearch.setup import load_records, resolve_data
    from hindsearch.train.run import build_trainer, ensure_on_disk, preflight

    from hindsearch.models import resolve_model

    cfg = resolve_model(Config.load(find_config(args.config), args.set))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        preflight(replace(copy.deepcopy(cfg), method=m))
    paths = resolve_data(cfg)
    train, _ = load_records(cfg, paths)
    retriever = load_retriever(cfg.retrieval, paths["index_dir"])
    name = cfg.model.name
    if args.warmup and cfg.warmup.enabled:
        from hindsearch.train.warmup import ensure_warmup

        model, tok = load_policy(cfg.model)
        name = str(ensure_warmup(cfg, model, tok, retriever, train, cache_dir() / "warmup"))
    root = Path(args.out or tempfile.mkdtemp(prefix="bench_train_step-"))
    results = {}
    for method in methods:
        c = copy.deepcopy(cfg)
        c.method, c.train.steps, c.train.save_steps = method, args.steps, 10**6
        # transformers 5 saves a checkpoint at the last step whatever save_steps is (weights + optimizer state:
        # ~18 GB per method at 3B); a step benchmark keeps nothing
        c.train.trl = {**c.train.trl, "save_strategy": "no"}
        torch.manual_seed(c.train.seed)
        model, tok = load_policy(replace(c.model, name=name, gguf_file=None if name != cfg.model.name else c.model.gguf_file))
        run = root / method.replace("+", "_")
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").unlink(missing_ok=True)
        ensure_on_disk(model, tok, run / "init")
        model.train()
        engine = RolloutEngine(model, tok, retriever, replace(c.rollout, backend="hf"), topk=c.retrieval.topk,
                               backend=HFBackend(model, tok))
        trainer = build_trainer(c, model, tok, engine, retriever, train, run)
        t0 = time.time()
        trainer.train()
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        results[method] = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in KEYS}
        results[method]["gen_tokens"] = statistics.median(r.get("rollout/generated_len", 0.0) for r in rows)
        results[method]["completion_len"] = statistics.median(r.get("rollout/completion_len", 0.0) for r in rows)
        results[method]["wall"] = time.time() - t0
        results[method]["aux"] = {k: statistics.median(r.get(k, 0.0) for r in rows)
                                  for k in sorted({k for r in rows for k in r if k.startswith(AUX_KEYS)})}
        del trainer, model, engine

    g = cfg.rollout.num_generations
    print(f"\n{args.config}: {cfg.model.name}{' (warmed up)' if name != cfg.model.name else ''}, "
          f"{cfg.train.questions_per_step} questions x {g} rollouts/step, {args.steps} steps/method, "
          f"torch threads {torch.get_num_threads()}; medians over steps, seconds")
    head = f"{'method':<16}{'rollout':>9}{'reward':>8}{'aux prep':>10}{'update':>8}{'step':>8}{'x grpo':>8}{'gen tok':>9}{'compl len':>10}"
    print(head + "\n" + "-" * len(head))
    base = results.get("grpo", {}).get("time/step")
    for m, r in results.items():
        ratio = f"{r['time/step'] / base:.2f}" if base else "-"
        print(f"{m:<16}{r['time/rollout']:>9.1f}{r['time/reward']:>8.3f}{r['time/aux_prepare']:>10.1f}"
              f"{r['time/update']:>8.1f}{r['time/step']:>8.1f}{ratio:>8}{r['gen_tokens']:>9.0f}{r['completion_len']:>10.0f}")
    for fam, cols in DETAIL.items():
        rows = [(m, r["aux"]) for m, r in results.items() if any(k.startswith(fam + "/") for k in r["aux"])]
        if not rows:
            continue
        head = f"{'method':<16}" + "".join(f"{c:>12}" for c, _ in cols) + f"{'s/failed':>10}"
        print(f"\n{fam} term, medians over steps (s/failed = (judge+teacher | proposal+completion+retrieval+scoring) per failed rollout)")
        print(head + "\n" + "-" * len(head))
        for m, a in rows:
            cost = sum(a.get(k, 0.0) for c, k in cols if c.endswith(" s"))
            per = cost / a[f"{fam}/failed"] if a.get(f"{fam}/failed") else float("nan")
            print(f"{m:<16}" + "".join(f"{a.get(k, 0.0):>12.2f}" for _, k in cols) + f"{per:>10.2f}")
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
