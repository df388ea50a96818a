"""Corpus reader: both field styles, ids, bad rows with file:line, skip_bad counting, real files."""

import json
from pathlib import Path

import pytest

from hindsearch.data.corpus import CorpusError, CorpusStats, iter_corpus, read_corpus, write_corpus
from hindsearch.records import Passage

from shared_data import shared  # noqa: E402 - tests dir on sys.path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_both_field_styles_and_ids(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [
        json.dumps({"id": "a", "contents": '"Alpha"\nfirst text'}),
        json.dumps({"_id": 7, "title": "Beta", "text": "second text"}),
        "",
        json.dumps({"docid": "d3", "text": "no title here"}),
        json.dumps({"contents": '"Gamma"\nno id'}),
    ])
    ps = read_corpus(path)
    assert [p.id for p in ps] == ["a", "7", "d3", "5"]  # missing id -> line number (blank line 3 skipped)
    assert ps[0].contents == '"Alpha"\nfirst text' and ps[0].bare_title == "Alpha"
    assert ps[1].contents == '"Beta"\nsecond text' and ps[1].text == "second text"
    assert ps[2].contents == "no title here"


@pytest.mark.parametrize("row, reason", [
    ('{"id": "x", "contents": "ok"', "invalid JSON"),
    (json.dumps({"id": "x"}), "no text"),
    (json.dumps({"id": "x", "contents": "   "}), "empty"),
    (json.dumps({"id": "x", "contents": 5}), "'contents' must be a string"),
    (json.dumps({"id": ["x"], "contents": "ok"}), "'id' must be a string or integer"),
    (json.dumps({"title": 3, "text": "ok"}), "'title' must be a string"),
    (json.dumps(["not", "an", "object"]), "expected a JSON object"),
])
def test_bad_row_names_file_and_line(tmp_path, row, reason):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"id": "1", "contents": "fine"}), json.dumps({"id": "2", "contents": "fine"}), row])
    with pytest.raises(CorpusError) as e:
        read_corpus(path)
    assert f"{path}:3:" in str(e.value) and reason in str(e.value)
    assert isinstance(e.value, ValueError)


def test_skip_bad_counts(tmp_path):
    path = write_lines(tmp_path / "mixed.jsonl", [
        json.dumps({"id": "1", "contents": "one"}),
        "{broken",
        json.dumps({"id": "3"}),
        json.dumps({"id": "4", "contents": "four"}),
    ])
    stats = CorpusStats()
    ps = read_corpus(path, skip_bad=True, stats=stats)
    assert [p.id for p in ps] == ["1", "4"]
    assert (stats.rows, stats.skipped) == (2, 2)
    assert stats.errors[0].startswith(f"{path}:2:") and stats.errors[1].startswith(f"{path}:3:")


def test_streams_lazily(tmp_path):
    path = write_lines(tmp_path / "c.jsonl", [json.dumps({"id": "1", "contents": "one"}), "{broken"])
    it = iter_corpus(path)
    assert next(it).id == "1"  # the first row is yielded before the bad one is read
    with pytest.raises(CorpusError):
        next(it)


def test_json_list_and_roundtrip(tmp_path):
    src = tmp_path / "hippo.json"
    src.write_text(json.dumps([{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}]))
    ps = read_corpus(src)
    assert [(p.id, p.contents) for p in ps] == [("1", '"A"\nalpha'), ("2", '"B"\nbeta')]
    out = tmp_path / "out" / "c.jsonl"
    assert write_corpus(out, ps + [Passage("ü", '"Ü"\nunicode ✓')]) == 3
    assert read_corpus(out) == ps + [Passage("ü", '"Ü"\nunicode ✓')]
    bad = tmp_path / "bad.json"
    bad.write_text('{"title": "not a list"}')
    with pytest.raises(CorpusError, match="must be a list"):
        read_corpus(bad)
    bad.write_text('[{"title": "A", "text": "x"}, {"title": "B"}]')
    with pytest.raises(CorpusError, match=r"bad.json:2: bad corpus item: no text"):
        read_corpus(bad)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_corpus(tmp_path / "nope.jsonl")


def test_real_corpora():
    toy = shared("flashrag-toy/sample_data.jsonl")
    hippo = shared("hipporag/sample_corpus.json")
    ps = read_corpus(toy)
    assert len(ps) == 1000 and ps[0].id == "0" and ps[0].bare_title == "Evan Morris"
    assert len({p.id for p in ps}) == 1000
    hp = read_corpus(hippo)
    assert hp and all(p.title.startswith('"') for p in hp)
