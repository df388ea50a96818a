"""BM25 retriever: finds the right passage, batch == one-by-one, save/load, caching, CLI."""

import json
import random
from pathlib import Path

import pytest

from hindsearch.cli import main
from hindsearch.config import RetrievalConfig
from hindsearch.data.corpus import CorpusError, write_corpus
from hindsearch.records import Passage, make_contents
from hindsearch.retrieval.base import PassageStore, read_meta
from hindsearch.retrieval.factory import build_index, ensure_index, load_index, load_retriever
from hindsearch.retrieval.bm25 import BM25Retriever

from shared_data import shared  # noqa: E402 - tests dir on sys.path
CITIES = ["Varnholm", "Quessat", "Ilbrecht", "Tormouth", "Saldane", "Outerby", "Pelmora", "Kestwick"]
JOBS = ["painter", "chemist", "sailor", "architect", "violinist", "botanist"]


def synthetic_passages(n: int = 300, seed: int = 0) -> list[Passage]:
    """n passages about invented people; person i has a unique name."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ren", "tas", "vu", "zel", "dor", "fi", "gun", "hal", "jor"]
    names = set()
    while len(names) < n:
        names.add("".join(rng.sample(syll, 3)).capitalize() + " " + "".join(rng.sample(syll, 2)).capitalize())
    out = []
    for i, name in enumerate(sorted(names)):
        city, job = rng.choice(CITIES), rng.choice(JOBS)
        text = f"{name} was a {job} born in {city} in {1800 + i}. The {job} later moved to {rng.choice(CITIES)}."
        out.append(Passage(id=f"p{i}", contents=make_contents(name, text)))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[Passage]]:
    ps = synthetic_passages()
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(path, ps)
    return path, ps


@pytest.fixture(scope="module")
def index(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(corpus[0], out, kind="bm25", show_progress=False)
    return out


def test_finds_the_right_passage(index, corpus):
    r = load_index(index)
    ps = corpus[1]
    queries = [f"In which city was {p.bare_title} born?" for p in ps[:40]]
    hits = r.retrieve(queries, k=3)
    assert all(h[0].id == p.id for h, p in zip(hits, ps)), "the named person's passage must rank first"
    assert all(len(h) == 3 and h[0].score >= h[1].score >= h[2].score > 0 for h in hits)
    # the year is a unique token too
    assert r.retrieve(["born in 1805"], 1)[0][0].id == "p5"


def test_batch_equals_one_by_one(index, corpus):
    r = BM25Retriever(index, n_threads=2)
    queries = [f"{p.bare_title} {p.text.split()[3]}" for p in corpus[1][::7]] + ["painter Varnholm", "sailor"]
    batched = r.retrieve(queries, k=5)
    single = [r.retrieve([q], k=5)[0] for q in queries]
    assert batched == single


def test_empty_stopword_and_clamped_queries(index):
    r = load_index(index)
    out = r.retrieve(["", "   ", "the of and", "zzzunknownword", "Varnholm"], k=3)
    assert out[:4] == [[], [], [], []]
    assert len(out[4]) == 3
    everything = r.retrieve(["painter chemist sailor architect violinist botanist"], k=10_000)[0]
    assert len(everything) == 300 and len({p.id for p in everything}) == 300
    assert r.retrieve(["Varnholm"], 0) == [[]]
    assert r.retrieve([], 3) == []


def test_save_load_roundtrip(index, corpus):
    meta = read_meta(index)
    assert meta["kind"] == "bm25" and meta["n_docs"] == 300 and meta["corpus"] == "corpus.jsonl"
    assert len(meta["corpus_sha256"]) == 64 and meta["skipped_rows"] == 0
    store = PassageStore(index)
    assert len(store) == 300 and [store[i] for i in (0, 150, 299)] == [corpus[1][i] for i in (0, 150, 299)]
    a = BM25Retriever(index, mmap=True).retrieve(["Quessat chemist", "Pelmora"], 4)
    b = BM25Retriever(index, mmap=False).retrieve(["Quessat chemist", "Pelmora"], 4)
    assert a == b and a[0]


def test_bad_rows_in_build(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "1", "contents": "alpha beta"}) + "\n{oops\n" + json.dumps({"id": "3", "contents": "gamma"}) + "\n")
    with pytest.raises(CorpusError, match=r"c.jsonl:2:"):
        build_index(path, tmp_path / "idx", show_progress=False)
    assert not (tmp_path / "idx").exists()
    meta = build_index(path, tmp_path / "idx", skip_bad=True, show_progress=False)
    assert (meta["n_docs"], meta["skipped_rows"]) == (2, 1)
    assert load_index(tmp_path / "idx").retrieve(["gamma"], 3)[0][0].id == "3"


def test_ensure_index_caches_and_rebuilds(tmp_path):
    path = tmp_path / "c.jsonl"
    write_corpus(path, synthetic_passages(20))
    out = tmp_path / "idx"
    ensure_index(path, out)
    created = (out / "index.json").read_text()
    ensure_index(path, out)
    assert (out / "index.json").read_text() == created  # not rebuilt
    write_corpus(path, synthetic_passages(25, seed=1))
    ensure_index(path, out)
    assert read_meta(out)["n_docs"] == 25  # stale -> rebuilt


def test_load_retriever_from_config(index):
    r = load_retriever(RetrievalConfig(kind="bm25", index_dir=str(index)))
    assert r.retrieve(["Tormouth"], 1)[0]
    with pytest.raises(ValueError, match="is a 'bm25' index"):
        load_retriever(RetrievalConfig(kind="dense", index_dir=str(index)))
    with pytest.raises(ValueError, match="no index folder"):
        load_retriever(RetrievalConfig(kind="bm25"))
    with pytest.raises(FileNotFoundError, match="not an index folder"):
        load_index(index.parent)


def test_old_index_format_is_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    write_corpus(path, synthetic_passages(5))
    build_index(path, tmp_path / "idx", show_progress=False)
    meta = read_meta(tmp_path / "idx")
    (tmp_path / "idx" / "index.json").write_text(json.dumps({**meta, "version": 1}))
    with pytest.raises(ValueError, match="index format 1.*rebuild"):
        load_index(tmp_path / "idx")
    ensure_index(path, tmp_path / "idx")  # stale format -> rebuilt
    assert read_meta(tmp_path / "idx")["version"] == meta["version"]


def test_cli_index_and_search(corpus, tmp_path, capsys):
    out = tmp_path / "cli_idx"
    assert main(["index", "--corpus", str(corpus[0]), "--out", str(out), "--kind", "bm25"]) == 0
    assert "indexed 300 passages" in capsys.readouterr().out
    name = corpus[1][42].bare_title
    assert main(["search", "--index", str(out), f"where was {name} born", "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"1. [" in printed and name in printed.splitlines()[1]
    assert main(["search", "--index", str(tmp_path / "missing"), "x"]) == 1


def test_real_wiki_passages(tmp_path):
    toy = shared("flashrag-toy/sample_data.jsonl")
    build_index(toy, tmp_path / "toy", show_progress=False)
    hit = load_index(tmp_path / "toy").retrieve(["lobbyist for Genentech Evan Morris"], 3)[0]
    assert hit[0].id == "0" and hit[0].bare_title == "Evan Morris"


def test_backend_choice():
    from hindsearch.retrieval.bm25 import pick_backend

    assert pick_backend("auto") == "sparse" and pick_backend("numpy") == "numpy"
    with pytest.raises(ValueError, match="not supported"):
        pick_backend("gpu")


def test_sparse_backend_matches_bm25s(index, corpus):
    queries = [f"{p.bare_title} {p.text.split()[3]}" for p in corpus[1][::5]] + ["the of", "painter sailor", "Varnholm"]
    a = BM25Retriever(index, backend="sparse").retrieve(queries, 4)
    b = BM25Retriever(index, backend="numpy").retrieve(queries, 4)
    assert [[round(p.score, 4) for p in h] for h in a] == [[round(p.score, 4) for p in h] for h in b]
    assert [h[0].id for h in a[:60]] == [h[0].id for h in b[:60]]  # unique names: no ties at the top
    assert a[60] == [] == b[60]


def test_sparse_chunking_and_ties(index, monkeypatch):
    import hindsearch.retrieval.bm25 as bm25

    r = BM25Retriever(index)
    queries = ["painter Varnholm", "sailor", "chemist Quessat", "botanist"]
    whole = r.retrieve(queries, 5)
    monkeypatch.setattr(bm25, "MAX_CHUNK_NNZ", 1)  # one query per chunk
    assert r.retrieve(queries, 5) == whole
    ties = r.retrieve(["sailor"], 300)[0]  # many docs share the same score: doc order breaks ties
    for a, b in zip(ties, ties[1:]):
        assert a.score > b.score or (a.score == b.score and int(a.id[1:]) < int(b.id[1:]))


@pytest.mark.slow
def test_numba_backend_matches_sparse(index, corpus):
    pytest.importorskip("numba")
    queries = [f"{p.bare_title} {p.text.split()[3]}" for p in corpus[1][::5]]
    a = BM25Retriever(index, backend="numba").retrieve(queries, 3)
    b = BM25Retriever(index, backend="sparse").retrieve(queries, 3)
    assert [[round(p.score, 4) for p in h] for h in a] == [[round(p.score, 4) for p in h] for h in b]
    assert [h[0].id for h in a] == [h[0].id for h in b]


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no passages"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "idx", show_progress=False)
    with pytest.raises(ValueError, match="not supported"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "idx", kind="splade")
