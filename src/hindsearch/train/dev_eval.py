"""Dev evaluations of the main job: one greedy EM evaluation per stage (base, after warm-up, after
RL), the optional dev curve during training (``train.eval_steps``), and the summary table of the
stages that ran."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hindsearch.config import Config

STAGES = ("base", "warmup", "rl")
STAGE_NAMES = {"base": "base model", "warmup": "after warm-up", "rl": "after RL"}


def evaluate_dev(engine: Any, dev: list[Any], out_dir: Path, cfg: Config,
                 model: dict[str, Any] | None = None, log: Any = print) -> dict[str, Any]:
    """A greedy dev evaluation into ``out_dir``; its rows are reused on a resume only when ``model``
    (the stage's ``eval.model_identity``) and the config's rollout sections are those that made
    them, else redone."""
    from hindsearch.eval import config_record, evaluate

    engine.model.eval()
    record = {**({"model": model} if model is not None else {}), **config_record(cfg)}
    return evaluate(engine, {"dev": dev}, out_dir=out_dir, batch_size=cfg.eval.batch_size,
                    greedy=cfg.eval.greedy, seed=cfg.eval.seed, record=record, redo_on_change=True,
                    log=log)


def dev_curve_callback(cfg: Config, trainer: Any, make_engine: Any, dev: list[Any],
                       run_dir: Path) -> Any:
    """A ``TrainerCallback`` that evaluates ``dev`` greedily every ``train.eval_steps`` steps.

    One row per evaluation in ``RUN_DIR/dev_curve.jsonl``: ``{"step", "em", "em_1hop", "em_2hop",
    "n", "searches", "validity", "time_s"}`` (the columns of the summary table). The policy is put
    back in training mode afterwards; the evaluation's trajectories are not kept.
    """
    import tempfile

    from transformers import TrainerCallback

    class DevCurve(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            # the final model gets the full 'rl' eval
            if step % cfg.train.eval_steps or step >= cfg.train.steps:
                return
            model = trainer.accelerator.unwrap_model(trainer.model)
            t0 = time.time()
            with tempfile.TemporaryDirectory() as tmp:
                row = summary_row(evaluate_dev(make_engine(model), dev, Path(tmp), cfg))
            model.train()
            row = {"step": step, **row, "time_s": round(time.time() - t0, 2)}
            with (run_dir / "dev_curve.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")

    return DevCurve()


def summary_row(res: dict[str, Any]) -> dict[str, Any]:
    """EM overall / by hops, searches per question and validity rate from an ``evaluate`` result."""
    r = res.get("dev", res) if isinstance(res, dict) else {}
    if isinstance(r, dict) and "benchmarks" in res:
        r = res["benchmarks"].get("dev", r)
    from hindsearch.eval import bench_row

    return bench_row(r) if isinstance(r, dict) else {}


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """Plain-text table of the stages that ran."""

    def f(x: Any, pct: bool = True) -> str:
        if x is None:
            return "-"
        return f"{100 * x:.1f}" if pct else f"{x:.2f}"

    head = (f"{'stage':<15}{'EM':>7}{'EM 1-hop':>10}{'EM 2-hop':>10}{'searches/q':>12}"
            f"{'valid %':>9}{'n':>6}")
    lines = [head, "-" * len(head)]
    for stage in STAGES:
        if stage in rows:
            r = rows[stage]
            n = r["n"] if r["n"] is not None else "-"
            lines.append(f"{STAGE_NAMES[stage]:<15}{f(r['em']):>7}{f(r['em_1hop']):>10}"
                         f"{f(r['em_2hop']):>10}{f(r['searches'], False):>12}{f(r['validity']):>9}"
                         f"{n:>6}")
    return "\n".join(lines)
