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


# ---------------------------------------------------------------- approximate indexes (HNSW, IVF), conversion, --faiss-gpu
def _clustered(n: int, d: int = 384, seed: int = 0) -> np.ndarray:
    """Unit vectors around 40 centres: real embeddings cluster; uniform random ones would make every ANN look bad."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(40, d))
    x = centres[rng.integers(0, 40, n)] + 0.6 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / truth.shape[1] for a, b in zip(found, truth)]))


def test_factory_indexes_built_from_text(minilm, tmp_path, capsys):
    from hindsearch.cli import main as cli_main
    from hindsearch.data.corpus import write_corpus

    qs = [q for q, _ in QUERIES]
    want = [f"d{i}" for _, i in QUERIES]
    ivf = build_index(passages(), tmp_path / "ivf", kind="dense", encoder=minilm, factory="IVF2,Flat", nprobe=2,
                      show_progress=False)
    assert (ivf["factory"], ivf["search_params"]) == ("IVF2,Flat", {"nprobe": 2})
    r = DenseRetriever(tmp_path / "ivf", encoder=minilm)
    assert [h[0].id for h in r.retrieve(qs, 3)] == want  # nprobe = every list: exact
    import faiss

    assert faiss.extract_index_ivf(r.index).nprobe == 2
    assert faiss.extract_index_ivf(DenseRetriever(tmp_path / "ivf", encoder=minilm, nprobe=1).index).nprobe == 1
    hnsw = build_index(passages(), tmp_path / "hnsw", kind="dense", encoder=minilm, factory="HNSW8", show_progress=False)
    assert (hnsw["factory"], hnsw["search_params"]) == ("HNSW8", {"efSearch": 64})
    h = DenseRetriever(tmp_path / "hnsw", encoder=minilm, ef_search=16)
    assert [x[0].id for x in h.retrieve(qs, 3)] == want and faiss.downcast_index(h.index).hnsw.efSearch == 16
    assert build_index(passages(), tmp_path / "m", kind="dense", encoder=minilm, hnsw=8, show_progress=False)["factory"] == "HNSW8"

    with pytest.raises(ValueError, match=r"--factory 'IVF2,Bogus': not a FAISS factory string"):
        build_index(passages(), tmp_path / "bad", kind="dense", encoder=minilm, factory="IVF2,Bogus", show_progress=False)
    with pytest.raises(ValueError, match="--nprobe applies to IVF indexes, not 'Flat'"):
        build_index(passages(), tmp_path / "bad", kind="dense", encoder=minilm, nprobe=4, show_progress=False)
    with pytest.raises(ValueError, match="--ef-search applies to HNSW"):
        DenseRetriever(tmp_path / "ivf", encoder=minilm, ef_search=8)
    with pytest.raises(ValueError, match="--factory or --hnsw, not both"):
        build_index(passages(), tmp_path / "bad", kind="dense", encoder=minilm, factory="HNSW8", hnsw=8, show_progress=False)
    assert not (tmp_path / "bad").exists()

    write_corpus(tmp_path / "c.jsonl", passages())
    assert cli_main(["index", "--corpus", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "cli"), "--kind", "dense",
                     "--factory", "HNSW8", "--ef-search", "32"]) == 0
    assert read_meta(tmp_path / "cli")["search_params"] == {"efSearch": 32}
    assert cli_main(["search", "--index", str(tmp_path / "cli"), "jazz piano", "-k", "1", "--ef-search", "128"]) == 0
    assert "Brisco Tallow" in capsys.readouterr().out
    assert cli_main(["index", "--corpus", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "b"), "--factory", "HNSW8"]) == 1
    assert "apply to --kind dense" in capsys.readouterr().err
    assert cli_main(["search", "--index", str(tmp_path / "ivf"), "x", "--ef-search", "8"]) == 1
    assert "--ef-search applies to HNSW" in capsys.readouterr().err


@pytest.fixture(scope="module")
def big_flat(tmp_path_factory):
    """A flat inner-product file of 3,000 clustered 384-d vectors (MiniLM's size) and a corpus row per vector."""
    import faiss

    from hindsearch.data.corpus import write_corpus

    d = tmp_path_factory.mktemp("bigflat")
    x = _clustered(3000)
    write_corpus(d / "c.jsonl", [Passage(id=str(i), contents=make_contents(f"T{i}", f"passage {i}")) for i in range(len(x))])
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    faiss.write_index(index, str(d / "Flat.index"))
    return d / "Flat.index", d / "c.jsonl", index


def test_convert_a_flat_file_to_ivf_and_hnsw(big_flat, minilm, tmp_path):
    import faiss

    flat_file, corpus, flat = big_flat
    q = _clustered(300, seed=1)
    truth = flat.search(q, 3)[1]
    out = tmp_path / "ivf"
    meta = import_faiss(flat_file, corpus, out, encoder=minilm, factory="IVF32,Flat", nprobe=4)
    assert (meta["factory"], meta["faiss_link"], meta["search_params"]) == ("IVF32,Flat", "convert", {"nprobe": 4})
    assert (out / "faiss.index").stat().st_ino != flat_file.stat().st_ino
    recalls = []
    for nprobe in (1, 4, 32):
        r = DenseRetriever(out, encoder=minilm, nprobe=nprobe)
        assert r.index.ntotal == 3000 and r.factory == "IVF32,Flat"
        recalls.append(_recall(r.index.search(q, 3)[1], truth))
    assert recalls == sorted(recalls) and recalls[-1] == 1.0 and recalls[0] < 1.0  # all 32 lists: exact
    assert DenseRetriever(out, encoder=minilm).search_params == {"nprobe": 4}

    h = tmp_path / "hnsw"
    import_faiss(flat_file, corpus, h, encoder=minilm, factory="HNSW16", ef_search=200)
    assert _recall(DenseRetriever(h, encoder=minilm).index.search(q, 3)[1], truth) >= 0.95

    # ensure_faiss_index: reused for the same factory, rebuilt for another; nprobe only rewrites index.json
    created = read_meta(out)["created"]
    ensure_faiss_index(flat_file, corpus, out, encoder="minilm", factory="IVF32,Flat", nprobe=8, log=lambda s: None)
    assert read_meta(out)["created"] == created and read_meta(out)["search_params"] == {"nprobe": 8}
    logs = []
    ensure_faiss_index(flat_file, corpus, out, encoder="minilm", factory="HNSW16", log=logs.append)
    assert read_meta(out)["factory"] == "HNSW16" and logs and "indexing the passages" in logs[0]
    ensure_faiss_index(flat_file, corpus, out, encoder="minilm", log=lambda s: None)  # back to the flat file, linked
    assert read_meta(out)["faiss_link"] == "hardlink" and read_meta(out)["factory"] == "Flat"

    with pytest.raises(ValueError, match="only a flat inner-product index .* can be converted"):
        import_faiss(h / "faiss.index", corpus, tmp_path / "again", encoder=minilm, factory="IVF8,Flat")
    assert not (tmp_path / "again").exists()


def test_faiss_gpu_shards_in_fp16_or_falls_back(big_flat, minilm, tmp_path, monkeypatch, capsys):
    import faiss

    from hindsearch.cli import main as cli_main
    from hindsearch.retrieval import dense as dense_mod
    from hindsearch.retrieval import server

    flat_file, corpus, flat = big_flat
    out = tmp_path / "f"
    import_faiss(flat_file, corpus, out, encoder=minilm)
    cpu = DenseRetriever(out, encoder=minilm)
    if faiss.get_num_gpus() == 0:  # faiss-cpu, or no GPU: a warning, and the CPU index
        with pytest.warns(RuntimeWarning, match="--faiss-gpu: .*searching on the CPU"):
            r = DenseRetriever(out, encoder=minilm, faiss_gpu=True)
        assert not r.on_gpu and r.retrieve(["copper mine"], 3) == cpu.retrieve(["copper mine"], 3)

    class Options:  # what faiss-gpu's GpuMultipleClonerOptions exposes
        shard = False
        useFloat16 = False

    seen = {}

    def to_all_gpus(index, co=None):
        seen.update(shard=co.shard, fp16=co.useFloat16, index=type(faiss.downcast_index(index)).__name__)
        return index

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", Options, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", to_all_gpus)
    r = DenseRetriever(out, encoder=minilm, faiss_gpu=True)
    assert r.on_gpu and seen == {"shard": True, "fp16": True, "index": "IndexFlatIP"}

    def refuse(index, co=None):
        raise RuntimeError("Error in ...: GPU index for HNSW not implemented")

    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", refuse)
    msgs = []
    index, on_gpu = dense_mod.to_gpus(cpu.index, log=msgs.append)
    assert index is cpu.index and not on_gpu and "cannot put a IndexFlatIP on a GPU" in msgs[0]

    # the flags: passed to the server's load_index, and refused for a BM25 index
    got = {}
    monkeypatch.setattr(server, "serve", lambda index_dir, **kw: got.update(kw))
    assert cli_main(["serve", "--index", str(out), "--faiss-gpu", "--port", "0"]) == 0
    assert got["retriever_options"] == {"faiss_gpu": True}
    build_index(passages(), tmp_path / "bm25", kind="bm25", show_progress=False)
    assert cli_main(["search", "--index", str(tmp_path / "bm25"), "x", "--faiss-gpu"]) == 1
    assert "apply to dense indexes" in capsys.readouterr().err


def test_gpu_check_faiss_cell_on_cpu(monkeypatch):
    """benchmarks/gpu_check.py's faiss-gpu cell: skipped without a GPU on --device cpu, an error on cuda, and the
    measuring path (through a stand-in for the GPU clone) reports recall and q/s."""
    import importlib.util

    import faiss

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py")
    gc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gc)
    dry = gc.parse_args(["--dry-run", "--device", "cpu"])
    assert dry.faiss_vectors == 20_000 and not dry.faiss_gpu  # opt-in: the lent machines lack faiss-gpu
    assert gc.parse_args(["--dry-run", "--device", "cpu", "--faiss-gpu"]).faiss_gpu
    assert not gc.parse_args([]).faiss_gpu and gc.parse_args(["--faiss-gpu"]).faiss_vectors == 1_000_000
    if faiss.get_num_gpus() == 0:
        row = gc.faiss_gpu_cell(2000, "cpu", d=32, queries=16)
        assert row["status"] == "skipped" and "searching on the CPU" in row["detail"]
        assert gc.faiss_gpu_cell(2000, "cuda", d=32, queries=16)["status"] == "error"

    class Options:
        shard = useFloat16 = False

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", Options, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index, co=None: index)
    row = gc.faiss_gpu_cell(2000, "cuda", d=32, queries=16)
    assert row["recall"] == 1.0 and row["gpu_qps"] > 0 and "sharded fp16" in row["detail"]
