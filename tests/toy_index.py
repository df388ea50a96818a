"""A plugin outside ``src/``: an index-backed retriever kind, ``toyidx``, in one file. Its index is a keyword table
(``keywords.json``: lower-cased word -> the documents holding it) written into the index folder beside the passage
store hindsearch writes; ``hindsearch index --kind toyidx`` builds it and ``hindsearch search --index`` (or
``retrieval.kind = "toyidx"``) searches it. Used by tests/test_plugins.py; nothing under ``src/`` names it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from hindsearch.retrieval.base import Hits, IndexedRetriever, PassageStore, register_index_kind

WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    return {w.lower() for w in WORD.findall(text)}


def build(texts: list[str], folder: Path, show_progress: bool = True, min_len: int = 1, **options) -> dict:
    """``keywords.json`` of the words of at least ``min_len`` characters; ``min_len`` goes in index.json."""
    table: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        for w in sorted(words(text)):
            if len(w) >= min_len:
                table.setdefault(w, []).append(i)
    (folder / "keywords.json").write_text(json.dumps(table))
    return {"min_len": min_len, "n_words": len(table)}


def check(min_len: int = 1, **options) -> None:
    if min_len < 1:
        raise ValueError(f"toyidx: min_len = {min_len}, must be >= 1")


class KeywordRetriever(IndexedRetriever):
    """Documents ranked by how many distinct query words they hold (ties: corpus order)."""

    def __init__(self, index_dir: str | Path, meta: dict):
        self.store = PassageStore(index_dir)
        self.table = json.loads((Path(index_dir) / "keywords.json").read_text())
        self.meta = meta

    def _search(self, queries: list[str], k: int) -> list[Hits]:
        out = []
        for q in queries:
            counts = np.zeros(len(self.store), np.float32)
            for w in words(q):
                counts[self.table.get(w, [])] += 1
            order = np.argsort(-counts, kind="stable")[:k]
            order = order[counts[order] > 0]
            out.append((order, counts[order]))
        return out


def load(index_dir: str | Path, meta: dict, **options) -> KeywordRetriever:
    return KeywordRetriever(index_dir, meta)


register_index_kind("toyidx", build=build, load=load, check=check)
