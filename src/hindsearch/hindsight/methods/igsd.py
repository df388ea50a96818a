"""IGSD (method ``igsd``, term ``igsd``): its options (``[igsd]``), its term and its metrics.

Gold-hindsight teacher proposals on query tokens, verified by matched completion + retrieval + answer-likelihood gain
(``hindsearch.hindsight.igsd``) → gated pair KL. ``loss`` returns the *unweighted* loss; the trainer adds
``lam * loss``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from hindsearch.config.fields import AGGREGATIONS, GATES, TEACHERS, bounded, choice
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxBatch, AuxContext, at, mask_positions
from hindsearch.hindsight.igsd import run_igsd
from hindsearch.hindsight.igsd.types import METRIC_KEYS
from hindsearch.hindsight.registry import Metrics, register_method
from hindsearch.hindsight.teacher import select_teacher
from hindsearch.records import Trajectory


@dataclass
class IGSDConfig:
    lam: float = bounded(0.1, ge=0.0)
    """Weight lambda of L_igsd in L = L_GRPO + lambda * L_igsd."""
    max_positions_per_rollout: int = bounded(8, gt=0)
    """Query-token positions verified per failed rollout."""
    positions: str = choice("disagree", ("disagree", "all", "random"))
    """``disagree`` (teacher top token != student token), ``all`` or ``random``."""
    answer_tokens: str = choice("keep", ("keep", "drop"))
    """``keep`` (the paper's form): any query position may be verified and distilled. ``drop``: a position whose
    proposed teacher token is a token of a gold answer that the student has not seen (not in its prompt or its
    completion before the position) is neither verified nor distilled: the student cannot produce that token
    without the hindsight, and distilling it teaches the student to put *some* name there (the micro-scarce run
    of 2026-12-02: the share of first queries made of the question's words fell from 96% to 29%)."""
    max_query_tokens: int = bounded(24, gt=0)
    """Cap of a matched query completion (cut and still executed when ``</search>`` never comes)."""
    n_controls: int = bounded(2, ge=0)
    """Shared counterfactual control sets per pair."""
    control: str = choice("random", ("random", "empty"))
    """``random`` corpus passages or ``empty`` information block."""
    gate: str = choice("positive_sigmoid", GATES)
    """``positive_sigmoid`` (paper), ``sigmoid``, ``hard`` or ``none`` (ungated pair distillation);
    ``hindsearch.hindsight.losses.GATES`` reads this tuple."""
    gate_sharpness: float = bounded(5.0, gt=0.0)
    """Gate sharpness (the paper's beta in sigmoid(beta * (delta - margin))). Was ``igsd.beta``, still read
    with a deprecation message."""
    margin: float = 0.0
    """Gate margin on the paired gain delta."""
    aggregation: str = choice("token-mean", AGGREGATIONS)
    """How ``L_igsd`` is reduced over the verified positions (``token-mean``: gated KL summed over positions
    divided by their number, the paper's form)."""
    max_answer_tokens: int = bounded(16, gt=0)
    """Answer tokens scored by the utility u(D); longer answers are cut (and counted)."""
    teacher: str = choice("frozen", TEACHERS)
    """Teacher weights for proposals and the pair distribution: ``frozen``, ``live`` or ``ema``."""
    ema_decay: float = bounded(0.99, ge=0.0, le=1.0)
    """EMA decay when ``teacher = ema`` (this term's own EMA of the policy; HindSearch's ``hindsearch.ema_decay``
    before, the same default)."""


_MEANS = ("cache_hit_rate", "mean_delta", "frac_delta_pos", "mean_gate")

METRICS = Metrics(
    # prepare: counts and seconds of a process's own rows add up, rates and means are averaged; loss: averaged
    reductions={**{k: "mean" if k in _MEANS else "sum" for k in METRIC_KEYS}, "L_igsd": "mean", "positions": "mean"},
    loss="L_igsd",
    panels={"IGSD gate statistics": tuple(sorted(k for k in METRIC_KEYS if "gate" in k or "delta" in k))},
)
"""``igsd/*``: how each is reduced over processes, the loss key and the report's panel."""


@register_method("igsd", config=IGSDConfig)
class IGSDTerm:
    """IGSD: information-gain-gated candidate-pair self-distillation of query tokens."""

    name = "igsd"
    metrics = METRICS

    def __init__(self, cfg: IGSDConfig, seed: int = 0, corpus: Any = None):
        self.cfg, self.lam, self.corpus, self.seed = cfg, cfg.lam, corpus, seed
        self.aggregation = cfg.aggregation
        self.ema_decay = cfg.ema_decay if cfg.teacher == "ema" else None

    def prepare(self, trajectories: list[Trajectory], completion_len: int, ctx: AuxContext) -> AuxBatch:
        """Propose, verify and gate the teacher's query tokens of the failed rollouts (``run_igsd``): matched
        completions through ``ctx.complete``, retrieval through ``ctx.retriever`` with ``ctx.topk``."""
        tens, met, samples = run_igsd(
            trajectories, completion_len, policy=ctx.policy, teacher=select_teacher(self.cfg.teacher, ctx),
            tokenizer=ctx.tokenizer, retriever=ctx.retriever, cfg=self.cfg, topk=ctx.topk, complete=ctx.complete,
            corpus=self.corpus, rng=random.Random(self.seed * 1_000_003 + ctx.step),
        )
        return AuxBatch(tens, met, samples)

    def positions(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """The verified query positions of failed rollouts: ``igsd_mask > 0``."""
        return mask_positions(inputs["igsd_mask"], completion_len)

    def loss(self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor,
             inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_igsd`` from the student logits ``[N, V]`` at the selected positions ``idx [N, 2]``."""
        g = {k: at(v, idx) for k, v in inputs.items() if k.startswith("igsd_")}
        L = losses.igsd_pair_loss(logits, g["igsd_b"], g["igsd_a"], g["igsd_pT"], g["igsd_gate"], g["igsd_mask"],
                                  self.cfg.aggregation)
        return L, {"L_igsd": float(L.detach()), "positions": float(inputs["igsd_mask"].sum())}
