"""The ``Retriever`` protocol, the on-disk index folder, and building/loading indexes.

An index folder holds:

* ``index.json``: kind (``bm25``/``dense``), encoder, n_docs, the corpus' SHA-256, byte size
  and skipped-row count, creation time and format version;
* ``passages.jsonl`` (``{"id", "contents"}`` rows, itself a valid wiki-18 corpus) and
  ``offsets.npy`` (int64 byte offsets, length n_docs + 1): passages are read on demand
  through a memory map, so loading does not parse the corpus;
* the kind's own files (``bm25/`` for bm25s, ``faiss.index`` for dense).

Every retriever returns, per query, up to k ``Passage``s with ``score`` set, best first; an
empty or whitespace-only query gets an empty list.
"""

from __future__ import annotations

import json
import mmap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from hindsearch.data.corpus import CorpusStats, file_sha256, iter_corpus
from hindsearch.fsutil import check_replaceable, publish, staging
from hindsearch.records import Passage

if TYPE_CHECKING:
    from hindsearch.config import RetrievalConfig

INDEX_VERSION = 2  # 2: passages.jsonl rows are compact JSON (spliced verbatim by the server)
KINDS = ("bm25", "dense")


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-k passages per query (scores in ``Passage.score``), best first."""
        ...


class PassageStore:
    """Random access to the passages of an index folder through a memory map.

    Rows are stored as compact JSON (``separators=(",", ":")``, UTF-8), which is byte for byte
    how FastAPI renders a ``{"id", "contents"}`` document, so the server can splice them.
    """

    def __init__(self, index_dir: str | Path):
        d = Path(index_dir)
        self.offsets = np.load(d / "offsets.npy", mmap_mode="r")
        self._file = (d / "passages.jsonl").open("rb")
        size = (d / "passages.jsonl").stat().st_size
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, i: int) -> bytes:
        """Row i as stored: the compact JSON of ``{"id", "contents"}`` (no newline)."""
        return self._mm[int(self.offsets[i]) : int(self.offsets[i + 1]) - 1]

    def get(self, i: int, score: float | None = None) -> Passage:
        row = json.loads(self.raw(i))
        return Passage(id=row["id"], contents=row["contents"], score=score)

    def __getitem__(self, i: int) -> Passage:
        return self.get(i)


Hits = tuple[np.ndarray, np.ndarray]
"""One query's result: (document indices [n<=k] int, scores [n] float), best first."""


class IndexedRetriever:
    """Shared logic of the retrievers over an index folder: subclasses implement ``_search``."""

    store: PassageStore

    def __len__(self) -> int:
        return len(self.store)

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        """Hits of non-empty queries, ``1 <= k <= len(self)``."""
        raise NotImplementedError

    def retrieve_ids(self, queries: list[str], k: int) -> list[Hits]:
        """Like ``retrieve`` but document indices and scores (empty query -> empty arrays)."""
        out: list[Hits] = [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * len(queries)
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        if live and k > 0:
            for i, hits in zip(live, self._search([queries[i] for i in live], min(k, len(self.store)))):
                out[i] = hits
        return out

    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [[self.store.get(int(d), float(s)) for d, s in zip(*h)] for h in self.retrieve_ids(queries, k)]


def write_store(passages: Iterable[Passage], out_dir: Path) -> list[str]:
    """Write ``passages.jsonl`` + ``offsets.npy``; returns the contents (for indexing), in order."""
    texts: list[str] = []
    offsets = [0]
    with (out_dir / "passages.jsonl").open("wb") as f:
        for p in passages:
            line = (json.dumps(p.to_search_r1(), ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
            f.write(line)
            offsets.append(offsets[-1] + len(line))
            texts.append(p.contents)
    np.save(out_dir / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    return texts


def read_meta(index_dir: str | Path) -> dict:
    """The ``index.json`` of an index folder (clear error when it is not one)."""
    path = Path(index_dir) / "index.json"
    if not path.exists():
        raise FileNotFoundError(f"{index_dir} is not an index folder (no index.json); build one with `hindsearch index`")
    return json.loads(path.read_text())


def is_index_dir(path: Path) -> bool:
    """True when ``path`` holds an ``index.json`` hindsearch wrote (the marker that it may be replaced)."""
    try:
        meta = json.loads((Path(path) / "index.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("kind") in KINDS and "version" in meta


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
) -> dict:
    """Build an index folder from a corpus file or passages; returns its ``index.json`` content.

    Built into a temporary sibling folder (removed if the build fails) and renamed into place, so
    an interrupted build leaves no half-written index behind. An existing ``out_dir`` is replaced
    only when it is an index folder (it has ``index.json``) or empty; a file, the current folder,
    a folder holding the corpus, or any other folder is refused (``UnsafeOutput``).
    """
    if kind not in KINDS:
        raise ValueError(f"index kind {kind!r} is not supported; choose one of {', '.join(KINDS)}")
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

            meta.update(build_dense(texts, tmp, encoder, hnsw=hnsw, device=device, batch_size=batch_size, show_progress=show_progress))
        meta.update(n_docs=len(texts), skipped_rows=stats.skipped, created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        (tmp / "index.json").write_text(json.dumps(meta, indent=2) + "\n")
        publish(tmp, out)
    return meta


def load_index(
    index_dir: str | Path, encoder: str | None = None, device: str = "cpu", n_threads: int = 0, bm25_backend: str = "auto"
) -> Retriever:
    """Load the retriever an index folder holds (its kind is read from ``index.json``).

    ``encoder`` (dense only), when given, must match the encoder the index was built with;
    ``n_threads``/``bm25_backend`` tune BM25 (see ``hindsearch.retrieval.bm25``).
    """
    meta = read_meta(index_dir)
    if meta.get("version") != INDEX_VERSION:
        raise ValueError(f"{index_dir} has index format {meta.get('version')}, this hindsearch reads {INDEX_VERSION}: rebuild it with `hindsearch index`")
    if meta.get("kind") == "bm25":
        from hindsearch.retrieval.bm25 import BM25Retriever

        return BM25Retriever(index_dir, n_threads=n_threads, backend=bm25_backend)
    if meta.get("kind") == "dense":
        from hindsearch.retrieval.dense import DenseRetriever

        if encoder is not None and encoder != meta["encoder"]:
            raise ValueError(
                f"index {index_dir} was built with encoder {meta['encoder']!r}, not {encoder!r}; "
                "set retrieval.encoder to match or rebuild the index"
            )
        return DenseRetriever(index_dir, device=device)
    raise ValueError(f"{index_dir}/index.json: unknown kind {meta.get('kind')!r}")


def load_retriever(cfg: "RetrievalConfig", index_dir: str | Path | None = None) -> Retriever:
    """The retriever a ``RetrievalConfig`` asks for (``remote`` needs ``cfg.url``)."""
    if cfg.kind == "remote":
        from hindsearch.retrieval.client import RemoteRetriever

        if not cfg.url:
            raise ValueError("retrieval.url is required when retrieval.kind = 'remote'")
        return RemoteRetriever(cfg.url, timeout_s=cfg.timeout_s, retries=cfg.retries)
    index_dir = index_dir or cfg.index_dir
    if index_dir is None:
        raise ValueError("no index folder: set retrieval.index_dir (build one with `hindsearch index`)")
    kind = read_meta(index_dir).get("kind")
    if kind != cfg.kind:
        raise ValueError(f"retrieval.kind = {cfg.kind!r} but index {index_dir} is a {kind!r} index")
    return load_index(index_dir, encoder=cfg.encoder if cfg.kind == "dense" else None)


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
