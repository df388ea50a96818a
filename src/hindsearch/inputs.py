"""A run's inputs, resolved from its config once for ``train``, ``sft``, ``eval``, ``compare`` and
``probe``.

``prepare(cfg)`` resolves the data (the configured files, or the fictional world, built on first
use), the index (the configured one, or the world's) and the retriever, and loads the training and
dev questions; ``eval_engine`` is the HF rollout engine every evaluation uses; ``belonging_warning``
says when the QA data and the retriever's corpus do not belong together.
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
    """The retriever of ``cfg.retrieval`` over ``paths["index_dir"]`` and the world's corpus (or the
    remote server)."""


def resolve_data(cfg: Config, index: bool = True) -> dict[str, Any]:
    """Paths of the world, train/dev data and the index; builds the world and its index on first use
    (``index=False``: no index, the retriever is given)."""
    from hindsearch.retrieval.registry import RETRIEVERS

    world = None
    needs_index = (index and RETRIEVERS.get(cfg.retrieval.kind).index
                   and cfg.retrieval.index_dir is None)
    if cfg.data.train is None or cfg.data.dev is None or needs_index:
        from hindsearch.data.world import ensure_world_for

        world = Path(ensure_world_for(cfg.data))
    index_dir = cfg.retrieval.index_dir
    if needs_index:
        from hindsearch.retrieval.factory import ensure_index

        index_dir = ensure_index(world / "corpus.jsonl", world / f"index-{cfg.retrieval.kind}",
                                 kind=cfg.retrieval.kind, encoder=cfg.retrieval.encoder)
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
    """The retriever of ``cfg.retrieval``: the remote server, or the index folder ``resolve_data``
    found."""
    from hindsearch.retrieval.factory import load_retriever

    corpus = paths["world"] / "corpus.jsonl" if paths.get("world") is not None else None
    return load_retriever(cfg.retrieval, paths["index_dir"], corpus)


def prepare(cfg: Config, retriever: Any = None) -> Setup:
    """Data, index, retriever and questions of ``cfg``; ``retriever`` (any object with
    ``retrieve(queries, k)``) replaces the configured one, and no index is built for it."""
    paths = resolve_data(cfg, index=retriever is None)
    train, dev = load_records(cfg, paths)
    return Setup(paths, train, dev,
                 retriever if retriever is not None else open_retriever(cfg, paths))


def eval_engine(cfg: Config, model: Any, tokenizer: Any, retriever: Any) -> Any:
    """The rollout engine evaluations use: transformers decoding of ``model`` (greedy or sampled per
    call)."""
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.hf_backend import HFBackend

    return RolloutEngine(model, tokenizer, retriever, replace(cfg.rollout, backend="hf"),
                         topk=cfg.retrieval.topk, backend=HFBackend(model, tokenizer))


BELONG_SAMPLE = 50
"""Training questions ``answers_retrieved`` checks (the first ones of the file: a fixed, cheap
sample)."""


def answers_retrieved(records: list[Any], retriever: Any, k: int,
                      n: int = BELONG_SAMPLE) -> tuple[int, int]:
    """``(hits, checked)``: of the first ``n`` of ``records``, how many find a gold answer
    (normalised, as EM reads it) in the ``k`` passages ``retriever`` returns for the question. 0
    hits of many means the QA data and the retriever's corpus do not belong together (a run would
    train on questions it can never answer)."""
    from hindsearch.answers import answer_in_text

    sample = [r for r in records[:n] if r.golden_answers]
    if not sample:
        return 0, 0
    found = retriever.retrieve([r.question for r in sample], k)
    hits = sum(any(answer_in_text(r.golden_answers, p.contents) for p in ps)
               for r, ps in zip(sample, found))
    return hits, len(sample)


def belonging_warning(cfg: Config, setup: "Setup", k: int | None = None) -> str | None:
    """A one-line warning when none of the sampled training questions finds a gold answer in what
    the retriever returns for it (``answers_retrieved``), naming the QA file and the retriever; None
    when some do, or when fewer than 10 could be checked. A retrieval error is no verdict: None."""
    try:
        hits, checked = answers_retrieved(setup.train, setup.retriever,
                                          k or max(cfg.retrieval.topk, 5))
    # a server down is reported by the run itself, not by this check
    except Exception:  # noqa: BLE001
        return None
    if checked < 10 or hits:
        return None
    where = (cfg.retrieval.url if cfg.retrieval.kind == "remote" else
             setup.paths.get("index_dir") or type(setup.retriever).__name__)
    return (f"warning: none of the first {checked} training questions ({setup.paths['train']}) "
            f"finds a gold answer in the passages the retriever ({cfg.retrieval.kind}: {where}) "
            "returns for it; the QA data and the corpus do not seem to belong together: set "
            "data.train and data.dev to questions about your corpus")
