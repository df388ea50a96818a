"""Lose nothing, part three (issue 41, items 1-7): a user's file in an index folder, signals during training,
silent acceptances, byte-order marks, messages that name the file, and one-line plugin and reward errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import one_line_error  # the shared CLI-error check
from hindsearch.cli import main

pytestmark = pytest.mark.timeout(300)

CORPUS = [{"id": str(i), "contents": f'"Title {i}"\nword{i} common text number {i}'} for i in range(12)]


def write_corpus(path: Path, rows=CORPUS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


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
    (['out=""'], ["out = ''", "pass --out"]),
])
def test_silent_acceptances_are_refused_before_anything_is_written(workdir, capsys, sets, needles):
    (workdir / "mine.txt").write_text("keep\n")
    before = snapshot(workdir)
    argv = [a for s in sets for a in ("--set", s)]
    assert main(["train", "--config", "tiny-cpu", *argv, "--out", "run"] if 'out=""' not in sets
                else ["train", "--config", "tiny-cpu", *argv]) == 1
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
