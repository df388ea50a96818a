"""Issue 41, item 8: a corrupted checkpoint never poisons the checkpoints after it.

A real GRPO run (tiny random model, the TRL trainer, a checkpoint after every step) is resumed after its
files are damaged as a disk or a buggy writer would: 4 KiB overwritten in the middle of ``optimizer.pt``
(same size, zip directory intact), 64 bytes overwritten in ``rng_state.pth``, and an optimizer state that is
valid on disk but makes the first step's weights non-finite. Each time the resume names the checkpoint it
sets aside, falls back to the one before it, and no checkpoint with a non-finite weight is ever written.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from hindsearch.fsutil import COMPLETE_NAME, OUTPUT_MARKER, checkpoint_problem

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """3 GRPO steps with a checkpoint after each, all kept."""
    from hindsearch.config import Config
    from hindsearch.train.run import run_train
    from test_output_safety import TINY

    root = tmp_path_factory.mktemp("poisoned")
    mp = pytest.MonkeyPatch()
    mp.setenv("HINDSEARCH_CACHE", str(root / "cache"))
    try:
        cfg = Config.load(None, TINY + [f'data.world_dir="{root / "world"}"', "data.world_entities=60",
                                        "train.steps=3", "train.save_steps=1", "train.trl.save_total_limit=5",
                                        f'out="{root / "run"}"'])
        run_train(cfg, log=lambda m: None)
    finally:
        mp.undo()
    return root / "run"


@pytest.fixture
def stopped_after_step_2(trained_run, tmp_path, monkeypatch):
    """A copy of the run as if it had been stopped during step 3: checkpoint-1 and checkpoint-2 on disk."""
    monkeypatch.setenv("HINDSEARCH_CACHE", str(trained_run.parent / "cache"))
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, symlinks=True)
    for name in ("config.toml", OUTPUT_MARKER):  # the copy's own folder
        (run / name).write_text((run / name).read_text().replace(str(trained_run), str(run)))
    shutil.rmtree(run / "checkpoints" / "checkpoint-3")
    shutil.rmtree(run / "final")
    return run


def overwrite(path: Path, n: int) -> None:
    """``n`` random bytes written over the middle of ``path`` (its size unchanged)."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size // 2 - n // 2)
        f.write(random.Random(0).randbytes(n))
    assert path.stat().st_size == size


def resume(run: Path) -> list[str]:
    from hindsearch.train.run import run_train

    lines: list[str] = []
    run_train(resume=run, log=lines.append)
    return lines


def assert_every_checkpoint_finite(run: Path) -> None:
    import torch
    from safetensors.torch import load_file

    ck = run / "checkpoints"
    names = sorted(p.name for p in ck.glob("checkpoint-*"))
    assert names == ["checkpoint-1", "checkpoint-2", "checkpoint-3"], names
    for name in names:
        assert checkpoint_problem(ck / name) is None and (ck / name / COMPLETE_NAME).exists()
        weights = load_file(str(ck / name / "model.safetensors"))
        bad = [k for k, t in weights.items() if not torch.isfinite(t).all()]
        assert not bad, (name, bad)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # steps 2 and 3 redone once each


def test_overwritten_optimizer_state_is_set_aside_and_the_resume_falls_back(stopped_after_step_2):
    run = stopped_after_step_2
    overwrite(run / "checkpoints" / "checkpoint-2" / "optimizer.pt", 4096)
    lines = resume(run)
    said = [m for m in lines if "skipping checkpoint-2" in m]
    assert said and "optimizer.pt" in said[0] and ".torn-checkpoint-2" in said[0], lines
    assert any("from checkpoint-1" in m for m in lines), lines
    assert (run / "checkpoints" / ".torn-checkpoint-2").is_dir()
    assert_every_checkpoint_finite(run)


def test_overwritten_rng_state_names_the_file_and_falls_back(stopped_after_step_2):
    run = stopped_after_step_2
    overwrite(run / "checkpoints" / "checkpoint-2" / "rng_state.pth", 64)
    lines = resume(run)
    said = [m for m in lines if "skipping checkpoint-2" in m]
    assert said and "rng_state.pth" in said[0], lines
    assert any("from checkpoint-1" in m for m in lines), lines
    assert_every_checkpoint_finite(run)


@pytest.mark.parametrize("newest", [2, 1], ids=["back-to-checkpoint-1", "back-to-step-0"])
def test_a_resume_that_goes_non_finite_at_once_falls_back_and_saves_nothing_poisoned(stopped_after_step_2, newest):
    """The optimizer state is a valid file (its CRCs match) whose second moments are negative: AdamW's first
    step after the resume makes the weights NaN. That checkpoint is set aside and training restarts from the
    one before it (or from the policy RL started from); no checkpoint ever holds the NaN weights."""
    import torch

    run = stopped_after_step_2
    if newest == 1:
        shutil.rmtree(run / "checkpoints" / "checkpoint-2")
    ck = run / "checkpoints" / f"checkpoint-{newest}"
    state = torch.load(ck / "optimizer.pt", weights_only=True)
    for s in state["state"].values():
        s["exp_avg_sq"].fill_(-1.0)
    torch.save(state, ck / "optimizer.pt")
    marker = json.loads((ck / COMPLETE_NAME).read_text())  # as if the bad state had been saved so
    marker["files"]["optimizer.pt"] = (ck / "optimizer.pt").stat().st_size
    (ck / COMPLETE_NAME).write_text(json.dumps(marker))
    assert checkpoint_problem(ck) is None
    lines = resume(run)
    said = [m for m in lines if f"skipping checkpoint-{newest}" in m]
    assert said and "non-finite" in said[0] and f"step {newest + 1}" in said[0], lines
    assert f".torn-checkpoint-{newest}" in said[0], lines
    then = "from checkpoint-1" if newest == 2 else "no complete checkpoint, starting from step 0"
    assert any(then in m for m in lines[lines.index(said[0]):]), lines
    assert_every_checkpoint_finite(run)


def test_a_checkpoint_with_a_non_finite_weight_is_never_written(tmp_path):
    import torch

    from test_faults import tiny_trainer

    ck = tmp_path / "checkpoints"
    trainer = tiny_trainer(ck, steps=1)
    trainer.train()
    assert (ck / "checkpoint-1" / COMPLETE_NAME).exists()
    with torch.no_grad():
        next(trainer.model.parameters())[0].fill_(float("nan"))
    trainer.state.global_step = 2
    with pytest.raises(RuntimeError, match="non-finite.*checkpoint-2 is not written"):
        trainer._save_checkpoint(trainer.model, trial=None)
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith(".")) == ["checkpoint-1"]


def test_a_fallback_builds_the_frozen_teacher_from_the_start_not_from_the_poisoned_weights(
        tmp_path_factory, monkeypatch):
    """HindSearch's frozen teacher (``kl_coef = 0``) is a copy of the policy RL started from. When a
    resume goes non-finite at once and falls back to an earlier checkpoint, the trainer built for the
    fallback must copy that start again, not the NaN weights the failed step left in memory."""
    import torch

    from hindsearch.config import Config
    from hindsearch.train import run as run_mod
    from test_output_safety import TINY

    root = tmp_path_factory.mktemp("poisoned-hind")
    monkeypatch.setenv("HINDSEARCH_CACHE", str(root / "cache"))
    cfg = Config.load(None, TINY + [f'data.world_dir="{root / "world"}"', "data.world_entities=60",
                                    'method="hindsearch"', 'hindsearch.judge_kind="oracle"',
                                    "train.kl_coef=0.0", "train.steps=3", "train.save_steps=1",
                                    "train.trl.save_total_limit=5", f'out="{root / "run"}"'])
    run_mod.run_train(cfg, log=lambda m: None)
    run = root / "run"
    shutil.rmtree(run / "checkpoints" / "checkpoint-3")
    shutil.rmtree(run / "final")
    ck = run / "checkpoints" / "checkpoint-2"
    state = torch.load(ck / "optimizer.pt", weights_only=True)
    for s in state["state"].values():
        s["exp_avg_sq"].fill_(-1.0)
    torch.save(state, ck / "optimizer.pt")
    marker = json.loads((ck / COMPLETE_NAME).read_text())
    marker["files"]["optimizer.pt"] = (ck / "optimizer.pt").stat().st_size
    (ck / COMPLETE_NAME).write_text(json.dumps(marker))

    frozen_finite: list[bool] = []
    build = run_mod.build_trainer

    def build_and_look(*args, **kwargs):
        trainer = build(*args, **kwargs)
        frozen = trainer.aux_ctx.frozen
        frozen_finite.append(all(torch.isfinite(p).all().item() for p in frozen.parameters()))
        return trainer

    monkeypatch.setattr(run_mod, "build_trainer", build_and_look)
    lines = resume(run)
    assert any("skipping checkpoint-2" in m and "non-finite" in m for m in lines), lines
    assert any("from checkpoint-1" in m for m in lines), lines
    assert frozen_finite == [True, True], frozen_finite  # the resume's trainer, then the fallback's
    assert_every_checkpoint_finite(run)
