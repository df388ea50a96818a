"""Dense retriever: sentence-transformers pooling on a tiny random BERT (plain HF folder: masked mean; a
sentence-transformers folder: its own pooling), the real MiniLM for ranking, and a prebuilt bare FAISS file
(as Search-R1's e5_Flat.index) loaded with its corpus through the search and serve commands."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hindsearch.records import Passage, make_contents
from hindsearch.retrieval.base import read_meta
from hindsearch.retrieval.dense import (DenseRetriever, Encoder, default_prefixes, ensure_faiss_index, import_faiss,
                                        minilm_path)
from hindsearch.retrieval.factory import build_index, load_index

pytest.importorskip("faiss")

FACTS = [
    ("Marrowind", "Marrowind is a cold northern island whose economy depends on herring fishing and sheep farming."),
    ("Solvetta", "Solvetta is a desert city known for its copper mines and an ancient underground water system."),
    ("Brisco Tallow", "Brisco Tallow was a jazz pianist who recorded forty albums and toured with a big band."),
    ("Quill Harbour", "Quill Harbour hosts the largest shipyard of the region, building ferries and cargo vessels."),
    ("Ostrava Fell", "Ostrava Fell is a mountain popular with climbers; its summit is covered in snow all year."),
    ("Lenna Moor", "Lenna Moor is a novelist whose detective stories are set in rainy Victorian London."),
    ("Tessaly Grain", "Tessaly Grain is a company that mills wheat into flour and bakes bread for supermarkets."),
    ("Pell Observatory", "Pell Observatory operates a large telescope used to study distant galaxies and comets."),
]
QUERIES = [
    ("which island lives from fishing and sheep", 0),
    ("city with copper mining in the desert", 1),
    ("musician who played piano in jazz bands", 2),
    ("where are ships and ferries built", 3),
    ("snowy peak for mountaineers", 4),
    ("author of crime novels in London", 5),
    ("flour and bakery business", 6),
    ("astronomy telescope looking at galaxies", 7),
]


def passages() -> list[Passage]:
    return [Passage(id=f"d{i}", contents=make_contents(t, x)) for i, (t, x) in enumerate(FACTS)]


def test_prefixes():
    assert default_prefixes("minilm") == ("", "")
    assert default_prefixes("e5-base-v2") == ("query: ", "passage: ")
    assert default_prefixes("my/e5-large") == ("query: ", "passage: ")
    assert (minilm_path() / "config.json").exists()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny random BERT saved as a plain HF folder (no sentence-transformers config), with MiniLM's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(minilm_path())
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64)).eval()
    d = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


def _hidden(model, tok, text):
    with torch.no_grad():
        enc = tok([text], return_tensors="pt")
        return model(**enc).last_hidden_state[0]  # [T, D], no padding


def test_plain_hf_encoder_gets_masked_mean_pooling(tiny_bert):
    d, model, tok = tiny_bert
    enc = Encoder(str(d), batch_size=4, prefixes=("q: ", "p: "))
    texts = ["short", "a much longer text with many more tokens than the first one", "mid length text"]
    vecs = enc.encode(texts, kind="passage")
    assert vecs.shape == (3, 32) and vecs.dtype == np.float32 and enc.dim == 32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    for text, v in zip(texts, vecs):  # mean over the real tokens of "p: <text>", L2-normalised
        mean = _hidden(model, tok, "p: " + text).mean(0)
        assert np.allclose(v, (mean / mean.norm()).numpy(), atol=1e-5)
    alone = enc.encode(["short"], kind="passage")[0]
    assert np.allclose(alone, vecs[0], atol=1e-5), "padding must not change an embedding"
    assert not np.allclose(enc.encode(["short"], kind="query")[0], alone), "query/passage prefixes differ"
    assert enc.encode([], kind="query").shape == (0, 32)


def test_sentence_transformers_folder_keeps_its_pooling(tiny_bert, tmp_path):
    """A folder whose modules.json says CLS pooling (as BGE-style encoders ship) is pooled with CLS, not mean."""
    import shutil

    d, model, tok = tiny_bert
    st = tmp_path / "cls-encoder"
    shutil.copytree(d, st)
    (st / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    (st / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    (st / "1_Pooling").mkdir()
    (st / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True,
                                                              "pooling_mode_mean_tokens": False}))
    v = Encoder(str(st), prefixes=("", "")).encode(["a text about herring fishing"], kind="passage")[0]
    h = _hidden(model, tok, "a text about herring fishing")
    assert np.allclose(v, (h[0] / h[0].norm()).numpy(), atol=1e-5)
    assert not np.allclose(v, (h.mean(0) / h.mean(0).norm()).numpy(), atol=1e-3)


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return Encoder("minilm")


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory, minilm) -> Path:
    out = tmp_path_factory.mktemp("dense") / "idx"
    build_index(passages(), out, kind="dense", encoder=minilm, show_progress=False)
    return out


@pytest.fixture(scope="module")
def dense(minilm_index, minilm) -> DenseRetriever:
    return DenseRetriever(minilm_index, encoder=minilm)


def test_minilm_finds_paraphrased_passages(dense):
    r = dense
    hits = r.retrieve([q for q, _ in QUERIES], k=3)
    top1 = [h[0].id for h in hits]
    assert top1 == [f"d{i}" for _, i in QUERIES]
    assert all(len(h) == 3 and h[0].score >= h[1].score >= h[2].score for h in hits)
    assert all(-1.0 <= p.score <= 1.0 + 1e-5 for h in hits for p in h)


def test_minilm_batch_equals_single_and_edges(dense):
    r = dense
    qs = [q for q, _ in QUERIES[:4]]
    batched = r.retrieve(qs, 3)
    for q, b in zip(qs, batched):
        s = r.retrieve([q], 3)[0]
        assert [p.id for p in s] == [p.id for p in b]
        assert np.allclose([p.score for p in s], [p.score for p in b], atol=1e-5)
    out = r.retrieve(["", "  ", "telescope"], k=100)
    assert out[0] == [] and out[1] == [] and len(out[2]) == len(FACTS)


def test_dense_save_load_and_hnsw(minilm_index, dense, tmp_path):
    meta = read_meta(minilm_index)
    assert (meta["kind"], meta["encoder"], meta["dim"], meta["n_docs"]) == ("dense", "minilm", 384, len(FACTS))
    a = load_index(minilm_index)  # loads MiniLM from the recorded encoder name
    assert isinstance(a, DenseRetriever) and a.encoder.prefixes == ("", "")
    b = DenseRetriever(minilm_index, mmap=False, encoder=dense.encoder)
    q = ["jazz piano"]
    assert [p.id for p in a.retrieve(q, 3)[0]] == [p.id for p in b.retrieve(q, 3)[0]]
    build_index(passages(), tmp_path / "hnsw", kind="dense", encoder=a.encoder, hnsw=8, show_progress=False)
    h = DenseRetriever(tmp_path / "hnsw", encoder=a.encoder)
    assert h.retrieve(q, 1)[0][0].id == "d2"
    with pytest.raises(ValueError, match="built with encoder 'minilm'"):
        load_index(minilm_index, encoder="e5-base-v2")


# ---------------------------------------------------------------- a prebuilt FAISS file + its corpus (Search-R1's e5_Flat.index)
@pytest.fixture(scope="module")
def bare_faiss(tmp_path_factory, minilm):
    """A bare ``.index`` file as Search-R1 ships one (IndexFlatIP, one row per corpus line) and its gzipped corpus."""
    import faiss

    from hindsearch.data.corpus import write_corpus

    d = tmp_path_factory.mktemp("prebuilt")
    write_corpus(d / "wiki.jsonl", passages())
    (d / "wiki.jsonl.gz").write_bytes(gzip.compress((d / "wiki.jsonl").read_bytes()))
    index = faiss.IndexFlatIP(minilm.dim)
    index.add(minilm.encode([p.contents for p in passages()], kind="passage"))
    faiss.write_index(index, str(d / "e5_Flat.index"))
    return d / "e5_Flat.index", d / "wiki.jsonl.gz", index


def test_prebuilt_faiss_file_through_search_and_serve(bare_faiss, minilm, tmp_path, monkeypatch, capsys):
    import httpx

    from hindsearch.cli import main as cli_main
    from hindsearch.retrieval import server
    from hindsearch.retrieval.server import BackgroundServer, create_app

    faiss_file, corpus, index = bare_faiss
    out = tmp_path / "wiki18-e5"
    flags = ["--faiss-index", str(faiss_file), "--corpus", str(corpus), "--encoder", "minilm", "--index", str(out)]
    assert cli_main(["search", "jazz piano", "-k", "1", *flags]) == 0
    printed = capsys.readouterr().out
    assert "indexing the passages of" in printed and "1. [" in printed and "Brisco Tallow  (id d2)" in printed
    meta = read_meta(out)
    assert (meta["kind"], meta["encoder"], meta["n_docs"], meta["dim"], meta["prefixes"]) == ("dense", "minilm", 8, 384, ["", ""])
    assert meta["faiss_link"] == "hardlink" and (out / "faiss.index").stat().st_ino == faiss_file.stat().st_ino

    seen = {}
    monkeypatch.setattr(server, "serve", lambda index_dir, **kw: seen.update(index_dir=index_dir, **kw))
    assert cli_main(["serve", *flags, "--port", "0"]) == 0
    assert seen["index_dir"] == str(out) and "indexing" not in capsys.readouterr().out  # the folder is reused
    assert read_meta(out)["created"] == meta["created"]

    qs = [q for q, _ in QUERIES]
    with BackgroundServer(create_app(load_index(seen["index_dir"]), default_topk=3)) as srv:
        r = httpx.post(f"{srv.url}/retrieve", json={"queries": qs, "topk": 3, "return_scores": True}, timeout=60)
    result = r.json()["result"]  # Search-R1's client reads exactly this key
    assert [hits[0]["document"]["id"] for hits in result] == [f"d{i}" for _, i in QUERIES]
    scores, _ = index.search(minilm.encode(qs, kind="query"), 3)  # the file's own answer, no prefix for MiniLM
    assert np.allclose([[h["score"] for h in hits] for hits in result], scores, atol=1e-5)

    ensure_faiss_index(faiss_file, corpus, out, encoder="minilm", query_prefix="query: ", log=lambda s: None)
    assert read_meta(out)["prefixes"] == ["query: ", ""] and read_meta(out)["created"] == meta["created"]
    r = load_index(out)
    got = [p.score for p in r.retrieve(["jazz piano"], 3)[0]]
    want, _ = index.search(minilm.encode(["query: jazz piano"], kind="query"), 3)
    bare, _ = index.search(minilm.encode(["jazz piano"], kind="query"), 3)
    assert r.encoder.prefixes[0] == "query: " and np.allclose(got, want[0], atol=1e-5)
    assert not np.allclose(got, bare[0], atol=1e-3)


def test_prebuilt_faiss_mismatches_name_the_file(bare_faiss, minilm, tmp_path, capsys):
    import faiss

    from hindsearch.cli import main as cli_main
    from hindsearch.data.corpus import write_corpus

    faiss_file, corpus, index = bare_faiss
    longer = tmp_path / "longer.jsonl"
    write_corpus(longer, [*passages(), Passage(id="d8", contents=make_contents("Extra", "one passage too many"))])
    with pytest.raises(ValueError, match=r"e5_Flat\.index: holds 8 vectors but .*longer\.jsonl has 9 passages; a FAISS "
                                         r"index must be loaded with the corpus it was built from"):
        import_faiss(faiss_file, longer, tmp_path / "o", encoder=minilm)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["longer.jsonl"]  # nothing half-built left behind

    wide = tmp_path / "wide.index"
    faiss.write_index(faiss.IndexFlatIP(16), str(wide))
    with pytest.raises(ValueError, match=r"wide\.index: its vectors have 16 dimensions but encoder 'minilm' makes 384"):
        import_faiss(wide, corpus, tmp_path / "o", encoder=minilm)
    (tmp_path / "junk.index").write_bytes(b"not an index at all")
    with pytest.raises(ValueError, match=r"junk\.index: not a FAISS index file"):
        import_faiss(tmp_path / "junk.index", corpus, tmp_path / "o", encoder=minilm)
    with pytest.raises(FileNotFoundError, match=r"--faiss-index .*nowhere\.index: file not found"):
        import_faiss(tmp_path / "nowhere.index", corpus, tmp_path / "o", encoder=minilm)

    # a folder whose FAISS file no longer matches its passages is refused on load, naming the file
    out = tmp_path / "ok"
    import_faiss(faiss_file, corpus, out, encoder=minilm)
    (out / "faiss.index").unlink()
    small = faiss.IndexFlatIP(384)
    small.add(index.reconstruct_n(0, 3))
    faiss.write_index(small, str(out / "faiss.index"))
    with pytest.raises(ValueError, match=r"e5_Flat\.index: holds 3 vectors but index folder .*ok has 8 passages"):
        DenseRetriever(out, encoder=minilm)

    build_index(passages(), tmp_path / "built", kind="bm25", show_progress=False)
    with pytest.raises(ValueError, match=r"holds an index built by `hindsearch index`, not one made from a FAISS file"):
        ensure_faiss_index(faiss_file, corpus, tmp_path / "built", encoder="minilm")
    assert read_meta(tmp_path / "built")["kind"] == "bm25"  # left as it was

    assert cli_main(["serve", "--faiss-index", str(faiss_file)]) == 1
    assert "--faiss-index needs --corpus" in capsys.readouterr().err
    assert cli_main(["search", "q", "--index", str(out), "--corpus", str(corpus)]) == 1
    assert "--corpus goes with --faiss-index" in capsys.readouterr().err
    assert cli_main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "b"), "--faiss-index", str(faiss_file)]) == 1
    assert "--kind bm25" in capsys.readouterr().err
