"""Fault suite, part two (issue 23, classes A-C): nothing a user owns is written over, resume never writes a
step twice nor resumes silently from a broken state, and evaluation rows are reused only when the same model,
decoding, config and QA files made them.

* A: every writing command (train, eval, data mini, report, index) refuses a folder or file it did not make,
  ``~`` means the home folder for logs and checkpoints alike, an index behind a symbolic link is rebuilt
  where the link points;
* B: a real TRL run (tiny random model, 3 GRPO steps) is resumed after a kill before the first complete
  checkpoint, with torn log lines, with an incomplete checkpoint and with an edited config.toml;
* C: ``hindsearch eval`` records what made its rows and refuses a rerun that differs (``--fresh`` starts anew).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hindsearch.cli import main
from hindsearch.fsutil import OUTPUT_MARKER, STAGING_NAME, checkpoint_problem
from conftest import one_line_error  # noqa: E402  (the shared CLI-error check)

pytestmark = pytest.mark.timeout(600)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}




TINY = ['model.name="tiny-random"', 'model.device="cpu"', "train.questions_per_step=2", "rollout.num_generations=2",
        "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=1024", "train.lr=0.01",
        "train.kl_coef=0.04", "warmup.enabled=false", "train.samples_per_step=2", "train.eval_limit=2"]


def tiny_config(path: Path, world: Path, **extra: str) -> Path:
    """A TOML config of the tiny run (``extra``: more ``key = value`` lines at the top)."""
    from hindsearch.config import Config

    cfg = Config.load(None, TINY + [f'data.world_dir="{world}"', "data.world_entities=60"])
    text = cfg.to_toml()
    lines = [f"{k} = {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + ("\n" if lines else "") + "\n".join(ln for ln in text.splitlines()
                                                                          if not ln.startswith(tuple(extra))) + "\n")
    return path


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working folder with a user's folder, a plain file, a home folder with files, and a tiny config."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export PATH\n")
    monkeypatch.setenv("HOME", str(home))
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("three years of work\n")
    (user / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
    (user / "config.toml").write_text("# my own notes\n")
    (user / "summary.json").write_text("{}\n")
    (user / "results.md").write_text("# my results\n")
    (user / "corpus.jsonl").write_text('{"id": "x", "contents": "mine"}\n')
    (tmp_path / "shared").mkdir()
    tiny_config(tmp_path / "tiny.toml", tmp_path / "world")
    return tmp_path


# ---------------------------------------------------------------- A: every output folder guarded
def test_train_refuses_any_folder_it_did_not_make(sandbox, capsys):
    (sandbox / "link").symlink_to(sandbox / "user")
    before = snapshot(sandbox)
    for out, needle in (("user", "user: folder holds files hindsearch did not write"),
                        ("link", "link: folder holds files hindsearch did not write"),
                        ("~", f"{sandbox / 'home'}: folder holds files hindsearch did not write"),
                        (".", "current folder"), ("/", "current folder or a folder above it"),
                        (str(sandbox), "current folder")):
        assert main(["train", "--config", "tiny.toml", "--out", out]) == 1, out
        one_line_error(capsys, "hindsearch train: error: --out", needle, "choose a new")
    tiny_config(sandbox / "empty-out.toml", sandbox / "world", out='""')
    assert main(["train", "--config", "empty-out.toml"]) == 1
    one_line_error(capsys, "out = ''", "pass --out")
    assert snapshot(sandbox) == {**before, "empty-out.toml": (sandbox / "empty-out.toml").read_bytes()}
    assert not (sandbox / "~").exists() and not (sandbox / "world").exists()  # refused before any data is made


def test_eval_mini_sft_and_report_refuse_folders_and_files_they_did_not_make(sandbox, capsys):
    run = sandbox / "run"
    run.mkdir()
    (run / OUTPUT_MARKER).write_text(json.dumps({"kind": "run"}))
    (run / "config.toml").write_text('method = "grpo"\n')
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 0.5, "reward": 0.1 * i}) + "\n"
                                               for i in (1, 2)))
    (sandbox / "qa.jsonl").write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    before = snapshot(sandbox)
    ev = ["eval", "--model", "no-such/model", "--data", "d=qa.jsonl", "--no-progress"]
    for argv, needles in [
        ([*ev, "--out", "user"], ["--out user: folder holds files hindsearch did not write"]),
        ([*ev, "--out", "~"], [f"--out {sandbox / 'home'}: folder holds files"]),
        ([*ev, "--out", "run"], ["--out run: is a hindsearch run folder, not an evaluation folder"]),
        ([*ev, "--out", "."], ["current folder"]),
        (["data", "mini", "--shared", "shared", "--out", "user"], ["--out user: folder holds files hindsearch did not"]),
        (["data", "mini", "--shared", "shared", "--out", "run"], ["is a hindsearch run folder"]),
        (["data", "mini", "--shared", "shared", "--out", "shared"], ["holds the input shared"]),
        (["sft", "--config", "tiny.toml", "--out", "user"], ["--out user: folder holds files hindsearch did not"]),
        (["sft", "--config", "tiny.toml", "--out", "run"], ["is a hindsearch run folder, not a warm-up folder"]),
        (["report", "run", "--out", "run/metrics.jsonl"], ["run/metrics.jsonl: exists and is not a hindsearch report"]),
        (["report", "run", "--out", "run/config.toml"], ["run/config.toml: exists and is not a hindsearch report"]),
        (["report", "run", "--out", "user/thesis.tex"], ["user/thesis.tex: exists and is not a hindsearch report"]),
        (["report", "run", "--out", "run"], ["--out run: is a folder"]),
    ]:
        assert main(argv) == 1, argv
        one_line_error(capsys, f"hindsearch {argv[0]}", *needles)
        assert snapshot(sandbox) == before, argv
    # what is allowed: a new page, then the same page again (an earlier report is replaced), in '~' too
    assert main(["report", "run"]) == 0 and main(["report", "run"]) == 0
    assert main(["report", "run", "--out", "~/r.html"]) == 0
    assert (sandbox / "home" / "r.html").read_text().count("<title>hindsearch run:") == 1
    assert not (sandbox / "~").exists()
    assert {k: v for k, v in snapshot(sandbox).items() if k in before} == before


def test_index_behind_a_symlink_is_rebuilt_where_it_points(tmp_path):
    from test_faults import CORPUS, leftovers, write_corpus

    corpus = write_corpus(tmp_path / "c.jsonl")
    real = tmp_path / "store" / "idx-v1"
    real.parent.mkdir()
    assert main(["index", "--corpus", str(corpus), "--out", str(real)]) == 0
    link = tmp_path / "idx"
    link.symlink_to(real)
    small = write_corpus(tmp_path / "c5.jsonl", CORPUS[:5])
    assert main(["index", "--corpus", str(small), "--out", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == real.resolve()  # still the user's link, to the same place
    assert json.loads((real / "index.json").read_text())["n_docs"] == 5
    assert leftovers(tmp_path) == [] and leftovers(real.parent) == []  # no .old-* link or folder left


# ---------------------------------------------------------------- B: resume
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A real 3-step GRPO run (tiny random model, TRL trainer) with a checkpoint after every step."""
    from hindsearch.config import Config
    from hindsearch.train.run import run_train

    root = tmp_path_factory.mktemp("trained")
    mp = pytest.MonkeyPatch()
    mp.setenv("HINDSEARCH_CACHE", str(root / "cache"))
    try:
        cfg = Config.load(None, TINY + [f'data.world_dir="{root / "world"}"', "data.world_entities=60",
                                        "train.steps=3", "train.save_steps=1", f'out="{root / "run"}"'])
        run_train(cfg, log=lambda m: None)
    finally:
        mp.undo()
    return root / "run"


@pytest.fixture
def run_copy(trained_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HINDSEARCH_CACHE", str(trained_run.parent / "cache"))
    dst = tmp_path / "run"
    shutil.copytree(trained_run, dst, symlinks=True)
    cfg = (dst / "config.toml").read_text().replace(str(trained_run), str(dst))
    (dst / "config.toml").write_text(cfg)
    if (dst / OUTPUT_MARKER).exists():
        marker = json.loads((dst / OUTPUT_MARKER).read_text())
        marker["config"]["out"] = str(dst)
        (dst / OUTPUT_MARKER).write_text(json.dumps(marker))
    return dst


def steps_of(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def resume(run: Path, **kw) -> list[str]:
    from hindsearch.train.run import run_train

    lines: list[str] = []
    run_train(resume=run, log=lines.append, **kw)
    return lines


def test_resume_before_the_first_complete_checkpoint_writes_no_step_twice(run_copy):
    run = run_copy
    samples = sorted(steps_of(run / "samples.jsonl"))
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]
    # a SIGKILL during the first save: no checkpoint-N, only the torn save in the staging folder
    ck = run / "checkpoints"
    for p in ck.glob("checkpoint-*"):
        shutil.rmtree(p)
    (ck / STAGING_NAME / "checkpoint-1").mkdir(parents=True)
    shutil.rmtree(run / "final")
    lines = resume(run)
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]  # not [1, 2, 3, 1, 2, 3]
    assert sorted(steps_of(run / "samples.jsonl")) == samples
    assert any("no complete checkpoint, starting from step 0" in m and "metrics.jsonl" in m for m in lines), lines


def test_torn_last_log_lines_are_dropped_with_a_message_naming_the_file(run_copy):
    run = run_copy
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "loss": 0.')
    with (run / "samples.jsonl").open("a") as f:
        f.write('{"step": 3, "question": "Who')
    lines = resume(run)
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert any(f"{run / name}: dropped a torn last line" in m for m in lines), (name, lines)
        assert all(json.loads(x) for x in (run / name).read_text().splitlines())
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]


def test_checkpoint_completeness_is_checked_file_by_file(run_copy):
    ck = run_copy / "checkpoints"
    good = sorted(ck.glob("checkpoint-*"))[-1]
    assert checkpoint_problem(good) is None
    breakages = {
        "optimizer.pt": lambda p: p.unlink(),
        "scheduler.pt": lambda p: p.unlink(),
        "rng_state.pth": lambda p: p.unlink(),
        "model.safetensors": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
        "trainer_state.json": lambda p: p.write_text('{"global_step": 3'),
    }
    for name, breaks in breakages.items():
        for with_marker in (True, False):  # read back with the sizes written at save time, and without
            bad = ck.parent / f"bad-{name}-{with_marker}"
            shutil.copytree(good, bad)
            if not with_marker:
                (bad / "hindsearch-complete.json").unlink()
            breaks(bad / name)
            why = checkpoint_problem(bad)
            assert why and name in why, (name, with_marker, why)
    # the sizes recorded at save time catch a file cut short that would still parse
    bad = ck.parent / "bad-optimizer-size"
    shutil.copytree(good, bad)
    with (bad / "optimizer.pt").open("ab") as f:
        f.write(b"\0")
    assert "optimizer.pt" in checkpoint_problem(bad)


def test_resume_falls_back_to_the_newest_complete_checkpoint_and_names_the_one_set_aside(run_copy):
    run = run_copy
    ck = run / "checkpoints"
    newest = sorted(ck.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    assert newest.name == "checkpoint-3"
    (newest / "optimizer.pt").unlink()  # AdamW would restart from zero
    shutil.rmtree(run / "final")
    lines = resume(run)
    assert any("skipping checkpoint-3" in m and "optimizer.pt" in m and ".torn-checkpoint-3" in m for m in lines), lines
    assert any("from checkpoint-2" in m for m in lines), lines
    assert (ck / ".torn-checkpoint-3").is_dir() and checkpoint_problem(ck / "checkpoint-3") is None  # step 3 redone
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3]


def test_an_incomplete_save_is_never_published(tmp_path):
    from test_faults import tiny_trainer

    ck = tmp_path / "ck"
    trainer = tiny_trainer(ck, steps=2)
    real = trainer._save_optimizer_and_scheduler

    def loses_the_scheduler(output_dir):  # a save that "succeeds" without one of its files
        real(output_dir)
        if trainer.state.global_step == 2:
            os.remove(os.path.join(output_dir, "scheduler.pt"))

    trainer._save_optimizer_and_scheduler = loses_the_scheduler
    with pytest.raises(RuntimeError, match=r"checkpoint-2 was not written completely \(no scheduler.pt\)"):
        trainer.train()
    assert sorted(p.name for p in ck.glob("checkpoint-*")) == ["checkpoint-1"]


def test_an_edited_config_is_refused_on_resume_unless_allowed_and_recorded(run_copy, capsys):
    run = run_copy
    text = (run / "config.toml").read_text()
    assert "lr = 0.01\n" in text and "num_generations = 2\n" in text
    (run / "config.toml").write_text(text.replace("lr = 0.01\n", "lr = 0.02\n", 1)
                                     .replace("num_generations = 2\n", "num_generations = 4\n"))
    before = snapshot(run)
    assert main(["train", "--resume", str(run)]) == 1
    one_line_error(capsys, "config.toml was edited since the run started", "rollout.num_generations = 2 -> 4",
                   "train.lr", "--allow-config-change")
    assert snapshot(run) == before
    assert main(["train", "--resume", str(run), "--allow-config-change"]) == 0
    assert "config change allowed by --allow-config-change: train.lr = 0.01 -> 0.02" in capsys.readouterr().out
    marker = json.loads((run / OUTPUT_MARKER).read_text())
    changes = {c["key"]: (c["old"], c["new"]) for c in marker["config_changes"][-1]["changes"]}
    assert changes == {"train.lr": (0.01, 0.02), "rollout.num_generations": (2, 4)}
    assert marker["config_changes"][-1]["allowed"] and marker["config_changes"][-1]["from_step"] == 4  # 3 were done
    assert marker["config"]["train"]["lr"] == 0.02
    assert main(["train", "--resume", str(run)]) == 0  # the allowed change is the run's config now
    # a key that changes no training step (how dev is evaluated) is accepted, and said
    (run / "config.toml").write_text((run / "config.toml").read_text().replace("eval_limit = 2", "eval_limit = 1"))
    lines = resume(run)
    assert any("config change: train.eval_limit = 2 -> 1 (changes no training step)" in m for m in lines), lines


def test_a_run_folder_without_its_recorded_config_is_refused_on_resume(run_copy, capsys):
    """A run folder whose marker holds no config (written before runs recorded theirs) gets one error naming the
    folder, and nothing in it changes."""
    marker = json.loads((run_copy / OUTPUT_MARKER).read_text())
    del marker["config"]
    (run_copy / OUTPUT_MARKER).write_text(json.dumps(marker))
    before = snapshot(run_copy)
    assert main(["train", "--resume", str(run_copy)]) == 1
    one_line_error(capsys, str(run_copy), "written by an older hindsearch and cannot be resumed")
    assert snapshot(run_copy) == before


# ---------------------------------------------------------------- C: eval rows tied to what made them
def test_eval_reuses_rows_only_when_the_same_thing_made_them(tmp_path, capsys, tok, model):
    from hindsearch.data.world import generate_world
    from hindsearch.retrieval.factory import build_index

    world = generate_world(seed=0, n_entities=40)
    dev = world.splits["dev"][:2]
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in dev))
    other = tmp_path / "other.jsonl"  # the same ids, other questions
    other.write_text("".join(json.dumps({**r.to_dict(), "question": f"Which {i}?", "golden_answers": ["x"]}) + "\n"
                             for i, r in enumerate(dev)))
    build_index(world.passages, tmp_path / "index", show_progress=False)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "out"

    def ev(*extra: str, data: Path = qa, model: str = "tiny-random") -> int:
        return main(["eval", "--model", model, "--index", str(tmp_path / "index"), "--data", f"d={data}",
                     "--out", str(out), "--no-progress", "--set", "rollout.max_turns=1",
                     "--set", "rollout.max_new_tokens_per_turn=4", *extra])

    assert ev() == 0
    rows = (out / "trajectories.jsonl").read_bytes()
    capsys.readouterr()
    assert ev() == 0 and (out / "trajectories.jsonl").read_bytes() == rows  # the same: every row reused
    capsys.readouterr()
    before = snapshot(out)
    for extra, kw, needle in [
        (["--sample"], {}, "its rows were made with greedy decoding with seed 0, this evaluation uses sampling with seed 0"),
        (["--seed", "3"], {}, "greedy decoding with seed 0, this evaluation uses greedy decoding with seed 3"),
        (["--set", "rollout.max_turns=2"], {}, "rollout.max_turns = 1, this evaluation has rollout.max_turns = 2"),
        ([], {"data": other}, f"benchmark 'd': its rows were made from {qa}, this evaluation reads {other}"),
        ([], {"model": str(tmp_path / "model")}, f"made by the model tiny-random, this evaluation uses {tmp_path / 'model'}"),
    ]:
        assert ev(*extra, **kw) == 1, extra
        one_line_error(capsys, f"hindsearch eval: error: --out {out}:", needle, "--fresh")
        assert snapshot(out) == before, extra
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert marker["kind"] == "eval" and marker["model"] == {"name": "tiny-random"} and marker["config_sha256"]
    assert marker["data"]["d"]["sha256"] and marker["settings"] == {"greedy": True, "seed": 0}
    # the QA file edited in place (same path, new content)
    qa_text = qa.read_text()
    qa.write_text(other.read_text())
    assert ev() == 1
    one_line_error(capsys, f"{qa} before the file changed")
    qa.write_text(qa_text)
    # --fresh starts anew with the new settings, and records them
    assert ev("--sample", "--fresh") == 0
    assert json.loads((out / OUTPUT_MARKER).read_text())["settings"] == {"greedy": False, "seed": 0}
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2
    # a folder without the record (written before it, or by someone else): not ours, refused even with --fresh
    (out / OUTPUT_MARKER).unlink()
    capsys.readouterr()
    rows = (out / "trajectories.jsonl").read_bytes()
    assert ev() == 1
    one_line_error(capsys, "not an evaluation folder")
    assert ev("--fresh") == 1
    one_line_error(capsys, "not an evaluation folder")
    assert (out / "trajectories.jsonl").read_bytes() == rows  # nothing lost


def test_probe_out_is_guarded(tmp_path):
    """probe writes probe.json / probe.md only into a new or empty folder or a folder a probe belongs in: a user's
    folder and the current folder are refused before anything is probed."""
    from hindsearch.fsutil import UnsafeOutput, claim_output, output_kind
    from hindsearch.study.probe import guard_probe_out

    user = tmp_path / "notes"
    user.mkdir()
    (user / "probe.md").write_text("my notes")
    (user / "other.txt").write_text("keep")
    for out in (user, ".", ""):
        with pytest.raises(UnsafeOutput):
            guard_probe_out(out)
    assert (user / "probe.md").read_text() == "my notes"
    new = guard_probe_out(tmp_path / "new")
    assert output_kind(new) == "probe"
    claim_output(tmp_path / "cmp", "compare")
    (tmp_path / "cmp" / "compare.json").write_text("{}")
    assert guard_probe_out(tmp_path / "cmp") == tmp_path / "cmp"  # compare --probe writes into its folder
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert guard_probe_out(model) == model  # the default: beside the checkpoint
