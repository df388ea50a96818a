"""Building and loading index folders and opening a configured retriever, through the registered
kinds.

``build_index`` / ``load_index`` / ``ensure_index`` do what every index-backed kind shares (the
corpus, the passage store, staging and publishing the folder, ``index.json``) and call the kind's
own ``build`` / ``load``; ``load_retriever`` opens a ``RetrievalConfig``'s kind, which
``check_kind`` checks against the registry. This module names no kind: the implementations import
``base``, never this module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hindsearch.data.corpus import CorpusStats, file_sha256, iter_corpus
from hindsearch.fsutil import check_replaceable, publish, staging, written_files
from hindsearch.records import Passage
from hindsearch.retrieval.base import (INDEX_VERSION, IndexKind, Retriever, index_kinds,
                                       index_strays, is_index_dir, read_meta, write_store)
from hindsearch.retrieval.registry import RETRIEVERS

if TYPE_CHECKING:
    from hindsearch.config import RetrievalConfig


def check_kind(cfg: "RetrievalConfig") -> None:
    """``ConfigError`` naming ``retrieval.kind`` and the registered kinds unless ``cfg.kind`` is
    one."""
    RETRIEVERS.check(cfg.kind, "retrieval.kind")


def index_kind(kind: Any) -> IndexKind | None:
    """The build/load of an index-backed ``kind``; None for any other name (unregistered, or a kind
    without index)."""
    return RETRIEVERS.get(kind).index if isinstance(kind, str) and kind in RETRIEVERS else None


def build_index(
    corpus: str | Path | Iterable[Passage],
    out_dir: str | Path,
    kind: str = "bm25",
    skip_bad: bool = False,
    show_progress: bool = True,
    **options: Any,
) -> dict:
    """Build an index folder from a corpus file or passages; returns its ``index.json`` content.

    ``options`` go to the kind (``base.BuildFn``): dense takes ``encoder`` (default minilm),
    ``device``, ``batch_size``, ``factory`` (a FAISS factory string: ``Flat``, ``HNSW32``,
    ``IVF4096,Flat``; ``hnsw=M`` is ``HNSWM``) and its search parameters ``nprobe`` (IVF) /
    ``ef_search`` (HNSW), see ``retrieval.dense``; bm25 refuses the FAISS ones.

    Built into a temporary sibling folder (removed if the build fails) and renamed into place, so an
    interrupted build leaves no half-written index behind. An existing ``out_dir`` is replaced only
    when it is an index folder (it has ``index.json``) or empty; a file, the current folder, a
    folder holding the corpus, any other folder, or an index folder holding a file its build did not
    write (``index.json`` lists the files) is refused (``UnsafeOutput``).
    """
    spec = index_kind(kind)
    if spec is None:
        raise ValueError(f"index kind {kind!r} is not supported; choose one of "
                         f"{', '.join(index_kinds())}")
    if spec.check is not None:
        spec.check(**options)
    out = Path(out_dir)
    corpus_path = Path(corpus) if isinstance(corpus, (str, Path)) else None
    if corpus_path is not None:
        if corpus_path.is_dir():
            raise IsADirectoryError(f"--corpus {corpus_path}: is a folder; give the corpus file "
                                    "(.jsonl, .jsonl.gz or .json)")
        if not corpus_path.exists():
            raise FileNotFoundError(f"--corpus {corpus_path}: file not found")
    check_replaceable(out, is_index_dir, "index folder",
                      protect=(corpus_path,) if corpus_path else (),
                      stray=index_strays)
    stats = CorpusStats()
    meta: dict = {"version": INDEX_VERSION, "kind": kind}
    with staging(out) as tmp:
        if corpus_path is not None:
            meta.update(corpus=corpus_path.name, corpus_sha256=file_sha256(corpus_path),
                        corpus_bytes=corpus_path.stat().st_size)
            passages: Iterable[Passage] = iter_corpus(corpus_path, skip_bad=skip_bad, stats=stats)
        else:
            passages = corpus
        texts = write_store(passages, tmp)
        if not texts:
            raise ValueError(f"corpus {corpus_path or '<passages>'} has no passages")
        meta.update(spec.build(texts, tmp, show_progress=show_progress, **options))
        meta.update(n_docs=len(texts), skipped_rows=stats.skipped,
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        meta["files"] = sorted([*written_files(tmp), "index.json"])  # a rebuild deletes only these
        (tmp / "index.json").write_text(json.dumps(meta, indent=2) + "\n")
        publish(tmp, out)
    return meta


def load_index(index_dir: str | Path, **options: Any) -> Retriever:
    """Load the retriever an index folder holds (its kind is read from ``index.json``).

    ``options`` go to the kind (``base.LoadFn``): ``encoder`` (dense), when given, must match the
    encoder the index was built with; ``device`` runs dense's query encoder;
    ``n_threads``/``bm25_backend`` tune BM25 (see ``hindsearch.retrieval.bm25``);
    ``nprobe``/``ef_search`` (override the index's) and ``faiss_gpu`` tune dense search (see
    ``hindsearch.retrieval.dense``).
    """
    meta = read_meta(index_dir)
    if meta.get("version") != INDEX_VERSION:
        raise ValueError(f"{index_dir} has index format {meta.get('version')}, this hindsearch "
                         f"reads {INDEX_VERSION}: rebuild it with `hindsearch index`")
    spec = index_kind(meta.get("kind"))
    if spec is None:
        raise ValueError(f"{index_dir}/index.json: unknown kind {meta.get('kind')!r}")
    return spec.load(index_dir, meta, **options)


def load_retriever(cfg: "RetrievalConfig", index_dir: str | Path | None = None,
                   corpus: str | Path | None = None) -> Retriever:
    """The retriever a ``RetrievalConfig`` asks for: its registered kind opened on ``index_dir``
    (else ``cfg.index_dir``; a kind that reads an index folder needs one, of its kind) and
    ``corpus`` (the world's)."""
    check_kind(cfg)
    spec = RETRIEVERS.get(cfg.kind)
    index_dir = index_dir or cfg.index_dir
    if spec.index is not None:
        if index_dir is None:
            raise ValueError("no index folder: set retrieval.index_dir (build one with `hindsearch "
                             "index`)")
        kind = read_meta(index_dir).get("kind")
        if kind != cfg.kind:
            raise ValueError(f"retrieval.kind = {cfg.kind!r} but index {index_dir} is a {kind!r} "
                             "index")
        return load_index(Path(index_dir), encoder=cfg.encoder)
    return spec.open(cfg, Path(index_dir) if index_dir is not None else None,
                     Path(corpus) if corpus is not None else None)


def index_is_current(corpus_path: str | Path, index_dir: str | Path, kind: str,
                     encoder: str = "minilm") -> bool:
    """True when ``index_dir`` holds a ``kind`` index of exactly this corpus file (and ``encoder``,
    if it records one)."""
    try:
        meta = read_meta(index_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    corpus_path = Path(corpus_path)
    return (
        meta.get("version") == INDEX_VERSION
        and meta.get("kind") == kind
        # an index that records an encoder (dense) was built with this one
        and meta.get("encoder", encoder) == encoder
        and meta.get("corpus_bytes") == corpus_path.stat().st_size
        and meta.get("corpus_sha256") == file_sha256(corpus_path)
    )


def ensure_index(corpus_path: str | Path, index_dir: str | Path, kind: str = "bm25",
                 encoder: str = "minilm", **kw) -> Path:
    """Build ``index_dir`` from ``corpus_path`` unless it already indexes that exact file."""
    if not Path(corpus_path).exists():
        raise FileNotFoundError(f"corpus not found: {corpus_path}")
    if not index_is_current(corpus_path, index_dir, kind, encoder):
        build_index(corpus_path, index_dir, kind=kind, encoder=encoder, **kw)
    return Path(index_dir)
