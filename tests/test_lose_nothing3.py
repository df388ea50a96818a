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
