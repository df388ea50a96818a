"""Lose nothing, part three (issue 41, items 1-7): a user's file in an index folder, signals during training,
silent acceptances, byte-order marks, messages that name the file, and one-line plugin and reward errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import one_line_error, registries_restored  # the shared CLI-error check, plugin clean-up
from hindsearch.cli import main
from test_faults import CORPUS, write_corpus  # noqa: F401  (the fault suite's small corpus)

pytestmark = pytest.mark.timeout(300)



# ---------------------------------------------------------------- 1: a user's file in an index folder
def test_index_rebuild_keeps_a_file_the_user_put_in_the_folder(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(corpus), "--out", str(out)]) == 0
    (out / "MY-NOTES.md").write_text("my notes on this index\n")
    assert main(["index", "--corpus", str(corpus), "--out", str(out)]) == 1
    one_line_error(capsys, "hindsearch index: error: --out", "MY-NOTES.md", "did not write")
    assert (out / "MY-NOTES.md").read_text() == "my notes on this index\n"
    # an index built before index.json listed its files: a file newer than index.json is the user's
    meta = json.loads((out / "index.json").read_text())
    del meta["files"]
    (out / "index.json").write_text(json.dumps(meta))
    old = (out / "index.json").stat().st_mtime - 60
    for p in out.rglob("*"):
        if p.name != "MY-NOTES.md":
            os.utime(p, (old, old))
    assert main(["index", "--corpus", str(corpus), "--out", str(out)]) == 1
    one_line_error(capsys, "MY-NOTES.md")
    # without the user's file the rebuild replaces the index as before
    (out / "MY-NOTES.md").unlink()
    assert main(["index", "--corpus", str(corpus), "--out", str(out)]) == 0
    assert "MY-NOTES.md" not in json.loads((out / "index.json").read_text())["files"]


# ---------------------------------------------------------------- 3: silent acceptances refused before any write
@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tmp_path / "cache"))
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("sets, needles", [
    (["train.steps=100000000000000000000"], ["train.steps", "100000000000000000000"]),
    (["train.steps=10000000000"], ["train.steps must be", "<= 1000000000"]),
    (["train.seed=100000000000000000000"], ["train.seed", "64 bits"]),
    (['retrieval.kind="remote"', 'retrieval.url="ftp://x"'], ["retrieval.url = 'ftp://x'", "http://"]),
    (['retrieval.url="ftp://x"'], ["retrieval.url = 'ftp://x'"]),
    (['train.trl.output_dir="/"'], ["train.trl.output_dir = '/'", "set out instead"]),
])
def test_silent_acceptances_are_refused_before_anything_is_written(workdir, capsys, sets, needles):
    (workdir / "mine.txt").write_text("keep\n")
    before = snapshot(workdir)
    argv = [a for s in sets for a in ("--set", s)]
    assert main(["train", "--config", "tiny-cpu", *argv, "--out", "run"]) == 1
    one_line_error(capsys, "hindsearch train: error:", *needles)
    assert snapshot(workdir) == before and not (workdir / "run").exists() and not (workdir / ".hindsearch").exists()


def test_an_empty_out_flag_and_a_bad_url_in_eval_are_refused(workdir, capsys):
    assert main(["train", "--config", "tiny-cpu", "--out", ""]) == 1
    one_line_error(capsys, "hindsearch train: error:", "out = ''")
    assert not (workdir / "runs").exists()
    (workdir / "qa.jsonl").write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    (workdir / "remote.toml").write_text('[retrieval]\nkind = "remote"\nurl = "ftp://x"\n')
    assert main(["eval", "--config", "remote.toml", "--model", "tiny-random", "--data", "d=qa.jsonl",
                 "--out", "ev", "--no-progress"]) == 1
    one_line_error(capsys, "hindsearch eval: error:", "retrieval.url = 'ftp://x'")
    assert not (workdir / "ev").exists()


# ---------------------------------------------------------------- 4: a byte-order mark is read past
BOM = "\ufeff"


def test_a_utf8_bom_in_a_corpus_a_qa_file_and_a_preset_is_accepted(tmp_path, capsys):
    from hindsearch.config import Config
    from hindsearch.data.corpus import iter_corpus
    from hindsearch.data.qa import load_qa

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(BOM + "".join(json.dumps(r) + "\n" for r in CORPUS), encoding="utf-8")
    assert [p.id for p in iter_corpus(corpus)] == [r["id"] for r in CORPUS]
    as_list = tmp_path / "c.json"
    as_list.write_text(BOM + json.dumps(CORPUS), encoding="utf-8")
    assert len(list(iter_corpus(as_list))) == len(CORPUS)
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "idx")]) == 0
    rows = [{"id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"]} for i in range(3)]
    for name, text in (("qa.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), ("qa.json", json.dumps(rows))):
        (tmp_path / name).write_text(BOM + text, encoding="utf-8")
        assert [r.id for r in load_qa(tmp_path / name)] == ["q0", "q1", "q2"], name
    preset = tmp_path / "p.toml"
    preset.write_text(BOM + 'method = "grpo"\n[train]\nsteps = 2\n', encoding="utf-8")
    assert Config.load(preset).train.steps == 2


# ---------------------------------------------------------------- 5: messages name the file and line
def test_a_duplicate_question_id_names_the_file_and_both_lines(tmp_path, capsys):
    from hindsearch.data.qa import QAError, load_qa

    qa = tmp_path / "d.jsonl"
    qa.write_text("".join(json.dumps({"id": i, "question": f"q {n}?", "golden_answers": ["a"]}) + "\n"
                          for n, i in enumerate(["dev_0", "dev_1", "dev_0"])))
    with pytest.raises(QAError, match=r"d\.jsonl: line 3: .*duplicate question id 'dev_0' \(first at line 1"):
        load_qa(qa)
    assert [r.id for r in load_qa(qa, skip_bad=True)] == ["dev_0", "dev_1"]
    assert main(["eval", "--model", "tiny-random", "--retrieval-url", "http://127.0.0.1:9", "--data", f"d={qa}",
                 "--out", str(tmp_path / "ev"), "--no-progress"]) == 1
    one_line_error(capsys, "hindsearch eval: error:", f"{qa}: line 3", "duplicate question id 'dev_0'", "line 1")


# ---------------------------------------------------------------- 6: plugins, one line each
@pytest.fixture(scope="module")
def registries():
    """Registrations made by this module's plugins are undone after it (registries, imported plugins)."""
    with registries_restored():
        yield


BAD_PLUGINS = {
    "raises.py": ('raise RuntimeError("not configured")\n', "line 1: RuntimeError", "not configured"),
    "syntax.py": ("def f(:\n    pass\n", "syntax error", "line 1"),
    "divides.py": ("x = 1\ny = x / 0\n", "line 2: ZeroDivisionError", "division by zero"),
    "em.py": ("from hindsearch.train.reward_funcs import register_reward\n"
              "register_reward('em')(lambda completions, **kw: [0.0] * len(completions))\n",
              "line 2", "reward function 'em' is already registered"),
    "bm25.py": ("from hindsearch.retrieval.base import register_retriever\n"
                "register_retriever('bm25')(lambda cfg, index_dir, corpus: None)\n",
                "line 2", "retrieval.kind 'bm25' is already registered"),
    "grpo.py": ("from hindsearch.hindsight.registry import register_method\nregister_method('grpo')(None)\n",
                "line 2", "method 'grpo' is already registered"),
    "hindsearch.py": ("from hindsearch.hindsight.registry import register_method\n"
                      "register_method('hindsearch')(None)\n", "line 2", "method 'hindsearch' is already registered"),
    "plus.py": ("from hindsearch.hindsight.registry import register_method\nregister_method('a+b')(None)\n",
                "line 2", "'a+b'"),
    "exits.py": ("import sys\nsys.exit(0)\n", "called sys.exit(0)", "must not exit"),
}


@pytest.mark.parametrize("name", sorted(BAD_PLUGINS))
def test_every_plugin_error_is_one_line_naming_the_file(name, tmp_path, monkeypatch, capsys, registries):
    monkeypatch.chdir(tmp_path)
    source, *needles = BAD_PLUGINS[name]
    plugin = tmp_path / name
    plugin.write_text(source)
    assert main(["train", "--plugin", str(plugin), "--out", "run"]) == 1
    one_line_error(capsys, "hindsearch train: error: plugin", str(plugin), *needles)
    # the same plugin named by a config's plugins = [...]
    (tmp_path / "p.toml").write_text(f'plugins = ["{plugin.as_posix()}"]\n')
    assert main(["train", "--config", "p.toml", "--out", "run"]) == 1
    one_line_error(capsys, "hindsearch train: error:", "p.toml", str(plugin), *needles)
    assert not (tmp_path / "run").exists()


def test_a_folder_as_plugin_is_refused(tmp_path, monkeypatch, capsys, registries):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myplugins").mkdir()
    for spec in ("myplugins", str(tmp_path / "myplugins"), "myplugins/"):
        assert main(["train", "--plugin", spec, "--out", "run"]) == 1, spec
        one_line_error(capsys, "hindsearch train: error: plugin", "myplugins", "folder")
    assert not (tmp_path / "run").exists()


TERM_PLUGIN = '''
import torch
from dataclasses import dataclass
from hindsearch.config.fields import bounded
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxBatch, at, mask_positions
from hindsearch.hindsight.registry import Metrics, register_method


@dataclass
class BadConfig:
    lam: float = bounded(0.5, ge=0.0)


@register_method("{name}", config=BadConfig)
class BadTerm:
    name = "{name}"
    aggregation = "token-mean"
    ema_decay = None
    metrics = Metrics(reductions={{"L": "mean"}}, loss="L", panels={{}})

    def __init__(self, cfg, seed=0):
        self.cfg, self.lam = cfg, cfg.lam

    def prepare(self, trajectories, completion_len, ctx):
        mask = torch.zeros(len(trajectories), completion_len)
        for i, t in enumerate(trajectories):
            g = t.gen_mask[:completion_len]
            mask[i, : len(g)] = torch.tensor(g, dtype=torch.float)
        return AuxBatch({{"m": mask}}, {{}})

    def positions(self, inputs, completion_len):
        pos = mask_positions(inputs["m"], completion_len)
        return {positions}

    def loss(self, logits, idx, completion_ids, inputs):
        lS = losses.token_logprobs(logits, at(completion_ids, idx).to(logits.device))
        L = -lS.mean() if lS.numel() else logits.sum() * 0
        return {loss}, {{"L": float(L.detach())}}
'''


def run_config(path: Path, world: Path, plugin: Path, method: str = "grpo", rewards: str = '["em"]') -> Path:
    path.write_text(f"""
method = "{method}"
plugins = ["{plugin.as_posix()}"]
[model]
name = "tiny-random"
device = "cpu"
[data]
world_dir = "{world.as_posix()}"
world_entities = 60
[rollout]
max_turns = 1
max_new_tokens_per_turn = 8
max_total_tokens = 300
num_generations = 2
[warmup]
enabled = false
[train]
steps = 1
questions_per_step = 2
save_steps = 1
eval_limit = 1
threads = 1
reward_funcs = {rewards}
[eval]
batch_size = 2
""")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from hindsearch.data.world import ensure_world

    return ensure_world(tmp_path_factory.mktemp("world") / "world", seed=0, n_entities=60)


@pytest.mark.parametrize("case, positions, loss, needles", [
    ("float", "pos", "float(L.detach())", ["loss() returned a float loss", "expected a scalar torch tensor"]),
    ("shape", "pos", "L.repeat(3)", ["loss() returned a loss of shape [3]", "expected a scalar"]),
    ("positions", "pos[:, :-1]", "L", ["positions() returned a torch.bool tensor of shape", "expected torch.bool"]),
])
def test_a_term_returning_the_wrong_thing_is_named(case, positions, loss, needles, world, tmp_path, monkeypatch,
                                                    capsys, registries):
    monkeypatch.chdir(tmp_path)
    name = f"bad_{case}"
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(TERM_PLUGIN.format(name=name, positions=positions, loss=loss))
    config = run_config(tmp_path / "c.toml", world, plugin, method=name)
    assert main(["train", "--config", str(config), "--out", "run"]) == 1
    one_line_error(capsys, "hindsearch train: error:", f"term '{name}' (BadTerm in {plugin})", *needles)


# ---------------------------------------------------------------- 7: rewards checked once per call
REWARDS_PLUGIN = '''
def infinite(completions, **kw):
    return [float("inf")] * len(completions)

def words(completions, **kw):
    return ["1.0"] * len(completions)

def raises(completions, **kw):
    return {}["no such column"]

def one(completions, **kw):
    return 0.5

def nested(completions, **kw):
    return [[1.0]] * len(completions)
'''


@pytest.mark.parametrize("func, needles", [
    ("infinite", ["returned inf for completion 0", "must be finite"]),
    ("words", ["returned str '1.0' for completion 0", "expected a number or None"]),
    ("raises", ["raised KeyError", "no such column"]),
    ("one", ["returned float 0.5", "expected a list of 4 numbers"]),
    ("nested", ["returned list [1.0] for completion 0"]),
])
def test_a_reward_returning_the_wrong_thing_is_named(func, needles, world, tmp_path, monkeypatch, capsys,
                                                     registries):
    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "my_rewards.py"
    plugin.write_text(REWARDS_PLUGIN)
    config = run_config(tmp_path / "c.toml", world, plugin, rewards=f'["em", "{plugin.as_posix()}:{func}"]')
    assert main(["train", "--config", str(config), "--out", "run"]) == 1
    one_line_error(capsys, "hindsearch train: error: reward", f"{plugin}:{func}", *needles)
    assert not list((tmp_path / "run").glob("metrics.jsonl")) or "Infinity" not in (
        tmp_path / "run" / "metrics.jsonl").read_text()


# ---------------------------------------------------------------- 2: SIGTERM and SIGINT during training
TINY = ['model.name="tiny-random"', 'model.device="cpu"', "train.questions_per_step=2", "rollout.num_generations=2",
        "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=8", "rollout.max_total_tokens=300", "train.lr=0.01",
        "warmup.enabled=false", "train.samples_per_step=2", "train.eval_limit=1", "train.threads=1"]


def start_run(tmp_path: Path, world: Path, steps: int, *extra: str):
    import subprocess
    import sys

    run = tmp_path / "run"
    argv = [sys.executable, "-m", "hindsearch.cli", "train", "--out", str(run), "--set", f"train.steps={steps}",
            "--set", "train.save_steps=100", "--set", f'data.world_dir="{world}"', "--set", "data.world_entities=60",
            *(a for s in TINY for a in ("--set", s)), *extra]
    env = {**os.environ, "HINDSEARCH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return run, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                 cwd=tmp_path)


def steps_of(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def wait_for(cond, proc, timeout: float = 240.0) -> None:
    import time

    t0 = time.time()
    while not cond():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_during_training_saves_a_checkpoint_and_resume_writes_no_step_twice(sig, world, tmp_path, capsys):
    import signal

    from hindsearch.fsutil import LOCK_NAME, checkpoint_problem

    signum = getattr(signal, sig)
    run, proc = start_run(tmp_path, world, 4)
    try:
        metrics = run / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, proc)  # step 1 is done
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, (proc.returncode, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith(f"hindsearch train: stopped by {sig} after step "), err[-3000:]
    step = int(last.split("after step ")[1].split()[0])
    assert 1 <= step < 4 and f"checkpoint-{step} is saved" in last and f"--resume {run}" in last, last
    assert checkpoint_problem(run / "checkpoints" / f"checkpoint-{step}") is None
    assert not (run / LOCK_NAME).exists()
    assert steps_of(metrics) == list(range(1, step + 1))
    # the resume continues from that checkpoint: every step logged exactly once
    assert main(["train", "--resume", str(run)]) == 0
    assert f"from checkpoint-{step} ({step}/4 steps done)" in capsys.readouterr().out
    assert steps_of(metrics) == list(range(1, 5))


def test_a_signal_before_training_stops_at_once_and_releases_the_lock(world, tmp_path):
    import signal

    from hindsearch.fsutil import LOCK_NAME

    run, proc = start_run(tmp_path, world, 2)
    try:
        wait_for(lambda: (run / LOCK_NAME).exists() and (run / "config.toml").exists(), proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-3000:])
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and "stopped by SIGTERM before training" in last and "--resume" in last, err[-3000:]
    assert not (run / LOCK_NAME).exists()
