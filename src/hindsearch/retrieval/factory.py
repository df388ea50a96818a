"""Building and loading retrievers: the one module that knows every implementation.

``build_index`` / ``load_index`` dispatch on an index folder's kind (``bm25``, ``dense``),
``load_retriever`` on a ``RetrievalConfig`` through the registered kinds (``base.register_retriever``:
``bm25``, ``dense``, ``remote``, a plugin's), ``ensure_index`` rebuilds only when the corpus file changed. The protocol and the folder layout live in ``base``, which imports
no implementation; the implementations import ``base``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from hindsearch.data.corpus import CorpusStats, file_sha256, iter_corpus
from hindsearch.fsutil import check_replaceable, publish, staging
from hindsearch.records import Passage
from hindsearch.config.registry import RETRIEVERS
from hindsearch.retrieval.base import INDEX_VERSION, KINDS, Retriever, is_index_dir, read_meta, write_store

if TYPE_CHECKING:
    from hindsearch.config import RetrievalConfig


def build_index(
    corpus: str | Path | Iterable[Passage],
    out_dir: str | Path,
    kind: str = "bm25",
    encoder: str = "minilm",
    skip_bad: bool = False,
    hnsw: int | None = None,
    device: str = "cpu",
    batch_size: int = 64,
    show_progress: bool = True,
    factory: str | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
) -> dict:
    """Build an index folder from a corpus file or passages; returns its ``index.json`` content.

    Dense only: ``factory`` (a FAISS factory string: ``Flat``, ``HNSW32``, ``IVF4096,Flat``; ``hnsw=M`` is
    ``HNSWM``) and its search parameters ``nprobe`` (IVF) / ``ef_search`` (HNSW), see ``retrieval.dense``.

    Built into a temporary sibling folder (removed if the build fails) and renamed into place, so
    an interrupted build leaves no half-written index behind. An existing ``out_dir`` is replaced
    only when it is an index folder (it has ``index.json``) or empty; a file, the current folder,
    a folder holding the corpus, or any other folder is refused (``UnsafeOutput``).
    """
    if kind not in KINDS:
        raise ValueError(f"index kind {kind!r} is not supported; choose one of {', '.join(KINDS)}")
    if kind != "dense" and (factory or hnsw or nprobe or ef_search):
        raise ValueError("--factory, --hnsw, --nprobe and --ef-search apply to --kind dense")
    out = Path(out_dir)
    corpus_path = Path(corpus) if isinstance(corpus, (str, Path)) else None
    if corpus_path is not None:
        if corpus_path.is_dir():
            raise IsADirectoryError(f"--corpus {corpus_path}: is a folder; give the corpus file (.jsonl, .jsonl.gz or .json)")
        if not corpus_path.exists():
            raise FileNotFoundError(f"--corpus {corpus_path}: file not found")
    check_replaceable(out, is_index_dir, "index folder", protect=(corpus_path,) if corpus_path else ())
    stats = CorpusStats()
    meta: dict = {"version": INDEX_VERSION, "kind": kind}
    with staging(out) as tmp:
        if corpus_path is not None:
            meta.update(corpus=corpus_path.name, corpus_sha256=file_sha256(corpus_path), corpus_bytes=corpus_path.stat().st_size)
            passages: Iterable[Passage] = iter_corpus(corpus_path, skip_bad=skip_bad, stats=stats)
        else:
            passages = corpus
        texts = write_store(passages, tmp)
        if not texts:
            raise ValueError(f"corpus {corpus_path or '<passages>'} has no passages")
        if kind == "bm25":
            from hindsearch.retrieval.bm25 import build_bm25

            build_bm25(texts, tmp / "bm25", show_progress=show_progress)
        else:
            from hindsearch.retrieval.dense import build_dense

            meta.update(build_dense(texts, tmp, encoder, hnsw=hnsw, device=device, batch_size=batch_size, show_progress=show_progress,
                                    factory=factory, nprobe=nprobe, ef_search=ef_search))
        meta.update(n_docs=len(texts), skipped_rows=stats.skipped, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        (tmp / "index.json").write_text(json.dumps(meta, indent=2) + "\n")
        publish(tmp, out)
    return meta


def load_index(
    index_dir: str | Path, encoder: str | None = None, device: str = "cpu", n_threads: int = 0, bm25_backend: str = "auto",
    nprobe: int | None = None, ef_search: int | None = None, faiss_gpu: bool = False,
) -> Retriever:
    """Load the retriever an index folder holds (its kind is read from ``index.json``).

    ``encoder`` (dense only), when given, must match the encoder the index was built with;
    ``n_threads``/``bm25_backend`` tune BM25 (see ``hindsearch.retrieval.bm25``); ``nprobe``/``ef_search``
    (override the index's) and ``faiss_gpu`` tune dense search (see ``hindsearch.retrieval.dense``).
    """
    meta = read_meta(index_dir)
    if meta.get("version") != INDEX_VERSION:
        raise ValueError(f"{index_dir} has index format {meta.get('version')}, this hindsearch reads {INDEX_VERSION}: rebuild it with `hindsearch index`")
    if meta.get("kind") == "bm25":
        from hindsearch.retrieval.bm25 import BM25Retriever

        if nprobe or ef_search or faiss_gpu:
            raise ValueError(f"{index_dir} is a BM25 index: --nprobe, --ef-search and --faiss-gpu apply to dense indexes")

        return BM25Retriever(index_dir, n_threads=n_threads, backend=bm25_backend)
    if meta.get("kind") == "dense":
        from hindsearch.retrieval.dense import DenseRetriever

        if encoder is not None and encoder != meta["encoder"]:
            raise ValueError(
                f"index {index_dir} was built with encoder {meta['encoder']!r}, not {encoder!r}; "
                "set retrieval.encoder to match or rebuild the index"
            )
        return DenseRetriever(index_dir, device=device, nprobe=nprobe, ef_search=ef_search, faiss_gpu=faiss_gpu)
    raise ValueError(f"{index_dir}/index.json: unknown kind {meta.get('kind')!r}")


def load_retriever(cfg: "RetrievalConfig", index_dir: str | Path | None = None,
                   corpus: str | Path | None = None) -> Retriever:
    """The retriever a ``RetrievalConfig`` asks for: its registered kind opened on ``index_dir`` (else
    ``cfg.index_dir``; a kind that reads an index folder needs one, of its kind) and ``corpus`` (the world's)."""
    spec = RETRIEVERS.get(cfg.kind)
    index_dir = index_dir or cfg.index_dir
    if spec.index:
        if index_dir is None:
            raise ValueError("no index folder: set retrieval.index_dir (build one with `hindsearch index`)")
        kind = read_meta(index_dir).get("kind")
        if kind != cfg.kind:
            raise ValueError(f"retrieval.kind = {cfg.kind!r} but index {index_dir} is a {kind!r} index")
    return spec.open(cfg, Path(index_dir) if index_dir is not None else None,
                     Path(corpus) if corpus is not None else None)


def index_is_current(corpus_path: str | Path, index_dir: str | Path, kind: str, encoder: str = "minilm") -> bool:
    """True when ``index_dir`` holds a ``kind`` index of exactly this corpus file."""
    try:
        meta = read_meta(index_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    corpus_path = Path(corpus_path)
    return (
        meta.get("version") == INDEX_VERSION
        and meta.get("kind") == kind
        and (kind != "dense" or meta.get("encoder") == encoder)
        and meta.get("corpus_bytes") == corpus_path.stat().st_size
        and meta.get("corpus_sha256") == file_sha256(corpus_path)
    )


def ensure_index(corpus_path: str | Path, index_dir: str | Path, kind: str = "bm25", encoder: str = "minilm", **kw) -> Path:
    """Build ``index_dir`` from ``corpus_path`` unless it already indexes that exact file."""
    if not Path(corpus_path).exists():
        raise FileNotFoundError(f"corpus not found: {corpus_path}")
    if not index_is_current(corpus_path, index_dir, kind, encoder):
        build_index(corpus_path, index_dir, kind=kind, encoder=encoder, **kw)
    return Path(index_dir)
