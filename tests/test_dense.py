"""Dense retriever: sentence-transformers pooling on a tiny random BERT (plain HF folder: masked mean; a
sentence-transformers folder: its own pooling), the real MiniLM for ranking."""

import json

from pathlib import Path

import numpy as np
import pytest
import torch

from hindsearch.records import Passage, make_contents
from hindsearch.retrieval.base import build_index, load_index, read_meta
from hindsearch.retrieval.dense import DenseRetriever, Encoder, default_prefixes, minilm_path

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
