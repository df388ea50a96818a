"""The contract between the GRPO trainer and the hindsight terms (HindSearch, IGSD).

A term adds ``lam * L_term`` to TRL's GRPO loss. ``prepare`` runs once per generation batch (no
grad) on the scored trajectories and returns per-row tensors aligned with the right-padded
completion ids; ``loss`` runs inside ``compute_loss`` on the logits, at the positions the terms ask
for (``positions``), of the same forward TRL's loss uses, and returns an exact zero (a tensor
attached to the logits, never NaN) when it has nothing to distil. A term sees the run only through
``AuxContext``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hindsearch.records import Trajectory

if TYPE_CHECKING:
    from hindsearch.hindsight.registry import Metrics
    from hindsearch.retrieval.base import Retriever


class QueryCompleter(Protocol):
    """What completes IGSD's proposed queries: the rollout engine
    (``RolloutEngine.complete_queries``, through whatever backend it decodes with) or any
    ``agent.backend.Backend``."""

    def complete_queries(self, prefixes: list[list[int]], max_new_tokens: int, groups: Any = None,
                         batch_size: int = 16) -> list[Any]: ...


@dataclass
class AuxContext:
    """What a term may use while preparing a batch (all models in eval mode, no grad). A run builds
    one (the trainer, when it is constructed); ``step`` is its only per-step field, set by the
    trainer before each ``prepare``."""

    policy: torch.nn.Module | None
    """The current policy (unwrapped ``PreTrainedModel``); never updated by a term."""
    frozen: torch.nn.Module | None
    """The initial policy weights (also the judge and the frozen teacher by default)."""
    tokenizer: Any
    """The policy's tokenizer (``PreTrainedTokenizerBase``)."""
    retriever: Retriever | None
    """The retriever the rollouts used (``retrieve(queries, topk)``)."""
    complete: QueryCompleter | None = None
    """The query completer: the rollout engine, which decodes the policy with its own backend (HF or
    vLLM)."""
    topk: int = 3
    """Passages per search of the rollouts (``retrieval.topk``)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    emas: Mapping[float, torch.nn.Module] = field(default_factory=dict)
    """The EMA copies of the policy by decay, one per ``ema_decay`` some term asked for."""
    step: int = 0
    """The optimizer steps done before this batch (the one per-step field)."""

    @classmethod
    def of_engine(cls, engine: Any,
                  frozen: torch.nn.Module | None = None, **kw: Any) -> "AuxContext":
        """The context of terms that train the policy ``engine`` rolls out: its model, tokenizer,
        retriever and top-k, the engine as the query completer."""
        return cls(policy=engine.model, frozen=frozen, tokenizer=engine.tokenizer,
                   retriever=engine.retriever, complete=engine, topk=engine.topk, **kw)


@dataclass
class AuxBatch:
    """Output of ``AuxTerm.prepare``."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-sample tensors, first dim B (rows follow the trajectories), second dim T when per
    token."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Step metrics (counts, means, times in seconds), logged under ``<term>/<key>``."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Per-trajectory records to store with the rollouts in samples.jsonl (index ``i`` → trajectory
    ``i``)."""


class AuxTerm(Protocol):
    name: str
    """Short name used as the metrics prefix and tensor-key prefix (``hind``, ``igsd``)."""
    metrics: Metrics
    """Every metric key ``prepare`` and ``loss`` return, with its reduction over processes, and the
    report's panels."""
    ema_decay: float | None
    """The decay of the EMA teacher this term reads from ``AuxContext.emas`` (None: it needs
    none)."""
    lam: float
    """Weight of the term in ``L = L_GRPO + lam * L_aux``."""
    aggregation: str
    """How ``loss`` reduces over its positions (``hindsight.losses.AGGREGATIONS``); the trainer
    weights each micro-batch's loss by its share of the step's units
    (``losses.micro_batch_weight``). A term without the attribute is taken as ``token-mean``."""

    def prepare(self, trajectories: list[Trajectory], completion_len: int,
                ctx: AuxContext) -> AuxBatch: ...

    def positions(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """Bool ``[B, completion_len]``: the completion positions whose logits ``loss`` needs."""
        ...

    def loss(
        self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor,
        inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``logits``: [N, V] with grad at the ``N`` selected positions ``idx`` ([N, 2] of (row, t),
        the union of every term's ``positions``); ``completion_ids``: [B, T]; ``inputs`` holds the
        tensors from ``prepare`` (sliced to the same B rows). Returns (scalar loss, metrics)."""
        ...


def mask_positions(mask: torch.Tensor, completion_len: int) -> torch.Tensor:
    """Bool ``[B, completion_len]`` of ``mask > 0`` (a term tensor ``[B, T]``; padded or cut to the
    length)."""
    out = torch.zeros(mask.shape[0], completion_len, dtype=torch.bool, device=mask.device)
    T = min(completion_len, mask.shape[1])
    out[:, :T] = mask[:, :T] > 0
    return out


def at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Values of a per-token tensor ``[B, T, ...]`` at the selected positions ``idx [N, 2]`` → ``[N,
    ...]``."""
    idx = idx.to(t.device)
    return t[idx[:, 0], idx[:, 1]]


def scatter(v: torch.Tensor, idx: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Per-position values ``[N]`` back into a zero ``[B, T]`` tensor (differentiable), for
    ``losses.agg``."""
    out = torch.zeros(shape, dtype=v.dtype, device=v.device)
    return out.index_put((idx[:, 0].to(v.device), idx[:, 1].to(v.device)), v)

