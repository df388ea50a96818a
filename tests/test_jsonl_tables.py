"""The one JSONL reader (``fsutil.iter_jsonl``: strict, skip-bad, drop-torn-tail, yield-bad) and the one markdown
table renderer (``tables.markdown_table``), on real files: a bad middle line, a torn tail, a FIFO, a size cap, and
the readers built on it (corpus, warm-up demonstrations, run logs)."""

from __future__ import annotations

import gzip
import json
import os
import threading
from pathlib import Path

import pytest

from hindsearch.eval import drop_error_rows, read_done
from hindsearch.fsutil import BadJsonl, BadLine, iter_jsonl, read_jsonl
from hindsearch.records import Trajectory
from hindsearch.tables import markdown_table

GOOD = [{"step": 1}, {"step": 3}]


@pytest.fixture
def both(tmp_path: Path) -> Path:
    """Line 2 is bad and the last line (4) is torn: a killed writer's half row, no newline."""
    p = tmp_path / "m.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": \n\n{"step": 3}\n{"step": 4, "lo')
    return p


@pytest.fixture
def torn(tmp_path: Path) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"step": 1}\n{"step": 3}\n{"step": 4, "lo')
    return p


def test_strict_names_the_first_bad_line(both: Path, torn: Path):
    with pytest.raises(BadJsonl, match=rf"^{both}:2: invalid JSON: Expecting value \(column 1\)$"):
        read_jsonl(both)
    with pytest.raises(BadJsonl, match=rf"^{torn}:3: invalid JSON"):  # strict: a torn tail is an error too
        read_jsonl(torn, "strict")


def test_skip_bad_keeps_the_good_rows_and_names_each_skipped_line(both: Path):
    bad: list[str] = []
    assert list(iter_jsonl(both, "skip-bad", bad)) == [(1, GOOD[0]), (4, GOOD[1])]
    assert [b.split(": ")[0] for b in bad] == [f"{both}:2", f"{both}:5"], bad
    bad = []
    assert read_jsonl(both, "skip-bad", bad, name="m.jsonl") == GOOD and bad[0].startswith("m.jsonl:2: invalid JSON")


def test_drop_torn_tail_drops_only_an_unterminated_last_line(both: Path, torn: Path):
    dropped: list[str] = []
    assert read_jsonl(torn, "drop-torn-tail", dropped) == GOOD
    assert dropped == [f"{torn}: dropped a torn last line 3 (no newline at its end: a write cut short)"]
    with pytest.raises(BadJsonl, match=rf"^{both}:2: "):  # a bad line in the middle is still an error
        read_jsonl(both, "drop-torn-tail")
    torn.write_bytes(torn.read_bytes() + b"\n")  # complete (has its newline) but bad: corrupt, not torn
    with pytest.raises(BadJsonl, match=rf"^{torn}:3: invalid JSON"):
        read_jsonl(torn, "drop-torn-tail")
    torn.write_bytes('{"step": 1}\n{"q": "é'.encode()[:-1])  # cut inside a UTF-8 character: torn too
    assert read_jsonl(torn, "drop-torn-tail") == [{"step": 1}]
    torn.write_bytes(b'{"step": 1}\n[4]')  # parses, but is not an object: never torn
    with pytest.raises(BadJsonl, match=rf"^{torn}:2: not a JSON object$"):
        read_jsonl(torn, "drop-torn-tail")
    assert read_jsonl(torn, objects=False) == [{"step": 1}, [4]]


def test_yield_bad_hands_each_bad_line_to_the_caller_in_file_order(both: Path):
    rows = list(iter_jsonl(both, "yield-bad"))
    assert [(i, type(v)) for i, v in rows] == [(1, dict), (2, BadLine), (4, dict), (5, BadLine)], rows
    assert rows[1][1] == BadLine("invalid JSON: Expecting value (column 1)")
    assert [v for _, v in rows if isinstance(v, dict)] == GOOD


def test_a_byte_order_mark_and_gzip_are_read_past(tmp_path: Path):
    p = tmp_path / "b.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"step": 1}\n{"step": 3}\n')  # what a Windows editor saves
    assert read_jsonl(p) == GOOD
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert read_jsonl(gz) == GOOD
    gz.write_bytes(gzip.compress(p.read_bytes())[:-12])  # a cut download: an error, never a short read
    with pytest.raises((EOFError, OSError)):
        read_jsonl(gz)


def test_the_readers_built_on_it_name_a_bad_line_and_lose_nothing(tmp_path: Path):
    """The corpus, the warm-up demonstrations and a run's logs read through ``iter_jsonl``: a line that is not
    UTF-8 is that line's error (file and line named, skippable where the reader skips), a torn log tail is
    dropped with a message."""
    from hindsearch.data.corpus import CorpusError, CorpusStats, read_corpus
    from hindsearch.train.demos import load_demos
    from hindsearch.train.run import read_jsonl_rows

    c = tmp_path / "c.jsonl"
    c.write_bytes(b'{"id": "a", "contents": "x"}\n{"id": "b", "contents": "\xff"}\n'
                  b'{"id": "c", "contents": "z"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: bad corpus line: not UTF-8 \(byte 0xff at column 26\)"):
        read_corpus(c)
    stats = CorpusStats()
    assert [p.id for p in read_corpus(c, skip_bad=True, stats=stats)] == ["a", "c"]
    assert stats.skipped == 1 and stats.errors[0].startswith(f"{c}:2: bad corpus line: not UTF-8"), stats
    d = tmp_path / "d.jsonl"
    demo = {"question": "q", "completion_text": "<answer>a</answer>"}
    d.write_bytes(json.dumps(demo).encode() + b'\n{"question": "\xff"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:2: bad trajectory: not UTF-8 \(byte 0xff at column 15\)"):
        load_demos(d)
    m = tmp_path / "metrics.jsonl"
    m.write_bytes(b'{"step": 1}\n{"step": "\xff"}\n{"step": 3}\n')
    with pytest.raises(BadJsonl, match=r"metrics\.jsonl:2: not UTF-8 \(byte 0xff at column 11\); remove the"):
        read_jsonl_rows(m)
    m.write_bytes(b'{"step": 1}\n{"step": 2, "lo')
    said: list[str] = []
    assert read_jsonl_rows(m, said.append) == [{"step": 1}]
    assert said == [f"{m}: dropped a torn last line 2 (no newline at its end: a write cut short); "
                    f"its step is redone"]


def test_reader_edges(tmp_path: Path):
    assert read_jsonl(tmp_path / "absent.jsonl") == []
    with pytest.raises(ValueError, match="mode 'lenient' is not one of strict, skip-bad, drop-torn-tail, yield-bad$"):
        read_jsonl(tmp_path / "absent.jsonl", "lenient")
    p = tmp_path / "u.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n' + b'{"a": 2}\n' * 4)
    with pytest.raises(BadJsonl, match=r"u\.jsonl:2: not UTF-8 \(byte 0xff at column 8\)"):
        read_jsonl(p)
    bad: list[str] = []
    assert read_jsonl(p, "skip-bad", bad, max_bytes=30) == [{"a": 1}, {"a": 2}]
    assert bad[-1] == f"{p}:4: past the first 0 MiB; the rest is not read", bad


def test_a_fifo_is_refused_without_blocking(tmp_path: Path):
    fifo = tmp_path / "f.jsonl"
    os.mkfifo(fifo)
    result: dict[str, object] = {}

    def read() -> None:
        try:
            read_jsonl(fifo)
        except BadJsonl as e:
            result["error"] = str(e)
        bad: list[str] = []
        result["skipped"] = (read_jsonl(fifo, "skip-bad", bad), bad)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert result["error"] == f"{fifo}: a FIFO, not a regular file; not read"
    assert result["skipped"] == ([], [f"{fifo}: a FIFO, not a regular file; not read"])


def _row(qid: str, **extra: object) -> str:
    t = Trajectory(qid=qid, question="q", golden_answers=["a"], prompt_ids=[])
    return json.dumps({**t.to_dict(), "benchmark": "world", **extra}) + "\n"


def test_an_evaluation_resumes_past_a_torn_tail_even_after_error_rows_are_dropped(tmp_path: Path):
    """``drop_error_rows`` rewrites the file before ``read_done`` reads it: the torn tail must stay torn (no newline
    added), so that ``read_done`` drops it from the file instead of failing on it."""
    p = tmp_path / "trajectories.jsonl"
    p.write_text(_row("1") + _row("2", errors=["boom"]) + _row("3")[:40])
    assert drop_error_rows(p) == 1
    assert sorted(read_done(p)) == [("world", "1")]
    assert p.read_text() == _row("1")  # the torn line is gone from the file too
    p.write_text(_row("1") + "{oops\n")  # a complete bad last line is an error naming it, and nothing is dropped
    with pytest.raises(ValueError, match=r"trajectories\.jsonl:2: invalid JSON.*remove the line or the file"):
        read_done(p)
    assert p.read_text() == _row("1") + "{oops\n"


def test_markdown_table():
    assert markdown_table(["a", "b"], [[1, ""], ["x", 2.5]]) == "| a | b |\n|---|---|\n| 1 |  |\n| x | 2.5 |"
    assert markdown_table(("only",), []) == "| only |\n|---|"
    assert markdown_table(["m", "n"], iter([("g", 3)])).splitlines()[-1] == "| g | 3 |"
