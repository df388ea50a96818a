"""BM25 retrieval with bm25s (Lucene BM25, PyStemmer English stemmer, English stopwords).

bm25s builds the index into ``<index>/bm25/``, loaded memory-mapped. Hits with score 0 are dropped
(a query of only stopwords gets an empty list); k past the corpus is clamped. Order: score
descending, then document order. Search is one compiled numba pass over a batch (the ``fast`` extra,
imported when a retriever first picks its backend); without numba a scipy sparse product gives the
same scores and ties (``backend="sparse"`` forces it). Design and measurements:
docs/results/2026-12-01-bm25-ann.md.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def _jax_on_cpu() -> Iterator[None]:
    """While bm25s is imported, JAX (if installed and not yet imported) may only use the CPU.

    ``import bm25s`` imports ``jax.lax`` when it can and runs a top-k with it, which starts JAX's
    default backend: a CUDA build of JAX then preallocates most of the GPU and holds it through
    training (docs/gpu.md). hindsearch never uses bm25s' top-k (the search below has its own), so
    JAX gets ``JAX_PLATFORMS=cpu`` for that import; the variable is restored afterwards, and a
    process that set it, or imported JAX before, keeps its own choice."""
    if "jax" in sys.modules or "JAX_PLATFORMS" in os.environ:
        yield
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        yield
    finally:
        os.environ.pop("JAX_PLATFORMS", None)


with _jax_on_cpu():
    import bm25s

import numpy as np
import scipy.sparse as sp
import Stemmer
from bm25s.tokenization import _infer_stopwords

from hindsearch.fsutil import read_jsonl
from hindsearch.records import Passage
from hindsearch.retrieval.base import Hits, IndexedRetriever, PassageStore, register_index_kind

STOPWORDS = "en"
BACKENDS = ("auto", "numba", "sparse")
MAX_CHUNK_NNZ = 20_000_000  # sparse fallback: entries of one W @ Q product
# documents per block of the scan (one vectorised max, then a look inside only when needed)
BLOCK = 64
SMALL_K = 128  # up to this k the top k is kept in a sorted buffer; above it the matches are sorted
PARSE_AT_LOAD_MAX_BYTES = 64 << 20  # ~100k passages, ~200 MB of Python strings
# bm25s.tokenize's default pattern is r"(?u)\b\w\w+\b"; for findall this is the same (a match always
# takes a whole run of word characters), and faster
_SPLIT = re.compile(r"\w\w+").findall
_STOPWORDS = frozenset(_infer_stopwords(STOPWORDS))
MIN_QUERIES_PER_THREAD = 64


def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def tokenize(texts: list[str], stemmer: Stemmer.Stemmer | None = None,
             show_progress: bool = False) -> list[list[str]]:
    """Lowercase, split on words, drop English stopwords, stem: one token list per text."""
    return bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=stemmer or _stemmer(),
                          return_ids=False, show_progress=show_progress)


def build_bm25(texts: list[str], out_dir: str | Path, show_progress: bool = True) -> None:
    """Index ``texts`` (document i = texts[i]) with bm25s and save to ``out_dir``."""
    from hindsearch.progress import interactive

    # bm25s's bars flood a log file: only on a terminal
    show_progress = show_progress and interactive()
    tokens = bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=_stemmer(),
                            show_progress=show_progress)
    model = bm25s.BM25()
    model.index(tokens, show_progress=show_progress)
    model.save(str(out_dir), show_progress=False)


def _insert_py(out_ids, out_scores, q, n, k, d, s):  # pragma: no cover - compiled
    """Insert (d, s) into query q's buffer of n <= k hits (score descending, then doc order)."""
    if n == k and (s < out_scores[q, n - 1]
                   or (s == out_scores[q, n - 1] and d > out_ids[q, n - 1])):
        return n
    i = n - 1 if n == k else n
    while i > 0 and (out_scores[q, i - 1] < s
                     or (out_scores[q, i - 1] == s and out_ids[q, i - 1] > d)):
        out_scores[q, i] = out_scores[q, i - 1]
        out_ids[q, i] = out_ids[q, i - 1]
        i -= 1
    out_scores[q, i] = s
    out_ids[q, i] = d
    return n + 1 if n < k else n


def _search_batch_py(  # pragma: no cover
        terms, counts, qptr, data, indptr, indices, buf, k, out_ids, out_scores, out_n):
    """Top k per query of the batch (see the module docstring); writes ``out_*``, leaves ``buf``
    all zero.

    ``terms``/``counts``: each query's distinct term ids, ascending, and how often the query has
    them; query q owns ``terms[qptr[q]:qptr[q + 1]]``. ``buf``: float32 [num_docs], all zero.
    """
    num_docs = buf.shape[0]
    small = k <= SMALL_K
    cand_d = np.empty(0 if small else num_docs, np.int64)
    cand_s = np.empty(0 if small else num_docs, np.float32)
    for q in range(qptr.shape[0] - 1):
        nnz = 0
        for t in range(qptr[q], qptr[q + 1]):
            term = terms[t]
            v = counts[t]
            for j in range(indptr[term], indptr[term + 1]):
                buf[indices[j]] += v * data[j]
            nnz += indptr[term + 1] - indptr[term]
        n = 0
        if 4 * nnz >= num_docs:  # most documents match: one sequential pass, in document order
            thr = np.float32(0)
            # positive float32s order as their bits do (as int32); 0 and negatives are <= 0
            ibuf = buf.view(np.int32)
            thr_i = np.int32(0)
            for base in range(0, num_docs, BLOCK):
                top = min(base + BLOCK, num_docs)
                m = np.int32(0)
                # a vectorised max: most blocks hold nothing above the k-th score
                for d in range(base, top):
                    x = ibuf[d]
                    m = x if x > m else m
                if m <= thr_i:
                    continue
                for d in range(base, top):
                    s = buf[d]
                    if s > thr:  # a later document never wins a tie: strictly greater only
                        if small:
                            n = _insert(out_ids, out_scores, q, n, k, d, s)
                            if n == k:
                                thr = out_scores[q, k - 1]
                                thr_i = out_scores[q, k - 1 : k].view(np.int32)[0]
                        else:
                            cand_d[n] = d
                            cand_s[n] = s
                            n += 1
            buf[:] = 0
        else:
            # few match: walk the postings again, taking each document once
            # (reset on its first visit)
            for t in range(qptr[q], qptr[q + 1]):
                term = terms[t]
                for j in range(indptr[term], indptr[term + 1]):
                    d = indices[j]
                    s = buf[d]
                    if s != 0:
                        buf[d] = 0
                        if s > 0:
                            if small:
                                n = _insert(out_ids, out_scores, q, n, k, d, s)
                            else:
                                cand_d[n] = d
                                cand_s[n] = s
                                n += 1
        if not small:
            by_doc = np.argsort(cand_d[:n])
            ds, ss = cand_d[:n][by_doc], cand_s[:n][by_doc]
            order = np.argsort(-ss, kind="mergesort")[:k]  # stable: ties stay in document order
            n = order.shape[0]
            out_ids[q, :n] = ds[order]
            out_scores[q, :n] = ss[order]
        out_n[q] = n


@functools.cache
def _numba():
    """The ``numba`` module, or None without the ``fast`` extra (the sparse fallback then)."""
    try:
        import numba  # optional: fast
    except ImportError:
        return None
    return numba


def _compile(fn, **kw):
    """``numba.njit`` with its on-disk cache (compiled once per machine), or without where no cache
    folder is writable."""
    try:
        return _numba().njit(nogil=True, cache=True, **kw)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return _numba().njit(nogil=True, **kw)(fn)


_COMPILING = threading.Lock()


@functools.cache
def _search_batch():
    """The compiled ``_search_batch_py`` (with ``_insert`` compiled and inlined into it), made on
    the first call."""
    global _insert
    with _COMPILING:
        # a global of _search_batch_py, compiled before it
        _insert = _compile(_insert_py, inline="always")
        return _compile(_search_batch_py)


def pick_backend(backend: str) -> str:
    """Resolve ``auto`` (numba if installed, else the sparse product); check it is usable."""
    if backend not in BACKENDS:
        raise ValueError(f"bm25 backend {backend!r} is not supported; "
                         f"choose one of {', '.join(BACKENDS)}")
    if backend == "numba" and _numba() is None:
        raise ImportError("bm25 backend 'numba' needs numba: pip install 'hindsearch[fast]'")
    if backend == "auto":
        return "numba" if _numba() is not None else "sparse"
    return backend


def top_k_sparse(scores: sp.csc_matrix, k: int) -> list[Hits]:
    """Per column of ``scores`` [docs, queries]: (doc ids [<=k], scores [<=k]), best first.

    Only positive entries compete; equal scores keep document order (also at the k-th place).
    """
    out = []
    for j in range(scores.shape[1]):
        a, b = scores.indptr[j], scores.indptr[j + 1]
        s, ix = scores.data[a:b], scores.indices[a:b]
        keep = s > 0
        s, ix = s[keep], ix[keep]
        if len(s) > k:
            kth = s[np.argpartition(-s, k - 1)[:k]].min()
            # every doc tied with the k-th competes, so ties resolve by doc order
            tied = np.flatnonzero(s >= kth)
            s, ix = s[tied], ix[tied]
        order = np.lexsort((ix, -s))[:k]
        out.append((ix[order].astype(np.int64), s[order]))
    return out


def _outputs(nq: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zeroed (doc ids [nq, k], scores [nq, k], hits per query [nq]) for a search to fill."""
    return np.zeros((nq, k), np.int64), np.zeros((nq, k), np.float32), np.zeros(nq, np.int64)


class BM25Retriever(IndexedRetriever):
    """``Retriever`` over a bm25 index folder."""

    def __init__(self, index_dir: str | Path, n_threads: int = 0, mmap: bool = True,
                 backend: str = "auto"):
        self.index_dir = Path(index_dir)
        self.store = PassageStore(index_dir)
        self.backend = pick_backend(backend)
        self.model = bm25s.BM25.load(str(self.index_dir / "bm25"), mmap=mmap, show_progress=False)
        if self.model.nonoccurrence_array is not None:
            raise ValueError(f"{self.index_dir}: a BM25L/BM25+ index "
                             "(a per-term score for absent terms); hindsearch builds and searches "
                             "Lucene BM25: rebuild it with `hindsearch index`")
        sc = self.model.scores
        self.data = np.asarray(sc["data"], dtype=np.float32)
        self.indices = np.asarray(sc["indices"])
        self.indptr = np.asarray(sc["indptr"])
        self.num_docs = int(sc["num_docs"])
        self.df = np.diff(self.indptr)  # documents per term [V]
        self.vocab = self.model.vocab_dict
        self.stemmer = _stemmer()
        self.n_threads = n_threads
        self._bufs = threading.local()
        self._W = None
        # compile (or load the cached kernel) now, not in the first request
        if self.backend == "numba":
            self._run(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(1, np.int64), 1)
        self._ids: list[str] | None = None
        self._contents: list[str] | None = None
        path = self.index_dir / "passages.jsonl"
        if path.stat().st_size <= PARSE_AT_LOAD_MAX_BYTES:
            rows = read_jsonl(path)
            self._ids = [r["id"] for r in rows]
            self._contents = [r["contents"] for r in rows]

    def term_ids(self, queries: list[str]) -> list[list[int]]:
        """Known term ids of each query (unknown words and stopwords dropped)."""
        tokens = tokenize(queries, self.stemmer)
        return [[self.vocab[t] for t in q if t in self.vocab] for q in tokens]

    def _query_terms(self, queries: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(distinct term ids, ascending per query; their counts as float32; query pointers
        [nq + 1]).

        The tokens of ``bm25s.tokenize`` (lowercase, its word pattern, a text without a word is the
        one token "", English stopwords dropped, PyStemmer), made without Python per token: each
        distinct word of the batch is stemmed and looked up once.
        """
        words = list(map(_SPLIT, map(str.lower, queries)))
        lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        flat = list(itertools.chain.from_iterable(words))
        distinct = list(set(flat))
        stems = self.stemmer.stemWords(distinct)
        lut = dict(zip(distinct, map(self.vocab.get, stems, itertools.repeat(-1))))
        for w in _STOPWORDS.intersection(lut):
            lut[w] = -1
        ids = np.fromiter(map(lut.__getitem__, flat), dtype=np.int64, count=len(flat))
        qidx = np.repeat(np.arange(len(queries), dtype=np.int64), lens)
        v = len(self.df)
        # bm25s' vocabulary also holds "" (id v), which scores nothing
        known = (ids >= 0) & (ids < v)
        key, counts = np.unique(qidx[known] * v + ids[known], return_counts=True)
        qptr = np.searchsorted(key // v, np.arange(len(queries) + 1))
        return key % v, counts.astype(np.float32), qptr

    def _buffer(self) -> np.ndarray:
        buf = getattr(self._bufs, "buf", None)  # per thread; the kernel leaves it all zero
        if buf is None:
            buf = self._bufs.buf = np.zeros(self.num_docs, dtype=np.float32)
        return buf

    def _run(self, terms: np.ndarray, counts: np.ndarray, qptr: np.ndarray,
             k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nq = len(qptr) - 1
        ids, scores, n = _outputs(nq, k)
        _search_batch()(terms, counts, qptr - qptr[0], self.data, self.indptr, self.indices,
                        self._buffer(), k, ids, scores, n)
        return ids, scores, n

    def _top(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(doc ids [nq, k], scores [nq, k], hits per query [nq]) of non-empty queries,
        ``1 <= k <= len(self)``."""
        terms, counts, qptr = self._query_terms(queries)
        if self.backend == "sparse":
            return self._top_sparse(terms, counts, qptr, k)
        nq = len(queries)
        chunks = min(self.n_threads, nq // MIN_QUERIES_PER_THREAD) if self.n_threads > 1 else 1
        if chunks <= 1:
            return self._run(terms, counts, qptr, k)
        cuts = np.linspace(0, nq, chunks + 1).astype(np.int64)
        with ThreadPoolExecutor(chunks) as pool:
            def run(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
                lo, hi = qptr[a], qptr[b]
                return self._run(terms[lo:hi], counts[lo:hi], qptr[a : b + 1], k)

            parts = list(pool.map(run, cuts[:-1], cuts[1:]))
        return tuple(np.concatenate(x) for x in zip(*parts))

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        """(doc ids, scores) per query, best first, at most k each (zero scores dropped)."""
        ids, scores, n = self._top(queries, k)
        return [(d[:m], s[:m]) for d, s, m in zip(ids, scores, n.tolist())]

    def _top_sparse(self, terms: np.ndarray, counts: np.ndarray, qptr: np.ndarray,
                    k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fallback without numba: ``W [docs, terms] @ Q [terms, queries]``, chunked to
        ``MAX_CHUNK_NNZ`` entries."""
        if self._W is None:
            self._W = sp.csc_matrix((self.data, self.indices, self.indptr),
                                    shape=(self.num_docs, len(self.df)), copy=False)
        # postings touched before each query
        nnz = np.concatenate([[0], np.cumsum(self.df[terms])])[qptr]
        nq = len(qptr) - 1
        ids, scores, n = _outputs(nq, k)
        start = 0
        while start < nq:
            fits = int(np.searchsorted(nnz, nnz[start] + MAX_CHUNK_NNZ, side="right"))
            end = max(start + 1, fits - 1)
            end = min(end, nq)
            a, b = qptr[start], qptr[end]
            Q = sp.csc_matrix((counts[a:b], terms[a:b], qptr[start : end + 1] - a),
                              shape=(len(self.df), end - start))
            for q, (d, sc) in enumerate(top_k_sparse((self._W @ Q).tocsc(), k), start):
                ids[q, : len(d)], scores[q, : len(d)], n[q] = d, sc, len(d)
            start = end
        return ids, scores, n

    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        if self._ids is None:
            return super().retrieve(queries, k)
        out: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        if not live or k <= 0:
            return out
        ids, scores, n = self._top([queries[i] for i in live], min(k, self.num_docs))
        pid, text = self._ids.__getitem__, self._contents.__getitem__
        for i, d, s, m in zip(live, ids.tolist(), scores.tolist(), n.tolist()):
            out[i] = list(map(Passage, map(pid, d[:m]), map(text, d[:m]), s[:m]))
        return out


def build_bm25_index(texts: list[str], folder: Path, show_progress: bool = True,
                     **_options: Any) -> dict:
    """``hindsearch index --kind bm25``: the bm25s index of ``texts`` in ``folder/bm25`` (no
    ``index.json`` fields)."""
    build_bm25(texts, folder / "bm25", show_progress=show_progress)
    return {}


def check_bm25_options(hnsw: int | None = None, factory: str | None = None,
                       nprobe: int | None = None, ef_search: int | None = None,
                       **_options: Any) -> None:
    """Refuse the FAISS flags (a BM25 build would ignore them)."""
    if factory or hnsw or nprobe or ef_search:
        raise ValueError("--factory, --hnsw, --nprobe and --ef-search apply to --kind dense")


def load_bm25(index_dir: str | Path, meta: dict, n_threads: int = 0, bm25_backend: str = "auto",
              nprobe: int | None = None, ef_search: int | None = None, faiss_gpu: bool = False,
              **_options: Any) -> BM25Retriever:
    """A BM25 index folder (``n_threads``/``bm25_backend``: ``BM25Retriever``); the dense search
    flags are refused."""
    if nprobe or ef_search or faiss_gpu:
        raise ValueError(f"{index_dir} is a BM25 index: "
                         f"--nprobe, --ef-search and --faiss-gpu apply to dense indexes")
    return BM25Retriever(index_dir, n_threads=n_threads, backend=bm25_backend)


register_index_kind("bm25", build=build_bm25_index, load=load_bm25, check=check_bm25_options)
