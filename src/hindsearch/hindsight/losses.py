"""Pure loss functions of the hindsight terms (HindSearch, IGSD): per-token losses ``[B, T]`` (or
``[N]``), their reductions (``agg``), the divergence, gate and aggregation registries, and IGSD's
gated pair KL. Nothing here touches a model; every function is NaN-free on empty masks. The formulas
and how they relate to TRL's self-distillation code are in docs/methods.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from hindsearch.config import fields

AGG_MODES = fields.AGG_MODES
"""Reductions of a per-token loss (declared once, the terms' ``aggregation`` field's choices)."""
GATES = fields.GATES
"""IGSD gates (declared once, ``igsd.gate``'s choices)."""


# -------------------------------------------------------------------------------------- aggregation
Aggregation = Callable[[Tensor, Tensor], Tensor]
"""``(masked_loss [B, T], mask [B, T] as loss dtype) -> scalar``; masked-out entries are already
0."""
Units = Callable[[Tensor], float]
"""``mask [B, T] -> the number of units a reduction divides by`` (tokens, or rows with a token)."""
AGGREGATIONS: dict[str, Aggregation] = {}
AGG_UNITS: dict[str, Units | None] = {}
"""Per reduction, what it averages over (None: it does not average, ``sum``)."""


def register_aggregation(name: str, units: Units | None) -> Callable[[Aggregation], Aggregation]:
    """Decorator: make ``fn`` the reduction called ``name`` (a value of the terms' ``aggregation``
    field); ``units(mask)`` counts what it averages over (``None`` for a plain sum)."""
    def add(fn: Aggregation) -> Aggregation:
        AGGREGATIONS[name] = fn
        AGG_UNITS[name] = units
        return fn
    return add


def _tokens(mask: Tensor) -> float:
    # the number of tokens of a 0/1 mask, the weight of a weighted one
    return float(mask.float().clamp(min=0.0).sum())


def _rows(mask: Tensor) -> float:
    return float(((mask > 0).sum(-1) > 0).sum())


def micro_batch_weight(mask_micro: Tensor, mask_all: Tensor, mode: str) -> float:
    """Weight of a micro-batch's reduced loss so that the micro-batches of one optimizer step add up
    to the reduction over the whole generation batch: ``units(micro) / units(all)`` (0 when the
    batch has none), 1 for ``sum``. ``mask_micro [b, T]`` (the micro-batch's rows), ``mask_all [B,
    T]`` (every row of the step).

    Without it each micro-batch's mean counts equally, so a term whose positions sit in a few
    rollouts (failed ones) is diluted by the micro-batches that have none: its effective weight
    would change with ``train.micro_batch_size``."""
    units = AGG_UNITS[mode]
    if units is None:
        return 1.0
    total = units(mask_all)
    return units(mask_micro) / total if total > 0 else 0.0


@register_aggregation("token-mean", _tokens)
def _token_mean(masked: Tensor, m: Tensor) -> Tensor:
    return masked.sum() / m.sum().clamp(min=1.0)


@register_aggregation("sum", None)
def _sum(masked: Tensor, m: Tensor) -> Tensor:
    return masked.sum()


def _seq_mean(row: Tensor, m: Tensor) -> Tensor:
    has = (m.sum(-1) > 0).to(row.dtype)
    return (row * has).sum() / has.sum().clamp(min=1.0)


@register_aggregation("seq-mean-token-mean", _rows)
def _seq_mean_token_mean(masked: Tensor, m: Tensor) -> Tensor:
    return _seq_mean(masked.sum(-1) / m.sum(-1).clamp(min=1.0), m)


@register_aggregation("seq-mean-token-sum", _rows)
def _seq_mean_token_sum(masked: Tensor, m: Tensor) -> Tensor:
    return _seq_mean(masked.sum(-1), m)


def agg(loss: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss ``[B, T]`` under a 0/1 ``mask [B, T]`` to a scalar.

    ``token-mean``: sum / number of masked tokens; ``seq-mean-token-mean``: mean over rows that
    have a masked token of each row's token mean; ``seq-mean-token-sum``: same with row sums;
    ``sum``: plain masked sum. Empty masks give an exact 0 that keeps ``loss``'s graph.

    A mask with values other than 0 and 1 is a per-token weight ``w >= 0``: every reduction becomes
    its weighted form (``token-mean`` = ``sum(w * loss) / sum(w)``, ...). On a 0/1 mask ``loss * w``
    is ``loss`` exactly, so the result is bit-identical to the unweighted reduction.
    """
    fn = AGGREGATIONS.get(mode)
    if fn is None:
        raise ValueError(f"agg mode {mode!r} is not one of {', '.join(AGGREGATIONS)}")
    w = mask.to(loss.dtype)
    return fn(torch.where(mask > 0, loss * w, torch.zeros_like(loss)), w)


def token_logprobs(logits: Tensor, ids: Tensor) -> Tensor:
    """Log-prob of ``ids [B, T]`` under ``logits [B, T, V]`` → ``[B, T]`` (no full log-softmax
    kept)."""
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return picked.float() - torch.logsumexp(logits.float(), dim=-1)


def clamped_sampled_weight(lT: Tensor, lS: Tensor) -> Tensor:
    """``w = clamp(lT - lS, 0, 1)``, detached; ``lT``, ``lS``: ``[B, T]`` → ``[B, T]``."""
    return (lT.detach() - lS.detach()).clamp(0.0, 1.0)


def signed_advantage(lT: Tensor, lS: Tensor, clip: float = 1.0) -> Tensor:
    """``a = clamp(lT - lS, -clip, clip)``, detached; ``lT``, ``lS``: ``[B, T]`` → ``[B, T]``."""
    return (lT.detach() - lS.detach()).clamp(-clip, clip)


def topk_divergence_per_token(student_logits: Tensor, teacher_topk_ids: Tensor,
                              teacher_topk_logp: Tensor, alpha: float) -> Tensor:
    """TRL's ``compute_divergence`` (``alpha = 1``: ``KL(p_S || p_T)``, ``0.5``: JSD) over the
    teacher's top-k ids plus TRL's tail bucket (``add_tail_bucket``: the mass outside the k ids), in
    float32.

    ``student_logits [..., V]``, ``teacher_topk_ids [..., k]`` (long), ``teacher_topk_logp [...,
    k]`` (the teacher's full-vocabulary log-probs of those ids) → ``[...]``. The student's log-probs
    come from its full softmax, so the tail bucket carries the gradient of every id outside the
    teacher's top-k.
    """
    import warnings

    # trl.experimental's import notice (the two helpers are pinned by tests)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental.sdpo.loss_utils import add_tail_bucket, compute_divergence

    lg = student_logits.float()
    s = lg.gather(-1, teacher_topk_ids) - torch.logsumexp(lg, dim=-1, keepdim=True)
    return compute_divergence(add_tail_bucket(s), add_tail_bucket(teacher_topk_logp.float()), alpha)


# -------------------------------------------------------------------------------------- divergences
@dataclass
class DistillInputs:
    """What a HindSearch divergence sees at ``N`` selected positions."""

    lS: Tensor
    """``[N]`` student log-prob of the sampled token (with grad)."""
    lT: Tensor
    """``[N]`` teacher log-prob of the same token (constant)."""
    logits: Tensor
    """``[N, V]`` student logits (with grad)."""
    topk_ids: Tensor | None = None
    """``[N, K]`` teacher top-k token ids (only for divergences registered with ``needs_topk``)."""
    topk_logp: Tensor | None = None
    """``[N, K]`` teacher log-probs of those ids."""
    signed_clip: float = 1.0
    """Clip of the ``signed`` advantage."""


@dataclass(frozen=True)
class Divergence:
    """A registered per-token distillation loss ``fn(DistillInputs) -> [N]``."""

    fn: Callable[[DistillInputs], Tensor]
    needs_topk: bool = False
    """True when it reads the teacher's top-k ids and log-probs (the term then prepares them)."""


DIVERGENCES: dict[str, Divergence] = {}


def register_divergence(name: str, needs_topk: bool = False
                        ) -> Callable[[Callable[[DistillInputs], Tensor]], Callable]:
    """Decorator: make ``fn`` the divergence called ``name`` (a value of
    ``hindsearch.divergence``)."""
    def add(fn: Callable[[DistillInputs], Tensor]) -> Callable[[DistillInputs], Tensor]:
        DIVERGENCES[name] = Divergence(fn, needs_topk)
        return fn
    return add


def divergence(name: str) -> Divergence:
    """The registered divergence ``name`` (clear error naming the registered ones)."""
    if name not in DIVERGENCES:
        raise ValueError(f"divergence {name!r} is not one of {', '.join(DIVERGENCES)}")
    return DIVERGENCES[name]


@register_divergence("clamped_sampled")
def _clamped_sampled(x: DistillInputs) -> Tensor:
    return -clamped_sampled_weight(x.lT, x.lS) * x.lS


@register_divergence("signed")
def _signed(x: DistillInputs) -> Tensor:
    return -signed_advantage(x.lT, x.lS, x.signed_clip) * x.lS


@register_divergence("one_sided")
def _one_sided(x: DistillInputs) -> Tensor:
    """The lowering half of ``signed``: ``-clamp(lT - lS, -c, 0) * lS``. It lowers a failed
    rollout's token where the teacher gives it less probability than the student, and never raises a
    token, so on a failed rollout it always has the sign of GRPO's own gradient there. It is
    one-sided per token, not per decision: a failed "answer now" is no longer raised where the
    student searches more than the teacher (as ``reverse_kl`` does), but a failed "search again" is
    still lowered there, so on every distilled position it still pulls towards the teacher from
    above. ``distill_on = answer_decision`` keeps only the decisions to answer: then it can only
    lower "answer now" where the teacher would search again."""
    return -signed_advantage(x.lT, x.lS, x.signed_clip).clamp(max=0.0) * x.lS


@register_divergence("reverse_kl", needs_topk=True)
def _reverse_kl(x: DistillInputs) -> Tensor:
    return topk_divergence_per_token(x.logits, x.topk_ids, x.topk_logp, 1.0)


@register_divergence("jsd", needs_topk=True)
def _jsd(x: DistillInputs) -> Tensor:
    return topk_divergence_per_token(x.logits, x.topk_ids, x.topk_logp, 0.5)


def gap_diagnostics(lT: Tensor, lS: Tensor, mask: Tensor, eps: float = 1e-4) -> dict[str, float]:
    """Teacher-minus-student statistics on the masked tokens; ``lT``, ``lS``, ``mask``: ``[B, T]``.

    Both log-probs must come from the same temperature (the trainer passes the live temperature-1
    student scores, never the rollout's sampling log-probs). Returns ``mean_lT_minus_lS``,
    ``frac_w_pos`` (share of tokens with ``lT - lS > eps``: a clamped weight that is not numerical
    noise), ``mean_w`` (mean clamped weight) and ``tokens``; all 0 on an empty mask.
    """
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"mean_lT_minus_lS": 0.0, "frac_w_pos": 0.0, "mean_w": 0.0, "tokens": 0.0}
    d = (lT.detach().float() - lS.detach().float())[m]
    return {"mean_lT_minus_lS": float(d.mean()), "frac_w_pos": float((d > eps).float().mean()),
            "mean_w": float(d.clamp(0.0, 1.0).mean()), "tokens": float(n)}


def pair_probs(logit_a: Tensor, logit_b: Tensor) -> Tensor:
    """Softmax over a pair of logits (or log-probs): ``[N]``, ``[N]`` → ``[N, 2]`` (column 0 =
    a)."""
    return torch.softmax(torch.stack([logit_a.float(), logit_b.float()], dim=-1), dim=-1)


def pair_kl(p_T: Tensor, student_pair_logits: Tensor) -> Tensor:
    """``KL(p_T || p_S)`` per position, ``p_S = softmax(student_pair_logits)``; ``[N, 2]``, ``[N,
    2]`` → ``[N]``.

    ``p_T`` is treated as a constant (detached); a zero entry of ``p_T`` contributes 0.
    """
    p_T = p_T.detach().float()
    log_ps = F.log_softmax(student_pair_logits.float(), dim=-1)
    return (torch.xlogy(p_T, p_T) - p_T * log_ps).sum(-1)


# ---------------------------------------------------------------------------------------- gates
GateFn = Callable[[Tensor, float, float], Tensor]
"""``(delta [N] float, sharpness, margin) -> gate [N]``."""
GATE_FNS: dict[str, GateFn] = {}


def register_gate(name: str) -> Callable[[GateFn], GateFn]:
    """Decorator: make ``fn`` the IGSD gate called ``name`` (a value of ``igsd.gate``)."""
    def add(fn: GateFn) -> GateFn:
        GATE_FNS[name] = fn
        return fn
    return add


@register_gate("positive_tanh")
def _positive_tanh(d: Tensor, sharpness: float, margin: float) -> Tensor:
    """``2 sigmoid(beta (delta - margin)) - 1`` above the margin, 0 at and below it: continuous,
    zero at the margin."""
    above = (d > margin).float()
    return (2.0 * torch.sigmoid(sharpness * (d - margin)) - 1.0).clamp(min=0.0) * above


@register_gate("positive_sigmoid")
def _positive_sigmoid(d: Tensor, sharpness: float, margin: float) -> Tensor:
    return torch.sigmoid(sharpness * (d - margin)) * (d > margin).float()


@register_gate("sigmoid")
def _sigmoid(d: Tensor, sharpness: float, margin: float) -> Tensor:
    return torch.sigmoid(sharpness * (d - margin))


@register_gate("hard")
def _hard(d: Tensor, sharpness: float, margin: float) -> Tensor:
    return (d > margin).float()


@register_gate("none")
def _ungated(d: Tensor, sharpness: float, margin: float) -> Tensor:
    return torch.ones_like(d)


def gate(delta: Tensor, kind: str = "positive_sigmoid", beta: float = 5.0,
         margin: float = 0.0) -> Tensor:
    """IGSD gate on the paired gain ``delta [N]`` → ``[N]``, always detached; ``beta`` is the
    sharpness.

    ``positive_tanh``: ``2 sigmoid(beta (delta - margin)) - 1`` above the margin, else 0 (zero at
    the margin); ``positive_sigmoid``: ``sigmoid(beta (delta - margin)) * [delta > margin]`` (jumps
    to 0.5 just above the margin); ``sigmoid``: no indicator; ``hard``: ``[delta > margin]``;
    ``none``: 1 everywhere (ungated pair distillation).
    """
    fn = GATE_FNS.get(kind)
    if fn is None:
        raise ValueError(f"gate {kind!r} is not one of {', '.join(GATE_FNS)}")
    return fn(delta.detach().float(), beta, margin)


def igsd_loss(gates: Tensor, kl: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """``agg(g * KL, mask, mode)``, by default ``sum(g * KL * mask) / max(sum(mask), 1)``; any
    matching shapes (``[N]`` or ``[B, T]``) → scalar.

    ``mask`` marks the verified positions (the denominator counts them whether or not their gate is
    0).
    """
    return agg(gates.detach() * kl, mask, mode)


def igsd_pair_loss(logits: Tensor, b: Tensor, a: Tensor, p_T: Tensor, gates: Tensor, mask: Tensor,
                   mode: str = "token-mean") -> Tensor:
    """``L_igsd`` from live student logits ``[..., V]`` and the prepared pair tensors at the same
    positions.

    ``b``, ``a`` ``[...]``: the student's and the teacher's token ids of each verified pair; ``p_T
    [..., 2]`` the teacher's pair distribution over ``(b, a)``; ``gates``, ``mask`` ``[...]``. Exact
    0 when no position is verified.
    """
    pair_ids = torch.stack([b, a], dim=-1).to(logits.device).long()  # [..., 2]
    sp = logits.gather(-1, pair_ids)  # [..., 2] student pair logits (b, a)
    kl = pair_kl(p_T.to(logits.device).reshape(-1, 2), sp.reshape(-1, 2)).view(sp.shape[:-1])
    return igsd_loss(gates.to(logits.device), kl, mask.to(logits.device), mode)
