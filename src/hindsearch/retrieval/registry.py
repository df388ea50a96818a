"""Retriever kinds by name (``retrieval.kind``): what ``base.register_retriever`` and
``base.register_index_kind`` add to. A built-in kind's module is imported when its name is first
looked up."""

from __future__ import annotations

from hindsearch.config.registry import Registry

RETRIEVERS = Registry("retrieval.kind",
                      {"bm25": "hindsearch.retrieval.bm25", "dense": "hindsearch.retrieval.dense",
                                         "remote": "hindsearch.retrieval.client"})
"""Retriever kinds (``hindsearch.retrieval.base.register_retriever``, ``register_index_kind``)."""
