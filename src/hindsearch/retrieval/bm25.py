"""BM25 retrieval with bm25s (Lucene BM25, PyStemmer English stemmer, English stopwords).

bm25s builds the index (the per-(term, document) BM25 scores as a sparse document x term
matrix) into ``<index>/bm25/``; it is loaded memory-mapped, and passages come from the index
folder's ``PassageStore``. Hits with score 0 (no query term in the passage) are dropped, so a
query of only stopwords/unknown words gets an empty list; k larger than the corpus is clamped.

Backends (``BM25Retriever(backend=...)``):

* ``sparse`` (default, ``auto``): all queries of a batch scored at once as one sparse product
  ``W [docs, terms] @ Q [terms, queries]``; top-k per query among the matching documents only,
  ties broken by document order. Chunked so the product stays under ``MAX_CHUNK_NNZ`` entries.
* ``numpy`` / ``numba``: bm25s' own per-query retrieval (``n_threads`` workers); numba needs
  the numba package and compiles for ~10 s in each new process.
All three give the same scores (float32 rounding aside).
"""

from __future__ import annotations

from pathlib import Path

import bm25s
import numpy as np
import scipy.sparse as sp
import Stemmer

from hindsearch.retrieval.base import Hits, IndexedRetriever, PassageStore

STOPWORDS = "en"
BACKENDS = ("auto", "sparse", "numpy", "numba")
MAX_CHUNK_NNZ = 20_000_000


def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def tokenize(texts: list[str], stemmer: Stemmer.Stemmer | None = None, show_progress: bool = False) -> list[list[str]]:
    """Lowercase, split on words, drop English stopwords, stem: one token list per text."""
    return bm25s.tokenize(
        texts, stopwords=STOPWORDS, stemmer=stemmer or _stemmer(), return_ids=False, show_progress=show_progress
    )


def build_bm25(texts: list[str], out_dir: str | Path, show_progress: bool = True) -> None:
    """Index ``texts`` (document i = texts[i]) with bm25s and save to ``out_dir``."""
    tokens = bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=_stemmer(), show_progress=show_progress)
    model = bm25s.BM25()
    model.index(tokens, show_progress=show_progress)
    model.save(str(out_dir), show_progress=False)


def top_k_sparse(scores: sp.csc_matrix, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per column of ``scores`` [docs, queries]: (doc ids [<=k], scores [<=k]), best first.

    Only stored (non-zero) entries compete; equal scores keep document order.
    """
    out = []
    for j in range(scores.shape[1]):
        a, b = scores.indptr[j], scores.indptr[j + 1]
        s, ix = scores.data[a:b], scores.indices[a:b]
        keep = s > 0
        s, ix = s[keep], ix[keep]
        if len(s) > k:
            part = np.argpartition(-s, k - 1)[:k]
            kth = s[part].min()
            tied = np.flatnonzero(s >= kth)  # keep every doc tied with the k-th, so ties resolve by doc order
            s, ix = s[tied], ix[tied]
        order = np.lexsort((ix, -s))[:k]
        out.append((ix[order], s[order]))
    return out


def pick_backend(backend: str) -> str:
    """Resolve ``auto`` and check the backend is usable."""
    if backend not in BACKENDS:
        raise ValueError(f"bm25 backend {backend!r} is not supported; choose one of {', '.join(BACKENDS)}")
    if backend == "numba" and not bm25s.NUMBA_AVAILABLE:
        raise ImportError("bm25 backend 'numba' needs numba: pip install numba")
    return "sparse" if backend == "auto" else backend


class BM25Retriever(IndexedRetriever):
    """``Retriever`` over a bm25 index folder."""

    def __init__(self, index_dir: str | Path, n_threads: int = 0, mmap: bool = True, backend: str = "auto"):
        self.index_dir = Path(index_dir)
        self.store = PassageStore(index_dir)
        self.backend = pick_backend(backend)
        self.model = bm25s.BM25.load(
            str(self.index_dir / "bm25"), mmap=mmap, show_progress=False,
            backend="numba" if self.backend == "numba" else "numpy",
        )
        sc = self.model.scores
        if self.backend == "sparse" and self.model.nonoccurrence_array is not None:
            self.backend = "numpy"  # BM25L/BM25+ add a per-term constant the sparse product does not model
        self.df = np.diff(sc["indptr"])  # documents per term [V]
        self.W = sp.csc_matrix((sc["data"], sc["indices"], sc["indptr"]), shape=(sc["num_docs"], len(self.df)), copy=False)
        self.vocab = self.model.vocab_dict
        self.stemmer = _stemmer()
        self.n_threads = n_threads

    def term_ids(self, queries: list[str]) -> list[list[int]]:
        """Known term ids of each query (unknown words and stopwords dropped)."""
        return [[self.vocab[t] for t in q if t in self.vocab] for q in tokenize(queries, self.stemmer)]

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        """(doc ids, scores) per query, best first, at most k each (zero scores dropped)."""
        if self.backend != "sparse":
            toks = [[t for t in q if t in self.vocab] for q in tokenize(queries, self.stemmer)]
            filler = next(iter(self.vocab))  # bm25s needs a token; results of empty queries are dropped
            res = self.model.retrieve([q or [filler] for q in toks], k=k, show_progress=False, n_threads=self.n_threads)
            return [(d[s > 0], s[s > 0]) if q else (d[:0], s[:0]) for q, d, s in zip(toks, res.documents, res.scores)]
        ids = self.term_ids(queries)
        out: list[Hits] = []
        start = 0
        while start < len(ids):  # chunk so the sparse product stays bounded
            end, nnz = start, 0
            while end < len(ids) and (end == start or nnz + self.df[ids[end]].sum() <= MAX_CHUNK_NNZ):
                nnz += self.df[ids[end]].sum()
                end += 1
            rows = [t for q in ids[start:end] for t in q]
            cols = [j for j, q in enumerate(ids[start:end]) for _ in q]
            Q = sp.csc_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(self.W.shape[1], end - start))
            out += top_k_sparse((self.W @ Q).tocsc(), k)
            start = end
        return out
