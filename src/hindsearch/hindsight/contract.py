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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hindsearch.records import Trajectory


@dataclass
class AuxContext:
    """What a term may use while preparing a batch (all models in eval mode, no grad)."""

    policy: Any
    """The current policy (unwrapped ``PreTrainedModel``); never updated by a term."""
    frozen: Any
    """The initial policy weights (also the judge and the frozen teacher by default)."""
    tokenizer: Any
    retriever: Any
    """A ``hindsearch.retrieval.base.Retriever`` (the one the rollouts used)."""
    rollout_engine: Any
    """The ``hindsearch.agent.engine.RolloutEngine`` the trainer uses (for matched completions)."""
    config: Any
    """The resolved ``hindsearch.config.Config``."""
    step: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    ema: Any = None
    """EMA copy of the policy when a term asked for ``teacher = ema`` (else None)."""


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
