"""The distillation-only check of HindSearch's mechanism (issue 21, part 1): can the term alone move the student?

From one starting checkpoint (the preset's shared warm-up), each arm trains with GRPO's loss scaled to 0
(``train.grpo_scale = 0``) and the HindSearch term alone, and every ``--every`` steps the checkpoint is measured on
**held-out** states: the starting checkpoint's greedy failures on the *test* split's two-hop questions, cut right
after their first information block (the same states for every arm, seed and step, so the curves are paired).

Arms (``--arms``):
* ``gold``     - the oracle critique with the gold answer (the method);
* ``nogold``   - the critique without gold (carries no information: the clean control);
* ``shuffled`` - the gold critique of *another* question (``hindsearch.critique_source = shuffled``): the same
  prompt shift and the same extra gradient at the same positions, without this question's information.

Per checkpoint (``curve.jsonl``, one row per arm, seed and step; the table at the end):
* ``p_search``   - sampled P(search again) from the held-out states (``--samples`` per state, temperature 1);
* ``greedy_search_again``, ``hit_missed`` - the greedy continuation searches again / its next query retrieves the
  evidence passage the first search missed (the bridge-query hit rate, per state);
* ``hit_given_search`` - hit_missed among the states whose greedy continuation searched;
* ``em_from_state`` and the greedy two-hop EM on ``--em-questions`` test two-hop questions (full rollouts).

Usage (one torch thread per process; resumable: finished (arm, seed) runs and measured steps are skipped):

    OMP_NUM_THREADS=1 python benchmarks/distill_check.py --config recipes/micro/micro-mech.toml \\
        --arms gold,nogold,shuffled --seeds 0,1,2 --steps 60 --every 20 --out runs/distill-check

``--set KEY=VALUE`` overrides the arms' training config (e.g. ``hindsearch.lam=2``); the defaults are the
decision-only term at lambda 2 (``hindsearch.distill_on = decision``), the setting of the issue's pilot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from hindsearch.study.sampled import load_engine

ARMS = {
    "gold": ["hindsearch.judge_sees_gold=true", 'hindsearch.critique_source="own"'],
    "nogold": ["hindsearch.judge_sees_gold=false", 'hindsearch.critique_source="own"'],
    "shuffled": ["hindsearch.judge_sees_gold=true", 'hindsearch.critique_source="shuffled"'],
}
DEFAULT_SET = ['method="hindsearch"', "train.grpo_scale=0.0", "hindsearch.lam=2.0", 'hindsearch.distill_on="decision"',
               "train.eval_steps=0", "train.grad_share_steps=0", "train.trl.save_total_limit=1000"]


def states_of_start(cfg: Any, init: str, n: int, out: Path, log: Any) -> tuple[Any, list, Any]:
    """``(held-out states, test two-hop records, index_dir, test records)``: the start's greedy failures on the test split's
    two-hop questions (``hindsearch.study.probe.held_out_states``), saved to ``out/states.json`` once."""
    import torch

    from hindsearch.study.compare import eval_sets
    from hindsearch.study.probe import HeldOutStates, held_out_states

    _, test, index_dir = eval_sets(cfg, None, None, None)[0]
    two = [r for r in test if r.hops == 2]
    path = out / "states.json"
    if path.exists():
        return HeldOutStates.from_dict(json.loads(path.read_text()), test), two, index_dir, test
    with torch.no_grad():
        st = held_out_states(load_engine(cfg, init, index_dir), two, n)
    path.write_text(json.dumps(st.to_dict()))
    log(f"held-out states: {len(st.records)} greedy two-hop failures with a first information block "
        f"(of {len(two)} test two-hop questions)")
    return st, two, index_dir, test


def measure(cfg: Any, checkpoint: str, st: Any, two: list, index_dir: Any, samples: int, em_questions: int,
            seed: int, one_hop: list | None = None) -> dict[str, float]:
    """The held-out numbers of one checkpoint (see the module docstring); with ``one_hop`` records also their
    greedy EM (``one_hop_em``: does the decision term cost the questions that need no second search?)."""
    import torch

    from hindsearch.study.probe import state_measures, summarize_states

    engine = load_engine(cfg, checkpoint, index_dir)
    with torch.no_grad():
        s = summarize_states(state_measures(engine, st, samples, seed))
        em = statistics.fmean(t.em for t in engine.rollout(two[:em_questions], greedy=True)) if em_questions else 0.0
        extra = {"one_hop_em": statistics.fmean(t.em for t in engine.rollout(one_hop, greedy=True))} if one_hop else {}
    return {**extra, "p_search": s["p_search"], "greedy_search_again": s["search_again"], "hit_missed": s["hit_missed"],
            "hit_given_search": s["hit_given_search"], "em_from_state": s["em"], "two_hop_em": em}


def _done_rows(path: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[(r["arm"], r["seed"], r["step"])] = r
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Mean ± standard deviation over seeds, per arm and step (rates in %)."""
    keys = ("p_search", "greedy_search_again", "hit_missed", "hit_given_search", "em_from_state", "two_hop_em",
            "one_hop_em")
    head = "| arm | step | seeds | " + " | ".join(keys) + " |"
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["arm"], r["step"]), []).append(r)
    for (arm, step), g in sorted(groups.items(), key=lambda kv: (kv[0][0] != "start", kv[0][0], kv[0][1])):
        cells = []
        for k in keys:
            xs = [100 * r[k] for r in g if k in r]
            if not xs:
                cells.append("-")
                continue
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            cells.append(f"{statistics.fmean(xs):.1f} ± {sd:.1f}" if len(xs) > 1 else f"{xs[0]:.1f}")
        out.append(f"| {arm} | {step} | {len(g)} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--config", default="recipes/micro/micro-mech.toml")
    ap.add_argument("--arms", default="gold,nogold,shuffled")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20, help="measure every N steps (checkpoints are saved at these)")
    ap.add_argument("--states", type=int, default=64, help="held-out failed states")
    ap.add_argument("--samples", type=int, default=4, help="samples per state for P(search again)")
    ap.add_argument("--em-questions", type=int, default=300, help="test two-hop questions for the greedy EM")
    ap.add_argument("--one-hop-questions", type=int, default=150,
                    help="test one-hop questions for the greedy one-hop EM of the start and each final checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", default="runs/distill-check")
    ap.add_argument("--skip-start", action="store_true",
                    help="do not measure the start (a second worker beside one that does, on the same --out)")
    args = ap.parse_args(argv)

    from hindsearch.study.compare import shared_warmup
    from hindsearch.config import Config
    from hindsearch.train.run import run_train

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        ap.error(f"--arms: unknown {bad} (choose from {', '.join(ARMS)})")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    from hindsearch.study.compare import START_THREADS
    from hindsearch.models import torch_threads

    base = Config.load(args.config)
    with torch_threads(START_THREADS):  # the start compare builds, on any machine
        init = shared_warmup(base, out)
    if init is None:
        ap.error("the preset has no warm-up: the check starts from the shared warmed-up checkpoint")
    curve = out / "curve.jsonl"
    done = _done_rows(curve)
    st = states_of_start(base, init, args.states, out, print)

    def record(arm: str, seed: int, step: int, ckpt: str) -> None:
        if (arm, seed, step) in done:
            return
        t0 = time.time()
        states, two, index_dir, test = st
        one = [r for r in test if r.hops == 1][: args.one_hop_questions] if step in (0, args.steps) else None
        row = {"arm": arm, "seed": seed, "step": step,
               **measure(base, ckpt, states, two, index_dir, args.samples, args.em_questions, seed, one),
               "seconds": time.time() - t0, "checkpoint": ckpt}
        with curve.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[(arm, seed, step)] = row
        print(f"{arm} seed {seed} step {step}: " + ", ".join(f"{k} {100 * v:.1f}" for k, v in row.items()
                                                             if isinstance(v, float) and k != "seconds"), flush=True)

    from hindsearch.models import weights_digest

    print(f"start: {init} (weights sha256 {weights_digest(init)})", flush=True)
    for seed in seeds if not args.skip_start else ():
        record("start", seed, 0, init)
    for arm in arms:
        for seed in seeds:
            rd = out / f"{arm}-s{seed}"
            if not (rd / "final" / "config.json").exists():
                ov = DEFAULT_SET + ARMS[arm] + args.set + [
                    f"train.seed={seed}", f"train.steps={args.steps}", f"train.save_steps={args.every}",
                    f'model.name="{Path(init).as_posix()}"', "warmup.enabled=false", f'out="{rd.as_posix()}"']
                t0 = time.time()
                if (rd / "config.toml").exists():
                    run_train(None, resume=rd)
                else:
                    run_train(Config.load(args.config, ov))
                (rd / "train_seconds.txt").write_text(f"{time.time() - t0:.0f}\n")
            for step in range(args.every, args.steps + 1, args.every):
                ck = rd / "checkpoints" / f"checkpoint-{step}"
                record(arm, seed, step, str(ck if step < args.steps or ck.exists() else rd / "final"))
    rows = list(_done_rows(curve).values())
    md = table(rows)
    (out / "curve.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
