"""Peak resident memory and wall time of the main job's stages, each in a fresh process.

Every stage runs in its own subprocess (``VmHWM`` cannot be reset inside a process), on the preset's
model, world and settings, and prints one row: the stage's own peak RSS (sampled by
``hindsearch.memory.StageMemory``), the process peak (``VmHWM``, including the model load) and the
stage's wall and CPU time (user + system; on a shared machine CPU time compares runs better). Stages:

- ``load``: ``load_policy`` (the cached ``save_pretrained`` copy; ``--gguf`` rebuilds it from the GGUF
  in a temporary cache, the first-run path);
- ``eval``: greedy dev evaluation (``train.eval_limit`` questions, ``eval.batch_size``);
- ``sft``: warm-up SFT for ``--sft-steps`` steps of ``warmup.batch_size`` scripted demos;
- ``grpo``: ``--grpo-steps`` GRPO steps of the preset (rollouts + update) through the real trainer.

    python benchmarks/bench_memory.py                                   # tiny-cpu as the main job runs it
    python benchmarks/bench_memory.py --set warmup.micro_batch_size=4 --set train.micro_batch_size=8 \\
        --no-malloc-tune                                                # the settings before the fix

``--set`` overrides go to every stage. Run on a quiet machine: the wall times are only comparable
between runs made under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("load", "eval", "sft", "grpo")


def child(args: argparse.Namespace) -> None:
    """Run one stage in this process; print its JSON row last."""
    from hindsearch.memory import StageMemory, hwm_mb, tune_malloc

    if not args.no_malloc_tune:
        tune_malloc()
    import torch

    torch.set_num_threads(args.threads)
    from hindsearch.config import Config
    from hindsearch.models import load_policy
    from hindsearch.inputs import load_records, resolve_data

    cfg = Config.load(args.config, args.set)
    mem = StageMemory()
    split: dict[str, float] = {}  # grpo: rollout and update seconds from the trainer's log
    stage = args.child
    if stage == "load":
        with mem.stage(stage):
            model, tok = load_policy(cfg.model)
    else:
        from hindsearch.retrieval.factory import load_retriever

        paths = resolve_data(cfg)
        train, dev = load_records(cfg, paths)
        retriever = load_retriever(cfg.retrieval, paths["index_dir"])
        model, tok = load_policy(cfg.model)
        if stage == "eval":
            from hindsearch.agent.engine import RolloutEngine
            from hindsearch.agent.hf_backend import HFBackend
            from hindsearch.eval import evaluate

            engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=cfg.retrieval.topk,
                                   backend=HFBackend(model, tok))
            with mem.stage(stage), tempfile.TemporaryDirectory() as tmp:
                evaluate(engine, {"dev": dev}, out_dir=Path(tmp), batch_size=cfg.eval.batch_size, greedy=True,
                         progress=False)
        elif stage == "sft":
            from hindsearch.train.warmup import build_demos, sft

            w = cfg.warmup
            cfg.warmup.num_demos = args.sft_steps * w.batch_size
            demos, _ = build_demos(cfg, tok, retriever, train)
            with mem.stage(stage):
                sft(model, tok, demos, epochs=1, lr=w.lr, batch_size=w.batch_size, progress=False,
                    micro_batch_size=w.micro_batch_size)
        elif stage == "grpo":
            from hindsearch.agent.engine import RolloutEngine
            from hindsearch.agent.hf_backend import HFBackend
            from hindsearch.train.run import build_trainer, ensure_on_disk

            cfg.train.steps = args.grpo_steps
            cfg.train.save_steps = 10**6
            with tempfile.TemporaryDirectory() as tmp:
                ensure_on_disk(model, tok, Path(tmp) / "init")
                model.train()
                engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=cfg.retrieval.topk,
                                       backend=HFBackend(model, tok))
                trainer = build_trainer(cfg, model, tok, engine, train, Path(tmp))
                trainer.args.disable_tqdm = True
                with mem.stage(stage):
                    trainer.train()
                logged = [r for r in trainer.state.log_history if "time/update" in r]
                split = {f"{k}_s": round(sum(float(r[f"time/{k}"]) for r in logged), 2) for k in ("rollout", "update")}
    row = {"stage": stage, **mem.stages[stage], "process_peak_mb": round(hwm_mb(), 1), **split}
    print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--config", default="configs/tiny-cpu.toml", help="preset (model, rollout, warm-up, train)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every stage")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {', '.join(STAGES)}")
    ap.add_argument("--sft-steps", type=int, default=3, help="warm-up SFT steps in the sft stage")
    ap.add_argument("--grpo-steps", type=int, default=1, help="GRPO steps in the grpo stage")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per stage")
    ap.add_argument("--gguf", action="store_true", help="load: rebuild the SmolLM2 copy from its GGUF (first run)")
    ap.add_argument("--no-malloc-tune", action="store_true", help="leave glibc's allocator at its defaults")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--child", default=None, choices=STAGES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    rows = []
    for stage in [s.strip() for s in args.stages.split(",") if s.strip()]:
        if stage not in STAGES:
            ap.error(f"--stages: unknown stage {stage!r} (choose from {', '.join(STAGES)})")
        cmd = [sys.executable, __file__, "--child", stage, "--config", args.config, "--threads", str(args.threads),
               "--sft-steps", str(args.sft_steps), "--grpo-steps", str(args.grpo_steps)]
        cmd += [x for s in args.set for x in ("--set", s)] + (["--no-malloc-tune"] if args.no_malloc_tune else [])
        env = dict(os.environ)
        tmp_cache = None
        if stage == "load" and args.gguf:
            tmp_cache = tempfile.TemporaryDirectory(prefix="bench-memory-cache-")
            env["HINDSEARCH_CACHE"] = tmp_cache.name
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if tmp_cache is not None:
            tmp_cache.cleanup()
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
        if proc.returncode or not lines:
            sys.exit(f"stage {stage} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        row = json.loads(lines[-1][4:])
        row["process_seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(f"{stage}: peak {row['peak_rss_mb']:.0f} MiB in {row['seconds']:.1f} s", file=sys.stderr, flush=True)
    print(f"\n{args.config} {' '.join(args.set)}{' --no-malloc-tune' if args.no_malloc_tune else ''}, "
          f"threads {args.threads}, sft {args.sft_steps} steps, grpo {args.grpo_steps} steps")
    print(f"| {'stage':6} | {'stage peak RSS MiB':>18} | {'process peak MiB':>16} | {'stage wall s':>12} | "
          f"{'stage CPU s':>11} | {'GRPO rollout s':>14} | {'GRPO update s':>13} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['stage']:6} | {r['peak_rss_mb']:18.0f} | {r['process_peak_mb']:16.0f} | {r['seconds']:12.1f} | "
              f"{r.get('cpu_seconds', 0.0):11.1f} | {r.get('rollout_s', '-'):>14} | {r.get('update_s', '-'):>13} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
