"""The fictional world: determinism, counts, answers in evidence, BM25 difficulty, caching, CLI."""

from __future__ import annotations

import collections
import json

import bm25s
import pytest
import Stemmer

from hindsearch.cli import data as data_cli
from hindsearch.data.corpus import read_corpus
from hindsearch.data.qa import load_qa
from hindsearch.data.world import ensure_world, generate_world, world_is_current
from hindsearch.answers import answer_in_text


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=0)


def _all(world):
    return [r for recs in world.splits.values() for r in recs]


def test_same_seed_same_world_other_seed_differs():
    a, b, c = generate_world(3, 300), generate_world(3, 300), generate_world(4, 300)
    assert a.passages == b.passages
    assert {k: [r.to_dict() for r in v] for k, v in a.splits.items()} == {
        k: [r.to_dict() for r in v] for k, v in b.splits.items()}
    assert a.passages != c.passages
    with pytest.raises(ValueError, match="n_entities"):
        generate_world(0, 10)


def test_default_counts_and_hop_balance(world):
    assert len(world.passages) == 2000
    assert {k: len(v) for k, v in world.splits.items()} == {"train": 2000, "dev": 200, "test": 200}
    for split, recs in world.splits.items():
        hops = collections.Counter(r.hops for r in recs)
        assert abs(hops[1] - hops[2]) <= 1, (split, hops)
        assert len({r.id for r in recs}) == len(recs)


def test_splits_disjoint(world):
    seen: dict[str, str] = {}
    for split, recs in world.splits.items():
        for r in recs:
            assert r.question not in seen, (r.question, split, seen.get(r.question))
            seen[r.question] = split


def test_passages_format(world):
    titles = [p.bare_title for p in world.passages]
    assert len(set(titles)) == len(titles) and len({p.id for p in world.passages}) == len(titles)
    for p in world.passages:
        assert p.contents.startswith(f'"{p.bare_title}"\n')
        assert 50 <= len(p.text.split()) <= 150, p.contents
        assert f"with {p.bare_title}." not in p.text  # filler never points at the entity itself


def test_answers_occur_in_evidence_and_metadata(world):
    text = {p.bare_title: p.text for p in world.passages}
    for r in _all(world):
        assert r.data_source == "world" and r.golden_answers and all(e in text for e in r.evidence)
        assert answer_in_text(r.golden_answers, text[r.evidence[-1]]), r
        assert r.metadata["relation"] and r.metadata["subject"] == r.evidence[0]
        if r.hops == 2:
            assert len(r.evidence) == 2 and r.metadata["bridge"] == r.evidence[1]
            assert len(r.metadata["hop_questions"]) == 2
            assert r.metadata["bridge"] in text[r.evidence[0]]  # the first passage names the bridge
            assert not answer_in_text(r.golden_answers, text[r.evidence[0]])  # but not the answer
        else:
            assert r.hops == 1 and len(r.evidence) == 1


def test_distractors_and_aliases(world):
    people = [e for e in world.entities.values() if e.kind == "person"]
    surnames = collections.Counter(e.name.split()[-1] for e in people)
    assert sum(c > 1 for c in surnames.values()) > 50  # shared surnames
    cities = [e.name for e in world.entities.values() if e.kind == "city"]
    affixes = ("New", "Port", "Upper", "Vale", "Falls")
    stems = collections.Counter(w for c in cities for w in c.split() if w not in affixes)
    assert any(c > 1 for c in stems.values())  # "Velmor" and "New Velmor"
    multi = [r for r in _all(world) if len(r.golden_answers) > 1]
    assert multi and all(len(r.golden_answers[0].split()) == 3 for r in multi)  # full name + short name
    relations = {r.metadata["relation"] for r in _all(world)}
    assert {"born_in", "capital", "spouse", "birth_country>capital", "author>born_in"} <= relations


def test_bm25_finds_one_hop_evidence_but_not_both_two_hop(world):
    st = Stemmer.Stemmer("english")
    model = bm25s.BM25()
    model.index(bm25s.tokenize([p.contents for p in world.passages], stopwords="en", stemmer=st,
                               show_progress=False), show_progress=False)
    titles = [p.bare_title for p in world.passages]

    def top3(queries):
        res, _ = model.retrieve(bm25s.tokenize(queries, stopwords="en", stemmer=st, show_progress=False), k=3,
                                show_progress=False)
        return [{titles[i] for i in row} for row in res]

    one = [r for r in _all(world) if r.hops == 1]
    two = [r for r in _all(world) if r.hops == 2]
    one_rate = sum(r.evidence[0] in got for r, got in zip(one, top3([r.question for r in one]))) / len(one)
    two_rate = sum(set(r.evidence) <= got for r, got in zip(two, top3([r.question for r in two]))) / len(two)
    hop2_rate = sum(r.evidence[1] in got for r, got in
                    zip(two, top3([r.metadata["hop_questions"][1] for r in two]))) / len(two)
    assert one_rate >= 0.9, one_rate
    assert two_rate <= 0.1, two_rate  # the question alone rarely finds both passages
    assert hop2_rate >= 0.9, hop2_rate  # the bridge search does


def test_write_load_and_cache(tmp_path):
    out = tmp_path / "w"
    ensure_world(out, seed=1, n_entities=200)
    assert world_is_current(out, 1, 200) and not world_is_current(out, 2, 200)
    meta = json.loads((out / "world.json").read_text())
    assert meta["seed"] == 1 and meta["counts"]["passages"] == 200
    w = generate_world(1, 200)
    assert read_corpus(out / "corpus.jsonl") == w.passages
    for split in ("train", "dev", "test"):
        recs = load_qa(out / f"{split}.jsonl")
        assert [r.to_dict() for r in recs] == [r.to_dict() for r in w.splits[split]]
    stamp = (out / "corpus.jsonl").stat().st_mtime_ns
    ensure_world(out, seed=1, n_entities=200)
    assert (out / "corpus.jsonl").stat().st_mtime_ns == stamp  # cached
    ensure_world(out, seed=2, n_entities=200)
    assert json.loads((out / "world.json").read_text())["seed"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]  # no temporary folders left


def main(argv: list[str]) -> int:
    """Run a data subcommand through its own parser (the full CLI imports every stage)."""
    import argparse

    parser = argparse.ArgumentParser()
    data_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_world(tmp_path, capsys):
    assert main(["world", "--out", str(tmp_path / "w"), "--seed", "5", "--entities", "200"]) == 0
    out = capsys.readouterr().out
    assert "passages: 200" in out and "one-hop" in out and "built in" in out
    assert main(["world", "--out", str(tmp_path / "w"), "--seed", "5", "--entities", "200"]) == 0
    assert "cached" in capsys.readouterr().out
