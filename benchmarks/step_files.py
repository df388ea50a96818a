"""Which ``src/hindsearch`` files one training step runs code in (``sys.setprofile`` over step 2 of a run).

    python benchmarks/step_files.py --model MODEL_DIR --world WORLD_DIR [--method hindsearch+igsd]

Runs two steps of ``hindsearch train`` in this process on the tiny-cpu preset with the equivalence gate's settings
(``benchmarks/equivalence.py``: ``MODEL_DIR`` a protocol-following model, ``WORLD_DIR`` a world with its BM25
index), profiles the second optimizer step only (rollout, reward, terms, update and the step's logging) in every
thread, and prints a table of the package files whose functions ran, by package folder, and their count.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def settings(method: str, model: str, world: str) -> list[str]:
    """The equivalence gate's two-step run (its ``train`` settings) for ``method``."""
    return [f'method="{method}"', f'model.name="{model}"', 'model.device="cpu"',
            f'data.train="{world}/train.jsonl"',
            f'data.dev="{world}/dev.jsonl"', f'retrieval.index_dir="{world}/index-bm25"', 'retrieval.kind="bm25"',
            "retrieval.topk=2", "rollout.max_turns=3", "rollout.max_new_tokens_per_turn=48",
            "rollout.max_total_tokens=1024", "rollout.temperature=0.7", "rollout.num_generations=4",
            "warmup.enabled=false", "train.steps=2", "train.questions_per_step=2", "train.save_steps=2",
            "train.lr=2e-5", "train.kl_coef=0.0", "train.eval_limit=4", "train.eval_steps=0",
            'hindsearch.judge_kind="oracle"', "hindsearch.lam=2.0", 'hindsearch.distill_on="decision_query"',
            "igsd.lam=1.0", "igsd.max_positions_per_rollout=1", "igsd.n_controls=1", "igsd.max_query_tokens=24"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--world", required=True)
    ap.add_argument("--method", default="hindsearch+igsd")
    ap.add_argument("--step", type=int, default=2, help="the optimizer step profiled (1-based)")
    a = ap.parse_args(argv)

    import hindsearch
    from transformers import TrainerCallback

    from hindsearch.config import Config
    from hindsearch.train import run

    root = str(Path(hindsearch.__file__).resolve().parent) + os.sep
    seen: Counter[str] = Counter()

    def prof(frame, event, _arg):
        if event == "call":
            f = frame.f_code.co_filename
            if f.startswith(root):
                seen[f[len(root):]] += 1

    class Profile(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == a.step - 1:
                threading.setprofile(prof)
                sys.setprofile(prof)

        def on_log(self, args, state, control, **kw):  # after the step's metrics are written
            if state.global_step == a.step:
                sys.setprofile(None)
                threading.setprofile(None)

    build = run.build_trainer

    def build_profiled(*args, **kwargs):
        trainer = build(*args, **kwargs)
        trainer.add_callback(Profile())
        return trainer

    run.build_trainer = build_profiled
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config.load("tiny-cpu", settings(a.method, a.model, a.world) + [f'out="{tmp}/run"'])
        run.run_train(cfg, threads=1, log=lambda *_: None)
    folders = Counter(f.split(os.sep)[0] if os.sep in f else "." for f in seen)
    print(f"| files run in step {a.step} of {a.method} | {len(seen)} |\n|---|---|")
    for folder, n in sorted(folders.items()):
        print(f"| {folder}/ | {n} |")
    print()
    for f in sorted(seen):
        print(f"  {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
