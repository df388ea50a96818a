"""A newcomer's first run (issue 41): the final progress line, samples.jsonl against metrics.jsonl, the default
thread count, ``eval``'s defaults, the Python recipe, ``data mini``'s split, the own-server warning, the report."""

from __future__ import annotations

import io

from transformers import TrainerControl, TrainerState, TrainingArguments


def test_the_last_progress_line_is_printed_once_with_the_last_steps_values(monkeypatch, tmp_path):
    """The Trainer ends a step, then logs it: a plain line written at the step's end showed the step before's
    reward, and the closing line repeated the count with the right one (``reward_mean=0.000``, then ``0.375``)."""
    from hindsearch import progress
    from hindsearch.train.callbacks import progress_callback

    out = io.StringIO()
    monkeypatch.setattr(progress, "progress_bar",
                        lambda total, desc, unit="it", initial=0: progress.PlainProgress(
                            total, desc, unit=unit, initial=initial, every_s=0.0, stream=out))
    bar = progress_callback("grpo steps", postfix=("loss", "rollout/reward_mean"))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state, control = TrainerState(), TrainerControl()
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


def test_the_default_thread_count_follows_the_machine():
    from hindsearch.models import default_threads

    assert default_threads(2, 0.0)[0] == 1 and default_threads(1, 0.0)[0] == 1  # 2 cores or fewer
    n, why = default_threads(8, 9.5)
    assert n == 1 and "busy" in why and "9.5" in why
    assert default_threads(8, 3.2)[0] == 4  # the free cores
    n, why = default_threads(8, 0.3)
    assert n is None and "torch's default" in why


def test_a_run_without_threads_chooses_one_on_a_busy_machine_and_says_why(monkeypatch):
    import os

    import torch

    from hindsearch import models

    old = torch.get_num_threads()
    lines: list[str] = []
    try:
        torch.set_num_threads(4)
        monkeypatch.setattr(models, "usable_cores", lambda: 8)
        monkeypatch.setattr(os, "getloadavg", lambda: (11.0, 9.0, 7.0))
        assert models.set_threads(None, lines.append)[0] == 1 == torch.get_num_threads()
        assert lines[-1].startswith("torch CPU threads: 1 (chosen for a busy machine: load average 11.0 >= 8")
        monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
        torch.set_num_threads(4)
        assert models.set_threads(None, lines.append)[0] == 4  # idle: torch's default stays
        assert models.set_threads(3, lines.append)[0] == 3  # --threads wins
    finally:
        torch.set_num_threads(old)


def _small_world(tmp_path):
    from hindsearch.data.world import generate_world
    from hindsearch.records import QARecord  # noqa: F401
    from hindsearch.retrieval.factory import build_index

    w = generate_world(seed=0, n_entities=60)
    build_index(w.passages, tmp_path / "bm25", kind="bm25", show_progress=False)
    return w


def test_eval_without_config_takes_trains_preset_and_a_thread_count(tmp_path, capsys, monkeypatch):
    """``hindsearch eval`` without ``--config`` decoded with the built-in defaults (4 turns of 128 tokens) where
    ``train`` evaluates with the tiny-cpu preset (2 turns of 40), and had no ``--threads``."""
    import json

    import torch

    from hindsearch import cli
    from hindsearch.cli.train import find_config
    from hindsearch.config import Config
    from hindsearch.fsutil import read_marker

    w = _small_world(tmp_path)
    qa = tmp_path / "dev.jsonl"
    qa.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in w.splits["dev"][:2]))
    old = torch.get_num_threads()
    try:
        rc = cli.main(["eval", "--model", "tiny-random", "--index", str(tmp_path / "bm25"), "--data", f"d={qa}",
                       "--out", str(tmp_path / "ev"), "--threads", "1", "--no-progress"])
        assert rc == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(old)
    assert "torch CPU threads: 1 (train.threads / --threads)" in capsys.readouterr().out
    preset = Config.load(find_config(None))
    recorded = read_marker(tmp_path / "ev")
    rollout = json.dumps(recorded, default=str)
    assert preset.rollout.max_new_tokens_per_turn == 40 and '"max_new_tokens_per_turn": 40' in rollout
    assert f'"max_turns": {preset.rollout.max_turns}' in rollout and '"topk": 2' in rollout


def test_config_load_takes_a_preset_name():
    from hindsearch.cli.train import find_config
    from hindsearch.config import Config, ConfigError

    by_name = Config.load("tiny-cpu", ["train.steps=2"]).to_dict()
    assert by_name == Config.load(find_config(None), ["train.steps=2"]).to_dict()
    import pytest

    with pytest.raises(ConfigError, match="'no-such-preset' not found .*presets: .*tiny-cpu"):
        Config.load("no-such-preset")


def test_the_readme_python_recipe_runs_with_the_clis_settings(monkeypatch):
    """The README's notebook example loaded the built-in defaults (the paper's settings: 128-token turns, a KL
    reference model, no activation checkpointing): its two-step tiny run peaked at 2.8 GB against 1.1 GB for the
    same run from the CLI, which runs the tiny-cpu preset."""
    from pathlib import Path

    from hindsearch.cli.train import find_config
    from hindsearch.config import Config
    from hindsearch.train import run

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    example = next(b.split("```", 1)[0] for b in readme.split("```python")[1:] if "retriever=notes" in b)
    seen: list[Config] = []
    monkeypatch.setattr(run, "run_train", lambda cfg=None, **kw: seen.append(cfg) or {})
    exec(compile(example, "README.md", "exec"), {"__name__": "docs_example"})
    overrides = ['model.name="tiny-random"', "warmup.enabled=false", "train.steps=2", "train.questions_per_step=2",
                 "rollout.num_generations=2", "rollout.max_turns=1", "train.eval_limit=2", "train.threads=1"]
    cli = Config.load(find_config(None), overrides).to_dict()  # `hindsearch train --set ...` with no --config
    got = seen[0].to_dict()
    assert {k: v for k, v in got.items() if k != "out"} == {k: v for k, v in cli.items() if k != "out"}
    assert got["train"]["kl_coef"] == 0 and got["train"]["gradient_checkpointing"]


def test_run_train_quiets_upstream_bars_already_imported(monkeypatch):
    """From Python, transformers is imported before ``run_train`` runs: the environment switch the CLI sets came too
    late, and a log got transformers' bars ("Writing model shards", "Loading weights") that the CLI hides."""
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    from hindsearch import progress

    monkeypatch.delenv(progress.UPSTREAM_BARS_ENV, raising=False)
    monkeypatch.setattr(progress, "interactive", lambda stream=None: False)
    hf_logging.enable_progress_bar()
    hub_utils.enable_progress_bars()
    try:
        assert progress.quiet_upstream_bars()
        assert not hf_logging.is_progress_bar_enabled() and hub_utils.are_progress_bars_disabled()
    finally:
        hf_logging.enable_progress_bar()
        hub_utils.enable_progress_bars()


def _hotpot_row(i: int) -> dict:
    return {"_id": f"h{i}", "question": f"Where was the founder of Firm{i} born?", "answer": f"Town{i}",
            "type": "bridge", "level": "hard", "supporting_facts": [[f"Firm{i}", 0], [f"Person{i}", 0]],
            "context": [[f"Firm{i}", [f"Firm{i} was founded by Person{i}."]],
                        [f"Person{i}", [f"Person{i} was born in Town{i}."]]]}


def test_data_mini_writes_a_train_dev_split(tmp_path, capsys):
    """``data mini`` wrote benchmark test sets only: a user had to cut a train/dev split by hand."""
    import json

    from test_mini import _tiny_shared

    from hindsearch import cli
    from hindsearch.data.qa import load_qa

    shared = _tiny_shared(tmp_path / "shared")
    (shared / "hipporag").mkdir()
    (shared / "hipporag/hotpotqa_train.json").write_text(json.dumps([_hotpot_row(i) for i in range(10)]))
    assert cli.main(["data", "mini", "--shared", str(shared), "--out", str(tmp_path / "mini0")]) == 0
    assert "train/dev split: 9 train.jsonl + 1 dev.jsonl of 10 kept" in capsys.readouterr().out
    assert len(load_qa(tmp_path / "mini0/dev.jsonl")) == 1
    assert cli.main(["data", "mini", "--shared", str(shared), "--out", str(tmp_path / "mini"),
                     "--dev-fraction", "0.2"]) == 0
    assert "train/dev split: 8 train.jsonl + 2 dev.jsonl of 10 kept" in capsys.readouterr().out
    train, dev = load_qa(tmp_path / "mini/train.jsonl"), load_qa(tmp_path / "mini/dev.jsonl")
    assert len(train) == 8 and len(dev) == 2 and not {r.id for r in train} & {r.id for r in dev}
    assert {r.id for r in train + dev} == {f"h{i}" for i in range(10)}
    assert all(r.metadata.get("evidence_ids") for r in train + dev)  # its paragraphs are in the corpus
    meta = json.loads((tmp_path / "mini/mini.json").read_text())
    assert meta["split"]["train"] == 8 and meta["split"]["sources"] == ["hipporag/hotpotqa_train.json"]


def test_training_on_questions_the_retrievers_corpus_cannot_answer_warns(tmp_path):
    """The own-server recipe set no data.train: the run trained on the fictional world's questions while a real
    HTTP server retrieved from the user's corpus, and nothing said so."""
    import json

    from hindsearch.cli.train import find_config
    from hindsearch.config import Config
    from hindsearch.records import Passage
    from hindsearch.retrieval.factory import build_index, load_index
    from hindsearch.retrieval.server import BackgroundServer, create_app
    from hindsearch.train.run import _Job, preflight

    topics = ["volcano", "glacier", "harbour", "orchard", "lighthouse", "meadow", "canyon", "reef"]
    mine = [Passage(str(i), f'"{t.title()} {i}"\nThe {t} number {i} is looked after by keeper{i}.')
            for i, t in enumerate(topics * 8)]
    build_index(mine, tmp_path / "my-index", kind="bm25", show_progress=False)
    qa = tmp_path / "my-train.jsonl"
    qa.write_text("".join(json.dumps({"id": f"m{i}", "question": f"Who looks after the {t} number {i}?",
                                      "golden_answers": [f"keeper{i}"]}) + "\n" for i, t in enumerate(topics * 8)))
    base = [f'data.world_dir="{tmp_path / "world"}"', "data.world_entities=200", 'model.name="tiny-random"']

    def data_stage(overrides):
        lines: list[str] = []
        cfg = Config.load(find_config(None), [*base, *overrides])
        _Job(cfg, tmp_path / "run", lines.append, preflight(cfg)).data()
        return [ln.strip() for ln in lines if "warning" in ln]

    with BackgroundServer(create_app(load_index(tmp_path / "my-index"), default_topk=3)) as srv:
        remote = ["retrieval.kind=\"remote\"", f'retrieval.url="{srv.url}"']
        said = data_stage(remote)  # the recipe as it was: the world's questions, the user's server
        assert len(said) == 1 and "none of the first 50 training questions" in said[0]
        assert "world/train.jsonl" in said[0] and srv.url in said[0] and "data.train" in said[0]
        assert data_stage([*remote, f'data.train="{qa}"', f'data.dev="{qa}"']) == []  # the recipe as it is now
    assert data_stage([]) == []  # the world's questions against the world's own index


def test_a_report_on_a_stopped_run_shows_its_finished_base_evaluation(tmp_path):
    """A real ``hindsearch train`` killed after its base evaluation: the report hid that evaluation (it read the
    stage rows from summary.json, which only a finished run writes)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from hindsearch.study.report import render
    from hindsearch.study.report.runs import load_run

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "hindsearch.cli", "train", "--set", 'model.name="tiny-random"', "--set",
           "warmup.enabled=false", "--set", "train.eval_limit=2", "--set", "data.world_entities=60", "--set",
           f'data.world_dir="{tmp_path / "world"}"', "--set", "train.steps=50", "--threads", "1", "--out",
           str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        deadline = time.time() + 240
        for line in proc.stdout:
            seen.append(line)
            if "dev EM base model" in line or time.time() > deadline:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert any("dev EM base model" in ln for ln in seen), "".join(seen)
    run = tmp_path / "run"
    assert not (run / "summary.json").exists() and (run / "eval/base/summary.json").exists()
    loaded = load_run(run)
    assert set(loaded.summary["dev"]) == {"base"} and loaded.summary["dev"]["base"]["n"] == 2
    assert "dev, base" in render(run)


def test_tick_labels_of_a_small_range_differ():
    """The entropy panel printed nine identical labels (``%.3g`` of 0.81201, 0.81202, ...)."""
    from hindsearch.study.report import plots

    fig, ax = plots.axes("entropy")
    ax.plot([1, 2, 3, 4], [0.812010, 0.812035, 0.812052, 0.812081])
    plots.plain_y(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    plots._pyplot().close(fig)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    assert plots.distinct_digits([2e-05, 4e-05]) == 3 and plots.distinct_digits([0.81201, 0.81202]) == 5


def test_the_reports_header_names_the_thread_count_a_run_chose(tmp_path):
    from hindsearch.study.report.header import run_header
    from hindsearch.study.report.runs import Run

    run = Run(path=tmp_path)
    run.config = {"model": {"name": "tiny-random"}, "train": {"steps": 2}}
    run.summary = {"threads": {"count": 1, "why": "chosen for a busy machine: load average 9.0 >= 2 cores"}}
    hardware = next(r for r in run_header(run) if "hardware" in str(r))
    assert "torch threads 1 (chosen for a busy machine: load average 9.0 &gt;= 2 cores)" in str(hardware) \
        or "torch threads 1 (chosen for a busy machine: load average 9.0 >= 2 cores)" in str(hardware)
