"""The ``Retriever`` protocol and the on-disk index folder (``retrieval.factory`` builds and loads).

Every retriever returns, per query, up to k ``Passage``s with ``score`` set, best first; an empty or
whitespace-only query gets an empty list. An index folder holds ``index.json``, the passage store
(``passages.jsonl`` + ``offsets.npy``, read with ``os.pread``; a store changed on disk raises
``StoreChanged``) and the kind's own files. Kinds register with ``@register_retriever`` or
``register_index_kind``, one file each. The folder layout: docs/data.md, "Index folders".
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from hindsearch.fsutil import strays
from hindsearch.records import Passage
from hindsearch.retrieval.registry import RETRIEVERS

if TYPE_CHECKING:
    from hindsearch.config import RetrievalConfig

INDEX_VERSION = 2  # 2: passages.jsonl rows are compact JSON (spliced verbatim by the server)


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top-k passages per query (scores in ``Passage.score``), best first."""
        ...


OpenFn = Callable[["RetrievalConfig", "Path | None", "Path | None"], Any]
"""``open(cfg, index_dir, corpus) -> Retriever``: ``cfg`` the ``[retrieval]`` section; ``index_dir``
``retrieval.index_dir`` (or None); ``corpus`` the world's ``corpus.jsonl`` when the run has a world
(else None)."""

CheckFn = Callable[..., None]
"""``check(**options)``: refuse (``ValueError``) build options the kind cannot use, before anything
is read. ``options`` are every keyword ``factory.build_index`` got besides the corpus, folder, kind,
``skip_bad`` and ``show_progress``: ``hindsearch index`` gives all of its flags (``encoder``,
``hnsw``, ``device``, ``batch_size``, ``factory``, ``nprobe``, ``ef_search``), so a kind takes
``**options`` and ignores those it does not use."""

BuildFn = Callable[..., dict]
"""``build(texts, folder, show_progress=..., **options) -> dict``: write the kind's own files into
``folder`` (the index folder being built, whose ``passages.jsonl`` holds ``texts`` in order:
document i is ``texts[i]``); returns the kind's fields of ``index.json`` (``factory`` adds version,
kind, corpus, n_docs and the rest)."""

LoadFn = Callable[..., Retriever]
"""``load(index_dir, meta, **options) -> Retriever``: open an index folder of the kind (``meta`` its
``index.json``, version already checked); ``options`` are ``factory.load_index``'s keywords
(``device``, ``encoder``: the config's ``retrieval.encoder``, ``nprobe``, ``ef_search``,
``faiss_gpu``, ``n_threads``, ``bm25_backend``): a kind takes ``**options``, uses its own and
refuses set ones that would be ignored silently."""


@dataclass(frozen=True)
class IndexKind:
    """How a kind builds and loads its files in an index folder (``register_index_kind``)."""

    build: BuildFn
    load: LoadFn
    check: CheckFn | None = None


@dataclass(frozen=True)
class RetrieverKind:
    """A registered ``retrieval.kind``: opened by ``open`` (from the config), or index-backed
    (``index``: an index folder of its kind, from ``hindsearch index --kind``; the world's is built
    on first use)."""

    kind: str
    open: OpenFn | None = None
    index: IndexKind | None = None


def register_retriever(kind: str) -> Callable[[OpenFn], OpenFn]:
    """Decorator: make ``open`` the retriever of ``retrieval.kind = kind``."""
    def add(fn: OpenFn) -> OpenFn:
        RETRIEVERS.register(kind, RetrieverKind(kind, open=fn), fn.__module__)
        return fn
    return add


def register_index_kind(kind: str, build: BuildFn, load: LoadFn,
                        check: CheckFn | None = None) -> None:
    """Register ``kind`` as an index-backed ``retrieval.kind`` (and ``hindsearch index --kind``
    choice): ``build`` writes its files into an index folder, ``load`` opens one, ``check`` refuses
    build options early (see ``BuildFn``, ``LoadFn``, ``CheckFn``)."""
    RETRIEVERS.register(kind, RetrieverKind(kind, index=IndexKind(build, load, check)),
                        load.__module__)


def index_kinds() -> tuple[str, ...]:
    """The registered index-backed kinds, built-ins first (``bm25``, ``dense``, then a plugin's)."""
    return tuple(k for k in RETRIEVERS if RETRIEVERS.get(k).index is not None)


class StoreChanged(RuntimeError):
    """``passages.jsonl`` changed on disk (size or mtime) after the store was loaded."""


class PassageStore:
    """Random access to the passages of an index folder (``os.pread`` on an open file; ``check()``
    first).

    Rows are stored as compact JSON (``separators=(",", ":")``, UTF-8), which is byte for byte
    how FastAPI renders a ``{"id", "contents"}`` document, so the server can splice them.
    """

    def __init__(self, index_dir: str | Path):
        d = Path(index_dir)
        self.offsets = np.load(d / "offsets.npy")
        self.path = d / "passages.jsonl"
        self._file = self.path.open("rb")
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int]:
        st = os.fstat(self._file.fileno())  # the file served, even if the path was since replaced
        return st.st_size, st.st_mtime_ns

    def check(self) -> None:
        """Raise ``StoreChanged`` when ``passages.jsonl`` was truncated or rewritten since
        loading."""
        now = self._stat()
        if now != self._stamp:
            raise StoreChanged("the index's passages.jsonl changed on disk since it was loaded "
                               f"(size {self._stamp[0]} -> {now[0]} bytes, or its mtime): its "
                               "passages cannot be served; restart the server "
                               "on a complete index")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, i: int) -> bytes:
        """Row i as stored: the compact JSON of ``{"id", "contents"}`` (no newline)."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1]) - 1
        row = os.pread(self._file.fileno(), end - start, start)
        if len(row) != end - start:
            self.check()
            raise StoreChanged("the index's passages.jsonl is shorter than its offsets "
                               f"({start + len(row)} < {end} bytes)")
        return row

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
            for i, hits in zip(live,
                               self._search([queries[i] for i in live], min(k, len(self.store)))):
                out[i] = hits
        return out

    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        return [[self.store.get(int(d), float(s)) for d, s in zip(*h)]
                for h in self.retrieve_ids(queries, k)]


def write_store_streaming(passages: Iterable[Passage], out_dir: Path) -> int:
    """Write ``passages.jsonl`` + ``offsets.npy``, keeping no texts (21M rows fit); returns the
    number of rows."""
    offsets = array("q", [0])
    with (out_dir / "passages.jsonl").open("wb") as f:
        for p in passages:
            row = json.dumps(p.to_search_r1(), ensure_ascii=False, separators=(",", ":"))
            line = (row + "\n").encode("utf-8")
            f.write(line)
            offsets.append(offsets[-1] + len(line))
    np.save(out_dir / "offsets.npy", np.frombuffer(offsets, dtype=np.int64))
    return len(offsets) - 1


def write_store(passages: Iterable[Passage], out_dir: Path) -> list[str]:
    """``write_store_streaming``, returning the contents (for indexing), in order."""
    texts: list[str] = []

    def kept() -> Iterator[Passage]:
        for p in passages:
            texts.append(p.contents)
            yield p

    write_store_streaming(kept(), out_dir)
    return texts
    return texts


def read_meta(index_dir: str | Path) -> dict:
    """The ``index.json`` of an index folder (clear error when it is not one)."""
    path = Path(index_dir) / "index.json"
    if not path.exists():
        raise FileNotFoundError(f"{index_dir} is not an index folder (no index.json); build one "
                                "with `hindsearch index`")
    return json.loads(path.read_text())


def is_index_dir(path: Path) -> bool:
    """True when ``path`` holds an ``index.json`` hindsearch wrote (the marker that it may be
    replaced)."""
    try:
        meta = json.loads((Path(path) / "index.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("kind") in index_kinds() and "version" in meta


def index_strays(path: Path) -> list[str]:
    """The files of an index folder its build did not write (``index.json``'s ``files``; for an
    index built before that list, the files changed after ``index.json``): a user's, which a rebuild
    must not delete."""
    try:
        files = json.loads((Path(path) / "index.json").read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return []
    return strays(Path(path), files if isinstance(files, list) else None, "index.json")
