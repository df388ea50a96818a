"""A newcomer's first run (issue 41): the final progress line, samples.jsonl against metrics.jsonl, the default
thread count, ``eval``'s defaults, the Python recipe, ``data mini``'s split, the own-server warning, the report."""

from __future__ import annotations

import io

from transformers import TrainerControl, TrainerState, TrainingArguments


def test_the_last_progress_line_is_printed_once_with_the_last_steps_values(monkeypatch, tmp_path):
    """The Trainer ends a step, then logs it: a plain line written at the step's end showed the step before's
    reward, and the closing line repeated the count with the right one (``reward_mean=0.000``, then ``0.375``)."""
    from hindsearch import progress
    from hindsearch.train.steps import progress_callback

    out = io.StringIO()
    monkeypatch.setattr(progress, "progress_bar",
                        lambda total, desc, unit="it", initial=0: progress.PlainProgress(
                            total, desc, unit=unit, initial=initial, every_s=0.0, stream=out))
    bar = progress_callback("grpo steps", postfix=("loss", "rollout/reward_mean"))
    args, state, control = TrainingArguments(output_dir=str(tmp_path), report_to=[]), TrainerState(), TrainerControl()
    state.max_steps = 3
    bar.on_train_begin(args, state, control)
    for step, reward in ((1, 0.375), (2, 0.0), (3, 0.375)):
        bar.on_step_begin(args, state, control)
        state.global_step = step
        bar.on_step_end(args, state, control)
        bar.on_log(args, state, control, logs={"loss": 0.0, "rollout/reward_mean": reward})
    bar.on_log(args, state, control, logs={"train_runtime": 1.0})  # the end-of-training summary
    bar.on_train_end(args, state, control)
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == [f"grpo steps: {i}/3 steps ({p}%)" for i, p in
                                                  ((0, 0), (1, 33), (2, 67), (3, 100))], lines
    assert lines[1].endswith("reward_mean=0.375") and lines[2].endswith("reward_mean=0.000")
    assert lines[3].endswith("reward_mean=0.375")


def _trajs(rewards):
    from hindsearch.records import Trajectory

    return [Trajectory(qid=f"q{i // 4}", question="q?", golden_answers=["a"], prompt_ids=[1], reward=r, em=r)
            for i, r in enumerate(rewards)]


def test_samples_agree_with_the_steps_rollout_metrics():
    """A step with rollout/em 0.375 (3 of 8 succeeded) wrote 4 failed rollouts to samples.jsonl: failures went
    first, so every row had reward 0.0 and the report's browser showed no success."""
    from hindsearch.train import rollout_adapter as ra

    for rewards in ([0, 1, 0, 0, 1, 0, 1, 0], [1] * 7 + [0], [0] * 8, [1] * 8, [0, 0, 0, 0, 0, 0, 0, 1]):
        trajs = _trajs(rewards)
        step = ra.rollout_metrics([ra.row_stats(t) for t in trajs], 4)
        every = ra.sample_records(trajs, {}, 8, step=1)  # all of them: the same mean as metrics.jsonl
        assert sum(r["reward"] for r in every) / 8 == step["reward_mean"] == step["em"]
        for k in (2, 4, 6):
            rows = ra.sample_records(trajs, {}, k, step=1)
            ok = sum(r["reward"] > 0 for r in rows)
            assert len(rows) == k and len({r["index"] for r in rows}) == k
            assert abs(ok / k - step["reward_mean"]) <= 1 / k, (rewards, k, ok)
            assert (ok > 0) == (step["reward_mean"] > 0) and (ok < k) == (step["reward_mean"] < 1)
            assert all(rows[i]["reward"] <= rows[i + 1]["reward"] for i in range(k - 1))  # failures first
    assert [r["index"] for r in ra.sample_records(_trajs([0, 1, 0, 0, 1, 0, 1, 0]), {}, 4, 1)] == [0, 2, 1, 4]


def test_a_tiny_runs_samples_file_agrees_with_its_metrics(tmp_path):
    """The real trainer on scripted rollouts (half of them answer the gold): each step's rows in samples.jsonl
    have the step's share of successes (before: 2 failed rows a step against rollout/reward_mean 0.5)."""
    import json

    from recipes.micro.build import train_tokenizer
    from test_trainer import OVERRIDES, make_trainer

    from hindsearch.config import Config
    from hindsearch.data.world import generate_world
    from hindsearch.retrieval.factory import build_index, load_index

    w = generate_world(seed=0, n_entities=60)
    build_index(w.passages, tmp_path / "bm25", kind="bm25", show_progress=False)
    retriever = load_index(tmp_path / "bm25")
    tk = train_tokenizer([p.contents for p in w.passages] + [r.question for s in w.splits.values() for r in s],
                         vocab_size=1024)
    cfg = Config.load(None, [*OVERRIDES, "train.save_steps=2"])
    run = tmp_path / "run"
    trainer, _ = make_trainer(cfg, tk, retriever, w.splits["train"][:6], run)
    trainer.train()
    metrics = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert set(metrics) == {1, 2}
    for step, row in metrics.items():
        rewards = [s["reward"] for s in samples if s["step"] == step]
        assert len(rewards) == 2 and row["rollout/reward_mean"] == 0.5
        assert sum(rewards) / len(rewards) == row["rollout/reward_mean"], (step, rewards)
