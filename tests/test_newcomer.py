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
