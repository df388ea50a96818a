"""BM25 retriever: finds the right passage, batch == one-by-one, save/load, caching, CLI."""

import importlib.util
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


def test_backend_choice(monkeypatch):
    import hindsearch.retrieval.bm25 as bm25

    assert bm25.pick_backend("sparse") == "sparse"
    assert bm25.pick_backend("auto") == ("numba" if importlib.util.find_spec("numba") else "sparse")
    with pytest.raises(ValueError, match="not supported"):
        bm25.pick_backend("numpy")  # bm25s' own per-query backends are gone: ours is faster than both
    monkeypatch.setattr(bm25, "_numba", lambda: None)  # the `fast` extra not installed
    assert bm25.pick_backend("auto") == "sparse"
    with pytest.raises(ImportError, match="hindsearch\\[fast\\]"):
        bm25.pick_backend("numba")


def test_tokens_are_bm25s_tokens(index):
    """Our batch tokenising gives bm25s.tokenize's tokens (same stopwords, stemmer, word pattern)."""
    import bm25s
    import numpy as np

    r = BM25Retriever(index)
    qs = ["Who was the painter born in Varnholm?", "the of and", "!!", "a b", "Über-naïve café's ÉCOLE x2 42",
          "sailor SAILOR sailors sailing", "Quessat's chemists, botanists & architects", ""]
    terms, counts, qptr = r._query_terms(qs)
    for q, toks in zip(range(len(qs)), bm25s.tokenize(qs, stopwords="en", stemmer=r.stemmer, return_ids=False,
                                                      show_progress=False)):
        ids = [r.vocab[t] for t in toks if t in r.vocab and r.vocab[t] < len(r.df)]
        want = sorted(set(ids))
        assert terms[qptr[q]:qptr[q + 1]].tolist() == want
        assert counts[qptr[q]:qptr[q + 1]].tolist() == [float(ids.count(t)) for t in want]


def _sparse_product_top_k(r: BM25Retriever, queries: list[str], k: int) -> list[tuple[list, list]]:
    """The reference: scipy's ``W @ Q`` product and a full sort (score descending, then document order)."""
    import numpy as np
    import scipy.sparse as sp

    W = sp.csc_matrix((r.data, r.indices, r.indptr), shape=(r.num_docs, len(r.df)))
    out = []
    for q in r.term_ids(queries):
        col = np.zeros(len(r.df), np.float32)
        for t in q:
            col[t] += 1
        s = (W @ sp.csc_matrix(col[:, None])).toarray()[:, 0]
        docs = np.flatnonzero(s > 0)
        order = np.lexsort((docs, -s[docs]))[:k]
        out.append((docs[order].tolist(), s[docs][order].tolist()))
    return out


@pytest.mark.parametrize("backend", ["numba", "sparse"])
def test_search_matches_the_sparse_product(index, corpus, backend):
    """Same ids, bit-identical scores and ties as scipy's W @ Q (the search before numba), at small and large k."""
    if backend == "numba":
        pytest.importorskip("numba")
    r = BM25Retriever(index, backend=backend)
    queries = [f"{p.bare_title} {p.text.split()[3]}" for p in corpus[1][::5]] + [
        "the of", "painter sailor", "Varnholm", "sailor sailor painter", "born in 1805", "zzz unknown"]
    for k in (1, 3, 200, 300):  # 200 > SMALL_K: the sorting branch
        got = [(d.tolist(), s.tolist()) for d, s in r.retrieve_ids(queries, k)]
        assert got == _sparse_product_top_k(r, queries, k)


def test_fallback_matches_numba_on_real_passages(tmp_path):
    pytest.importorskip("numba")
    import json

    build_index(shared("wiki18-slice/wiki18_passages_from_search_r1_runs.jsonl"), tmp_path / "w", show_progress=False)
    qs = [json.loads(line)["question"] for line in open(shared("ros-subsample/nq/test.jsonl"))][:300]
    a = BM25Retriever(tmp_path / "w", backend="numba")
    b = BM25Retriever(tmp_path / "w", backend="sparse")
    for k in (3, 150):
        x, y = a.retrieve_ids(qs, k), b.retrieve_ids(qs, k)
        assert all(p[0].tolist() == q[0].tolist() and p[1].tolist() == q[1].tolist() for p, q in zip(x, y))
    assert a.retrieve(qs[:50], 3) == b.retrieve(qs[:50], 3) == BM25Retriever(tmp_path / "w", n_threads=2).retrieve(qs[:50], 3)


def test_chunking_threads_and_ties(index, monkeypatch):
    import hindsearch.retrieval.bm25 as bm25

    queries = ["painter Varnholm", "sailor", "chemist Quessat", "botanist"] * 40
    whole = BM25Retriever(index).retrieve(queries, 5)
    sparse = BM25Retriever(index, backend="sparse")
    monkeypatch.setattr(bm25, "MAX_CHUNK_NNZ", 1)  # sparse fallback: one query per chunk
    assert sparse.retrieve(queries, 5) == whole
    monkeypatch.setattr(bm25, "MIN_QUERIES_PER_THREAD", 8)
    threaded = BM25Retriever(index, n_threads=3)
    assert threaded.retrieve(queries, 5) == whole and threaded.retrieve(queries, 5) == whole  # buffers left clean
    ties = BM25Retriever(index).retrieve(["sailor"], 300)[0]  # many docs share the same score: doc order breaks ties
    assert len({p.score for p in ties}) < len(ties)
    for a, b in zip(ties, ties[1:]):
        assert a.score > b.score or (a.score == b.score and int(a.id[1:]) < int(b.id[1:]))


def test_passages_parsed_at_load_or_on_demand(index, corpus, monkeypatch):
    import hindsearch.retrieval.bm25 as bm25

    queries = ["Quessat chemist", "Pelmora", "", "the of"]
    parsed = BM25Retriever(index)
    assert parsed._ids is not None and len(parsed._ids) == 300
    monkeypatch.setattr(bm25, "PARSE_AT_LOAD_MAX_BYTES", 0)
    lazy = BM25Retriever(index)
    assert lazy._ids is None
    assert parsed.retrieve(queries, 4) == lazy.retrieve(queries, 4) and parsed.retrieve(queries, 4)[0]
    assert parsed.retrieve(queries, 0) == [[], [], [], []] and parsed.retrieve([], 3) == []


def test_a_corrupted_passage_store_names_its_file_and_line(index, tmp_path):
    import shutil

    from hindsearch.fsutil import BadJsonl

    broken = tmp_path / "index"
    shutil.copytree(index, broken)
    store = broken / "passages.jsonl"
    raw = bytearray(store.read_bytes())
    raw[raw.index(b"\n") + 1] = ord("x")  # line 2's opening brace overwritten in place: the size is unchanged
    store.write_bytes(bytes(raw))
    with pytest.raises(BadJsonl, match=r"index/passages\.jsonl:2: invalid JSON: Expecting value \(column 1\)$"):
        BM25Retriever(broken)


def test_bm25l_index_is_refused(tmp_path, corpus):
    import bm25s

    from hindsearch.retrieval.bm25 import _stemmer

    build_index(corpus[0], tmp_path / "idx", show_progress=False)
    model = bm25s.BM25(method="bm25l")
    model.index(bm25s.tokenize([p.contents for p in corpus[1]], stopwords="en", stemmer=_stemmer(), show_progress=False),
                show_progress=False)
    model.save(str(tmp_path / "idx" / "bm25"))
    with pytest.raises(ValueError, match="BM25L"):
        BM25Retriever(tmp_path / "idx")


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has no passages"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "idx", show_progress=False)
    with pytest.raises(ValueError, match="not supported"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "idx", kind="splade")


@pytest.mark.parametrize("preset", [None, "cuda"])
def test_bm25s_import_keeps_jax_off_the_gpu(tmp_path, preset):
    """``import bm25s`` runs a JAX top-k when JAX is installed, which on a CUDA build preallocates 75% of the GPU
    (105.5 GiB of an H200). A stand-in ``jax`` records the ``JAX_PLATFORMS`` it is imported under: ``cpu`` while
    hindsearch imports bm25s, the variable gone afterwards, and a value the user set is kept."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True)
    seen = tmp_path / "seen.txt"
    (fake / "__init__.py").write_text(f"import os\nopen({str(seen)!r}, 'w').write(os.environ.get('JAX_PLATFORMS', '-'))\n")
    (fake / "lax.py").write_text("def top_k(x, k):\n    return x[:k], list(range(k))\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(Path(__file__).parents[1] / "src")])
    if preset:
        env["JAX_PLATFORMS"] = preset
    code = ("import os, sys, hindsearch.retrieval.bm25; assert 'jax.lax' in sys.modules; "
            "print(os.environ.get('JAX_PLATFORMS', '-'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert seen.read_text() == (preset or "cpu")
    assert out.stdout.strip() == (preset or "-")
