"""Contract between the GRPO trainer and the hindsight terms (HindSearch, IGSD).

An auxiliary term adds ``lam * L_aux`` to TRL's GRPO loss without touching it:

1. ``prepare`` runs once per generation batch, right after the rollouts are scored and
   before any optimisation step. It sees the step's trajectories (rewards known) and
   returns per-sample tensors aligned with the trainer's right-padded completion ids
   (``[B, T, ...]``, ``T`` = padded completion length, row ``i`` = trajectory ``i``), plus
   step metrics and auditable sample records (critiques, verified query pairs, ...).
   Everything here runs without grad (judge, teacher forward, query completion, retrieval).
2. ``loss`` runs inside ``compute_loss`` on the student's logits of the **same** forward pass
   that TRL uses for the GRPO loss (no second policy forward), and returns a scalar with grad
   plus metrics. Only the positions some term asks for (``positions``) are projected through the
   LM head: ``logits[n]`` are the raw (not temperature-scaled) logits that predict
   ``completion_ids[idx[n, 0], idx[n, 1]]``; a term reads its own positions out of them.

A term must return an exact zero (still a tensor attached to ``logits``) when it has nothing
to distil (no failed rollouts, no query tokens, all gates zero), never NaN.

A term is registered with its options and metric declarations (``hindsight/registry.py: register_method``); it
sees the run only through ``AuxContext``: models, tokenizer, retriever, the rollout engine's query completer and
top-k, the step and the device, never the engine or the whole config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hindsearch.records import Trajectory

if TYPE_CHECKING:
    from hindsearch.agent.backend import Backend
    from hindsearch.hindsight.registry import Metrics
    from hindsearch.retrieval.base import Retriever

@dataclass
class AuxContext:
    """What a term may use while preparing a batch (all models in eval mode, no grad)."""

    policy: torch.nn.Module | None
    """The current policy (unwrapped ``PreTrainedModel``); never updated by a term."""
    frozen: torch.nn.Module | None
    """The initial policy weights (also the judge and the frozen teacher by default)."""
    tokenizer: Any
    """The policy's tokenizer (``PreTrainedTokenizerBase``)."""
    retriever: Retriever | None
    """The retriever the rollouts used (``retrieve(queries, topk)``)."""
    complete: Backend | None = None
    """The rollout engine's query completer (``RolloutEngine.query_completer``: a backend whose ``complete_queries``
    decodes elsewhere, vLLM) or None when the policy decodes in this process (IGSD then completes on an HF backend of
    ``policy``, the same greedy decoding)."""
    topk: int = 3
    """Passages per search of the rollouts (``retrieval.topk``)."""
    step: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    ema: torch.nn.Module | None = None
    """The EMA copy of the policy at the term's own decay, when the term asked for one (``ema_decay``), else None."""


@dataclass
class AuxBatch:
    """Output of ``AuxTerm.prepare``."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-sample tensors, first dim B (rows follow the trajectories), second dim T when per token."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Step metrics (counts, means, times in seconds), logged under ``<term>/<key>``."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Per-trajectory records to store with the rollouts in samples.jsonl (index ``i`` → trajectory ``i``)."""


class AuxTerm(Protocol):
    name: str
    """Short name used as the metrics prefix and tensor-key prefix (``hind``, ``igsd``)."""
    metrics: Metrics
    """Every metric key ``prepare`` and ``loss`` return, with its reduction over processes, and the report's panels."""
    ema_decay: float | None
    """The decay of the EMA teacher this term reads from ``AuxContext.ema`` (None: it needs none)."""
    lam: float
    """Weight of the term in ``L = L_GRPO + lam * L_aux``."""
    aggregation: str
    """How ``loss`` reduces over its positions (``hindsight.losses.AGGREGATIONS``); the trainer weights each
    micro-batch's loss by its share of the step's units (``losses.micro_batch_weight``). A term without the
    attribute is taken as ``token-mean``."""

    def prepare(self, trajectories: list[Trajectory], completion_len: int, ctx: AuxContext) -> AuxBatch: ...

    def positions(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """Bool ``[B, completion_len]``: the completion positions whose logits ``loss`` needs."""
        ...

    def loss(
        self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor, inputs: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``logits``: [N, V] with grad at the ``N`` selected positions ``idx`` ([N, 2] of (row, t), the union of
        every term's ``positions``); ``completion_ids``: [B, T]; ``inputs`` holds the tensors from ``prepare``
        (sliced to the same B rows). Returns (scalar loss, metrics)."""
        ...


def mask_positions(mask: torch.Tensor, completion_len: int) -> torch.Tensor:
    """Bool ``[B, completion_len]`` of ``mask > 0`` (a term tensor ``[B, T]``; padded or cut to the length)."""
    out = torch.zeros(mask.shape[0], completion_len, dtype=torch.bool, device=mask.device)
    T = min(completion_len, mask.shape[1])
    out[:, :T] = mask[:, :T] > 0
    return out


def at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Values of a per-token tensor ``[B, T, ...]`` at the selected positions ``idx [N, 2]`` → ``[N, ...]``."""
    idx = idx.to(t.device)
    return t[idx[:, 0], idx[:, 1]]


def scatter(v: torch.Tensor, idx: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """Per-position values ``[N]`` back into a zero ``[B, T]`` tensor (differentiable), for ``losses.agg``."""
    out = torch.zeros(shape, dtype=v.dtype, device=v.device)
    return out.index_put((idx[:, 0].to(v.device), idx[:, 1].to(v.device)), v)

