"""One setup path: what ``train``, ``sft``, ``eval``, ``compare`` and ``probe`` all need from a config.

``prepare(cfg)`` resolves the data (the configured files, or the fictional world, built and cached on first use),
the index (the configured one, or the world's, built when missing with the configured encoder) and the retriever
(the registered ``retrieval.kind``, or a retriever object given from Python), and loads the training and dev
questions. ``eval_engine`` is the greedy HF rollout
engine every evaluation uses. Written once here; the commands only add what is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hindsearch.config import Config


@dataclass
class Setup:
    """What ``prepare`` resolved for a config."""

    paths: dict[str, Any]
    """``world`` (None when not needed), ``train``, ``dev`` (question files) and ``index_dir``."""
    train: list[Any]
    """Training questions (``data.max_train_questions`` applied)."""
    dev: list[Any]
    """Dev questions (``train.eval_limit`` applied)."""
    retriever: Any
    """The retriever of ``cfg.retrieval`` over ``paths["index_dir"]`` and the world's corpus (or the remote server)."""


def resolve_data(cfg: Config, index: bool = True) -> dict[str, Any]:
    """Paths of the world, train/dev data and the index; builds the world and its index on first use
    (``index=False``: no index, the retriever is given)."""
    from hindsearch.config.registry import RETRIEVERS

    world = None
    needs_index = index and RETRIEVERS.get(cfg.retrieval.kind).index and cfg.retrieval.index_dir is None
    if cfg.data.train is None or cfg.data.dev is None or needs_index:
        from hindsearch.data.world import ensure_world_for

        world = Path(ensure_world_for(cfg.data))
    index_dir = cfg.retrieval.index_dir
    if needs_index:
        from hindsearch.retrieval.factory import ensure_index

        index_dir = ensure_index(world / "corpus.jsonl", world / f"index-{cfg.retrieval.kind}", kind=cfg.retrieval.kind,
                                 encoder=cfg.retrieval.encoder)
    return {
        "world": world,
        "train": Path(cfg.data.train) if cfg.data.train else world / "train.jsonl",
        "dev": Path(cfg.data.dev) if cfg.data.dev else world / "dev.jsonl",
        "index_dir": index_dir,
    }


def load_records(cfg: Config, paths: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    from hindsearch.data.qa import load_qa

    train = load_qa(paths["train"])
    if cfg.data.max_train_questions:
        train = train[: cfg.data.max_train_questions]
    dev = load_qa(paths["dev"])
    if cfg.train.eval_limit:
        dev = dev[: cfg.train.eval_limit]
    if not train:
        raise ValueError(f"{paths['train']}: no training questions")
    return train, dev


def open_retriever(cfg: Config, paths: dict[str, Any]) -> Any:
    """The retriever of ``cfg.retrieval``: the remote server, or the index folder ``resolve_data`` found."""
    from hindsearch.retrieval.factory import load_retriever

    corpus = paths["world"] / "corpus.jsonl" if paths.get("world") is not None else None
    return load_retriever(cfg.retrieval, paths["index_dir"], corpus)


def prepare(cfg: Config, retriever: Any = None) -> Setup:
    """Data, index, retriever and questions of ``cfg``; ``retriever`` (any object with ``retrieve(queries, k)``)
    replaces the configured one, and no index is built for it."""
    paths = resolve_data(cfg, index=retriever is None)
    train, dev = load_records(cfg, paths)
    return Setup(paths, train, dev, retriever if retriever is not None else open_retriever(cfg, paths))


def eval_engine(cfg: Config, model: Any, tokenizer: Any, retriever: Any) -> Any:
    """The rollout engine evaluations use: transformers decoding of ``model`` (greedy or sampled per call)."""
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.hf_backend import HFBackend

    return RolloutEngine(model, tokenizer, retriever, replace(cfg.rollout, backend="hf"), topk=cfg.retrieval.topk,
                         backend=HFBackend(model, tokenizer))
