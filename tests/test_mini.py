"""``data mini`` (mini-wiki + filtered benchmarks); ``data fetch`` is tested in ``test_fetch.py``."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import pytest

from hindsearch.cli import data as data_cli
from hindsearch.data.corpus import read_corpus
from hindsearch.data.mini import BENCHMARKS, build_mini, fast_normalize, passage_key
from hindsearch.data.qa import load_qa
from hindsearch.answers import answer_in_text, normalize_answer

from shared_data import SHARED, shared  # noqa: E402 - tests dir on sys.path


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    data_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_fast_normalize_matches_rewards():
    samples = ["The Beatles!", "an apple, a day", "Théâtre de l'Odéon", "the’s thé", "A.B.C. (1999)", "  x\ty  ",
               "Ænima—the album", "Jean-Paul Sartre", "an", "Then a theory"]
    rng = random.Random(0)
    alphabet = "ab thean.,'’é-Ü  \n"
    samples += ["".join(rng.choice(alphabet) for _ in range(30)) for _ in range(300)]
    for s in samples:
        assert fast_normalize(s) == normalize_answer(s), s


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    shared()
    out = tmp_path_factory.mktemp("mini")
    t0 = time.perf_counter()
    meta = build_mini(SHARED, out, log=lambda s: None)
    seconds = time.perf_counter() - t0
    return out, meta, seconds, read_corpus(out / "corpus.jsonl")


def test_mini_counts_and_corpus(mini):
    out, meta, seconds, passages = mini
    assert seconds < 120  # well under a minute on an idle machine
    assert set(meta["benchmarks"]) == set(BENCHMARKS) and not meta["missing_sources"]
    assert json.loads((out / "mini.json").read_text()) == meta
    for name, b in meta["benchmarks"].items():
        assert 0 < b["kept"] <= b["total"], name
        assert len(load_qa(out / f"{name}.jsonl")) == b["kept"]
    assert meta["benchmarks"]["hotpotqa"] == {**meta["benchmarks"]["hotpotqa"], "kept": 500, "total": 500}
    assert meta["benchmarks"]["2wiki"]["kept"] < 200  # rows shipped without paragraphs are dropped
    assert len(passages) == meta["passages"] > 25000
    assert len({p.id for p in passages}) == len(passages)
    assert len({passage_key(p.bare_title, p.text) for p in passages}) == len(passages)
    assert all(p.contents.startswith('"') for p in passages)


def test_mini_kept_questions_have_evidence(mini):
    out, meta, _, passages = mini
    by_id = {p.id: p for p in passages}
    for name, (_, rule) in BENCHMARKS.items():
        for r in load_qa(out / f"{name}.jsonl", limit=150):
            assert r.data_source == name
            if rule == "multi":
                ps = [by_id[i] for i in r.metadata["evidence_ids"]]
                assert set(r.evidence) <= {p.bare_title for p in ps}
            else:
                ids = r.metadata["answer_passage_ids"]
                assert ids and all(answer_in_text(r.golden_answers, by_id[i].contents) for i in ids)


@pytest.mark.slow
def test_mini_dropped_single_hop_questions_have_no_answer_passage(mini):
    out, _, _, passages = mini
    norm = [f" {fast_normalize(p.contents)} " for p in passages]
    kept = {r.id for r in load_qa(out / "bamboogle.jsonl")}
    dropped = [r for r in load_qa(SHARED / "ros-subsample/bamboogle/test.jsonl") if r.id not in kept]
    assert dropped
    for r in dropped:
        answers = [f" {fast_normalize(a)} " for a in r.golden_answers if fast_normalize(a)]
        assert not any(a in t for a in answers for t in norm), r


def _tiny_shared(root: Path, reverse: bool = False) -> Path:
    """A small shared-data folder with one corpus, one single-hop and one multi-hop set."""
    rows = [{"id": "a", "contents": "Velmor\nVelmor is a city founded by Aldric Morrow."},
            {"id": "b", "contents": '"Ossel"\nThe Ossel is a river.'},
            {"id": "c", "contents": "Velmor\nVelmor is a city founded by Aldric Morrow."}]  # duplicate
    if reverse:
        rows = rows[::-1]
    (root / "wiki18-slice").mkdir(parents=True)
    (root / "wiki18-slice/wiki18_passages_from_search_r1_runs.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    (root / "ros-subsample/nq").mkdir(parents=True)
    (root / "ros-subsample/nq/test.jsonl").write_text(
        json.dumps({"id": "q1", "question": "Who founded Velmor?", "golden_answers": ["Aldric Morrow"]}) + "\n"
        + json.dumps({"id": "q2", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"]}) + "\n")
    (root / "migres").mkdir()
    para = {"title": "Kesh", "paragraph_text": "Kesh lies on the Ossel.", "is_supporting": True}
    (root / "migres/musique.json").write_text(
        json.dumps({"id": "2hop__1_2", "question": "Where is Kesh?", "answer": "Ossel", "answer_aliases": [],
                    "paragraphs": [para, {**para, "title": "Other", "is_supporting": False}]}) + "\n")
    return root


def test_mini_tiny_folder_ids_stable_and_cli(tmp_path, capsys):
    a = build_mini(_tiny_shared(tmp_path / "s1"), tmp_path / "o1", log=lambda s: None)
    build_mini(_tiny_shared(tmp_path / "s2", reverse=True), tmp_path / "o2", log=lambda s: None)
    p1, p2 = read_corpus(tmp_path / "o1/corpus.jsonl"), read_corpus(tmp_path / "o2/corpus.jsonl")
    assert len(p1) == 4 and {p.id: p.contents for p in p1} == {p.id: p.contents for p in p2}
    assert a["benchmarks"]["nq"] == {"source": "ros-subsample/nq/test.jsonl", "rule": "single", "total": 2, "kept": 1}
    assert a["benchmarks"]["musique"]["kept"] == 1 and "hotpotqa" not in a["benchmarks"]
    assert "ircot-hotpotqa/dev_subsampled.jsonl" in a["missing_sources"]
    assert run_cli(["data", "mini", "--shared", str(tmp_path / "s1"), "--out", str(tmp_path / "o3")]) == 0
    table = capsys.readouterr().out
    assert "mini-wiki: 4 passages" in table and "nq              1      2" in table
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_mini(tmp_path / "nowhere", tmp_path / "o4")
