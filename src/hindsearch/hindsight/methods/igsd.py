"""IGSD (method ``igsd``, term ``igsd``): its options (``[igsd]``), its term and its metrics.

Gold-hindsight teacher proposals on query tokens, verified by matched completion + retrieval +
answer-likelihood gain (``hindsearch.hindsight.igsd``) → gated pair KL. ``loss`` returns the
*unweighted* loss; the trainer adds ``lam * loss``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from hindsearch.config.fields import AGG_MODES, GATES, TEACHERS, bounded, choice
from hindsearch.hindsight import losses
from hindsearch.hindsight.contract import AuxBatch, AuxContext, at, mask_positions
from hindsearch.hindsight.igsd import METRIC_KEYS, hint_lines, run_igsd
from hindsearch.hindsight.registry import Metrics, register_method
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
    """``keep`` (the paper's form): any query position may be verified and distilled. ``drop``: a
    position whose proposed teacher token is a token of a gold answer that the student has not seen
    (not in its prompt or its completion before the position) is neither verified nor distilled: the
    student cannot produce that token without the hindsight, and distilling it teaches the student
    to put *some* name there (docs/methods.md gives the run that showed it)."""
    max_query_tokens: int = bounded(24, gt=0)
    """Cap of a matched query completion (cut and still executed when ``</search>`` never comes)."""
    n_controls: int = bounded(2, ge=0)
    """Shared counterfactual control sets per pair."""
    control: str = choice("random", ("random", "empty"))
    """``random`` corpus passages or ``empty`` information block."""
    gate: str = choice("positive_tanh", GATES)
    """``positive_tanh`` (zero weight at the margin, rising continuously above it),
    ``positive_sigmoid`` (the paper's form: it jumps to 0.5 just above the margin, so noise passes
    at half weight), ``sigmoid``, ``hard`` or ``none`` (ungated pair distillation);
    ``hindsearch.hindsight.losses.GATES`` reads this tuple."""
    gate_input: str = choice("delta", ("delta", "min_controls"))
    """What the gate reads: ``delta`` (the paired gain), or ``min_controls``, ``min(delta, IG_T)``:
    the teacher's documents must also beat the random control sets (so two junk sets never open it
    on noise alone)."""
    utility_state: str = choice("shared", ("shared", "query"))
    """Where ``u(D)`` is scored. ``shared``: both sides' documents and the controls after one state,
    the rollout's own search as it issued it, so identical documents give ``delta = 0`` exactly and
    the controls cancel. ``query`` (DESIGN's literal reading): each side after its own completed
    query; a query that names the answer lifts the answer's likelihood by itself and the controls
    over-cancel, so the gate reads the student's failure rather than what the teacher retrieved."""
    proposals: str = choice("reachable", ("reachable", "any"))
    """Which teacher tokens are verified and distilled. ``reachable``: only a token the student
    could produce (it occurs in its prompt or in its completion before the position, retrieved text
    included), and a pair whose completed teacher query contains a gold answer string is dropped
    before execution. ``any``: every proposal (the paper's form)."""
    hindsight: str = choice("group", ("group", "answer", "critique"))
    """What the teacher reads in its prompt. ``group`` (default): a summary of the other rollouts of
    the same question in the step (their queries and whether each succeeded), gold strings redacted;
    ``answer``: ``(The correct answer is: {A[0]}.)`` (the paper); ``critique``: the judge's critique
    of the failed rollout with gold strings redacted (the HindSearch judge, ``judge_kind``). Chosen
    by ``hindsearch probe --igsd``: the answer line's proposals are mostly answer tokens the student
    never saw, and only the group's gate separated the proposals that found evidence from those that
    did not with more than a few pairs (docs/methods.md)."""
    judge_kind: str = choice("lm", ("lm", "oracle"))
    """The judge of ``hindsight = critique``: ``lm`` (the frozen initial policy with HindSearch's
    judge prompt) or ``oracle`` (fictional world only)."""
    gate_sharpness: float = bounded(5.0, gt=0.0)
    """Gate sharpness (the paper's beta in sigmoid(beta * (delta - margin)))."""
    margin: float = 0.0
    """Gate margin on the paired gain delta: the gate is zero at and below it. With
    ``utility_state = shared`` identical documents give exactly 0, so 0 keeps them shut;
    ``hindsearch probe`` reports the gate's opening rate on identical-document and both-missed pairs
    to size it."""
    aggregation: str = choice("token-mean", AGG_MODES)
    """How ``L_igsd`` is reduced over the verified positions (``token-mean``: gated KL summed over
    positions divided by their number, the paper's form)."""
    max_answer_tokens: int = bounded(16, gt=0)
    """Answer tokens scored by the utility u(D); longer answers are cut (and counted)."""
    teacher: str = choice("frozen", TEACHERS)
    """Teacher weights for proposals and the pair distribution: ``frozen``, ``live`` or ``ema``."""
    ema_decay: float = bounded(0.99, ge=0.0, le=1.0)
    """EMA decay when ``teacher = ema`` (this term's own EMA of the policy)."""


_MEANS = ("cache_hit_rate", "mean_delta", "frac_delta_pos", "mean_gate")

METRICS = Metrics(
    # prepare: counts and seconds of a process's own rows add up, rates and means are averaged;
    # loss: averaged
    reductions={**{k: "mean" if k in _MEANS else "sum" for k in METRIC_KEYS},
                "L_igsd": "mean", "positions": "mean"},
    loss="L_igsd",
    panels={"IGSD gate statistics": tuple(sorted(k for k in METRIC_KEYS
                                                 if "gate" in k or "delta" in k))},
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
        self._judge: Any = None

    def prepare(self, trajectories: list[Trajectory], completion_len: int,
                ctx: AuxContext) -> AuxBatch:
        """Propose, verify and gate the teacher's query tokens of the failed rollouts
        (``run_igsd``): matched completions through ``ctx.complete``, retrieval through
        ``ctx.retriever`` with ``ctx.topk``."""
        tens, met, samples = run_igsd(trajectories, completion_len, ctx, self.cfg,
                                      rng=random.Random(self.seed * 1_000_003 + ctx.step),
                                      hints=self.hints(trajectories, ctx), corpus=self.corpus)
        return AuxBatch(tens, met, samples)

    def hints(self, trajectories: list[Trajectory], ctx: AuxContext) -> dict[int, str] | None:
        """The teacher's hint line per failed row for ``hindsight = critique | group``; None for the
        answer line. The critique's judge is HindSearch's (oracle, or the LM judge on the frozen
        initial policy)."""
        if self.cfg.hindsight == "answer":
            return None
        rows = [i for i, tr in enumerate(trajectories) if tr.failed]
        if self.cfg.hindsight == "critique" and self._judge is None:
            from hindsearch.hindsight.methods.hindsearch import HindSearchConfig, make_judge

            judge_cfg = HindSearchConfig(judge_kind=self.cfg.judge_kind)
            self._judge = make_judge(judge_cfg, ctx.frozen, ctx.tokenizer)
        return hint_lines(trajectories, rows, self.cfg.hindsight, self._judge)

    def positions(self, inputs: dict[str, torch.Tensor], completion_len: int) -> torch.Tensor:
        """The verified query positions of failed rollouts: ``igsd_mask > 0``."""
        return mask_positions(inputs["igsd_mask"], completion_len)

    def loss(self, logits: torch.Tensor, idx: torch.Tensor, completion_ids: torch.Tensor,
             inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_igsd`` from the student logits ``[N, V]`` at the positions ``idx [N, 2]``."""
        g = {k: at(v, idx) for k, v in inputs.items() if k.startswith("igsd_")}
        L = losses.igsd_pair_loss(logits, g["igsd_b"], g["igsd_a"], g["igsd_pT"], g["igsd_gate"],
                                  g["igsd_mask"], self.cfg.aggregation)
        return L, {"L_igsd": float(L.detach()), "positions": float(inputs["igsd_mask"].sum())}
