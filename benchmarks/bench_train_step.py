"""Step cost per method on identical rollouts, in process CPU time, interleaved (default preset: tiny-cpu).

Every method trains from the same starting policy (the cached warm-up checkpoint with ``--warmup``, else the base
model) through ``HindsearchGRPOTrainer``. A first, untimed GRPO run (``record``) rolls out each step's questions
and keeps the trajectories; every timed run then replays exactly those (``ReplayEngine``: the real engine, so
IGSD's matched completions still run, with ``rollout`` answered from the record). So the methods differ only in
their own work: the terms' ``prepare`` (judge, teacher, verification) and the update (forward, backward, the
terms' losses, optimizer). The runs are interleaved: ``--rounds`` rounds, the methods in the given order, then
in the opposite order, and so on; each run builds a fresh trainer from the same start.

Times are process CPU seconds (``time.process_time``: robust to other jobs on the machine, unlike wall clock),
split as the trainer splits a step: reward, aux prepare, update = the rest of the optimizer step. The
rollout is the record run's (identical for every method by construction) and counts in ``step``. Ratios are
against grpo's medians. The machine's load average is printed before and after.

    python benchmarks/bench_train_step.py --methods grpo,hindsearch,igsd --rounds 4            # base model
    python benchmarks/bench_train_step.py --methods grpo,hindsearch,igsd --rounds 2 --warmup   # warmed up
    python benchmarks/bench_train_step.py --real-rollouts --steps 3 ...   # each run rolls out for itself

With the base model (which never searches) HindSearch and IGSD have nothing to distil: their step must be GRPO's.
The first step of a run (global step 0) is a gradient-share step (``train.grad_share_steps``, default every 10th).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

AUX_KEYS = ("hind/", "igsd/")
DETAIL = {  # per method family: (column title, metrics key) of the aux cost table
    "hind": [("failed", "hind/failed"), ("eligible", "hind/eligible"), ("critiques", "hind/critiques"),
             ("distilled", "hind/distill_tokens"), ("judge s", "hind/judge_time"), ("teacher s", "hind/teacher_time")],
    "igsd": [("failed", "igsd/failed"), ("verified", "igsd/positions_verified"), ("proposal s", "igsd/time_proposal"),
             ("complete s", "igsd/time_completion"), ("retrieve s", "igsd/time_retrieval"),
             ("score s", "igsd/time_scoring"), ("ret calls", "igsd/retrieval_calls"),
             ("cache hit", "igsd/cache_hit_rate"), ("util evals", "igsd/utility_evals")],
}
PARTS = ("rollout", "reward", "aux_prepare")


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def replay_engine_class():
    """``RolloutEngine`` whose ``rollout`` answers from a record keyed by the call's question ids (filled by the
    first call for those ids: the record run), as deep copies, so every method trains on the same trajectories."""
    from hindsearch.agent.engine import RolloutEngine

    class ReplayEngine(RolloutEngine):
        record: dict[tuple, list] = {}
        misses = 0

        def rollout(self, records, num_generations=1, **kw):
            key = (tuple(r.id for r in records), num_generations, repr(sorted(kw.items())))
            if key not in ReplayEngine.record:
                ReplayEngine.misses += 1
                ReplayEngine.record[key] = super().rollout(records, num_generations, **kw)
            return copy.deepcopy(ReplayEngine.record[key])

    return ReplayEngine


class CPUParts:
    """Process CPU time of each optimizer step and of the trainer's timed parts in it (``trainer.timer.part``)."""

    def __init__(self, trainer: Any) -> None:
        from transformers import TrainerCallback

        self.steps: list[dict[str, float]] = []
        self.cur: dict[str, float] = {}
        timer, parts = trainer.timer, self
        wall_part = timer.part

        @contextmanager
        def part(name: str):
            c0 = time.process_time()
            try:
                with wall_part(name):
                    yield
            finally:
                parts.cur[name] = parts.cur.get(name, 0.0) + time.process_time() - c0

        timer.part = part

        class Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                parts.cur = dict.fromkeys(PARTS, 0.0)
                parts.c0 = time.process_time()

            def on_step_end(self, args, state, control, **kwargs):
                row = dict(parts.cur)
                row["step"] = time.process_time() - parts.c0
                row["update"] = row["step"] - sum(row[k] for k in PARTS)
                parts.steps.append(row)

        trainer.add_callback(Cb())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny-cpu")
    ap.add_argument("--methods", default="grpo,hindsearch,igsd")
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps per run")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of runs: the methods in order, then reversed, ...")
    ap.add_argument("--warmup", action="store_true", help="start from the (cached) warmed-up policy")
    ap.add_argument("--real-rollouts", action="store_true",
                    help="each run rolls out for itself (no record run; rollouts then differ between methods)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default=None, help="keep the runs and results.json here (default: a temporary folder)")
    args = ap.parse_args(argv)

    import torch

    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.config import Config
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.inputs import load_records, resolve_data
    from hindsearch.cli.train import find_config
    from hindsearch.train.run import build_trainer, ensure_on_disk, preflight

    load_before = load_average()
    cfg = Config.load(find_config(args.config), args.set)
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
        del model
    root = Path(args.out or tempfile.mkdtemp(prefix="bench_train_step-"))
    Engine = RolloutEngine if args.real_rollouts else replay_engine_class()

    def one_run(method: str, tag: str) -> dict[str, Any]:
        c = copy.deepcopy(cfg)
        c.method, c.train.steps, c.train.save_steps = method, args.steps, 10**6
        # transformers 5 saves a checkpoint at the last step whatever save_steps is (weights + optimizer state:
        # ~18 GB per method at 3B); a step benchmark keeps nothing
        c.train.trl = {**c.train.trl, "save_strategy": "no"}
        torch.manual_seed(c.train.seed)
        model, tok = load_policy(replace(c.model, name=name, gguf_file=None if name != cfg.model.name else c.model.gguf_file))
        run = root / tag
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").unlink(missing_ok=True)
        ensure_on_disk(model, tok, run / "init")
        model.train()
        engine = Engine(model, tok, retriever, replace(c.rollout, backend="hf"), topk=c.retrieval.topk,
                        backend=HFBackend(model, tok))
        trainer = build_trainer(c, model, tok, engine, train, run)
        cpu = CPUParts(trainer)
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        out = {"method": method, "tag": tag, "wall": wall, "cpu_steps": cpu.steps,
               "gen_tokens": statistics.median(r.get("rollout/generated_len", 0.0) for r in rows),
               "completion_len": statistics.median(r.get("rollout/completion_len", 0.0) for r in rows),
               "reward": statistics.median(r.get("rollout/reward_mean", 0.0) for r in rows),
               "aux": {k: statistics.median(r.get(k, 0.0) for r in rows)
                       for k in sorted({k for r in rows for k in r if k.startswith(AUX_KEYS)})}}
        del trainer, model, engine, cpu
        gc.collect()
        return out

    record = None if args.real_rollouts else one_run("grpo", "record")
    if record:
        Engine.misses = 0  # from here on, a rollout not in the record is a miss (the timed runs must replay)
    order, runs = [], []
    for r in range(args.rounds):
        order += methods if r % 2 == 0 else methods[::-1]
    for i, m in enumerate(order):
        res = one_run(m, f"{i:02d}-{m.replace('+', '_')}")
        runs.append(res)
        print(f"run {i + 1}/{len(order)} {m}: update {sum(s['update'] for s in res['cpu_steps']):.2f} CPU s, "
              f"aux prepare {sum(s['aux_prepare'] for s in res['cpu_steps']):.2f}, load {load_average()}", flush=True)
    load_after = load_average()

    def per_run(res: dict[str, Any], key: str) -> float:
        return sum(s[key] for s in res["cpu_steps"]) / max(len(res["cpu_steps"]), 1)  # per step

    rollout = (statistics.median(s["rollout"] for s in record["cpu_steps"]) if record else None)
    table: dict[str, dict[str, Any]] = {}
    for m in methods:
        rs = [x for x in runs if x["method"] == m]
        med = {k: statistics.median(per_run(x, k) for x in rs) for k in ("reward", "aux_prepare", "update", "step")}
        med["update_all"] = [round(per_run(x, "update"), 2) for x in rs]
        med["step_shared"] = (rollout + med["reward"] + med["aux_prepare"] + med["update"]) if record else med["step"]
        med["wall"] = statistics.median(x["wall"] for x in rs)
        med["aux"] = {k: statistics.median(x["aux"].get(k, 0.0) for x in rs) for k in rs[0]["aux"]}
        med["gen_tokens"], med["completion_len"] = rs[0]["gen_tokens"], rs[0]["completion_len"]
        med["reward_mean"] = rs[0]["reward"]
        table[m] = med

    g = cfg.rollout.num_generations
    base = table.get("grpo")
    print(f"\n{args.config}: {cfg.model.name}{' (warmed up)' if name != cfg.model.name else ' (base)'}, "
          f"{cfg.train.questions_per_step} questions x {g} rollouts/step, {args.steps} step(s)/run, "
          f"{'own' if args.real_rollouts else 'identical (replayed)'} rollouts, {args.rounds} interleaved rounds "
          f"({len(order) // max(len(methods), 1)} runs/method), torch threads {torch.get_num_threads()}, "
          f"load average {load_before} before, {load_after} after")
    if record:
        print(f"rollout (the record run's, shared by every method): {rollout:.2f} CPU s/step; "
              f"rollouts not in the record (timed runs): {Engine.misses}")
    print("process CPU seconds per step, medians over runs; step = rollout + reward + aux prepare + update")
    head = (f"{'method':<16}{'aux prep':>10}{'update':>9}{'x grpo':>8}{'step':>9}{'x grpo':>8}{'added':>8}"
            f"{'gen tok':>9}{'reward':>8}  update per run")
    print(head + "\n" + "-" * (len(head) + 20))
    for m, r in table.items():
        ux = f"{r['update'] / base['update']:.3f}" if base else "-"
        sx = f"{r['step_shared'] / base['step_shared']:.3f}" if base else "-"
        added = f"{r['aux_prepare'] + r['update'] - base['aux_prepare'] - base['update']:+.2f}" if base else "-"
        print(f"{m:<16}{r['aux_prepare']:>10.2f}{r['update']:>9.2f}{ux:>8}{r['step_shared']:>9.2f}{sx:>8}{added:>8}"
              f"{r['gen_tokens']:>9.0f}{r['reward_mean']:>8.2f}  {r['update_all']}")
    for fam, cols in DETAIL.items():
        rows = [(m, r["aux"]) for m, r in table.items() if any(k.startswith(fam + "/") for k in r["aux"])]
        if not rows:
            continue
        head = f"{'method':<16}" + "".join(f"{c:>12}" for c, _ in cols)
        print(f"\n{fam} term, medians over runs (the term's own timers, ' s' columns: wall seconds)")
        print(head + "\n" + "-" * len(head))
        for m, a in rows:
            print(f"{m:<16}" + "".join(f"{a.get(k, 0.0):>12.2f}" for _, k in cols))
    (root / "results.json").write_text(json.dumps({"args": vars(args), "load_before": load_before,
                                                   "load_after": load_after, "record": record, "runs": runs,
                                                   "table": table}, indent=1))
    print(f"runs: {root}")


if __name__ == "__main__":
    main()
