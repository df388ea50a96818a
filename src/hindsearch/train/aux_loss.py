"""The trainer's side of the hindsight terms, as pure functions: tensor keys of the terms' inputs,
the LM head applied only at the positions the terms need, each term's share of the update, the
checks of what a term returns and the non-finite-loss error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

AUX_PREFIX = "aux:"


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN/inf; raised before backward so the weights are still the last
    good ones."""


class TermError(ValueError):
    """A term (a method's, often a plugin's) returned something the trainer cannot use; the message
    names it."""


def term_label(term: Any) -> str:
    """A term as messages name it: its method name, class and file."""
    import inspect

    try:
        where = f" in {inspect.getsourcefile(type(term))}"
    except TypeError:
        where = ""
    return f"term {getattr(term, 'name', '?')!r} ({type(term).__qualname__}{where})"


def checked_positions(term: Any, positions: Any, shape: tuple[int, int]) -> torch.Tensor:
    """A term's ``positions(...)`` answer: a bool tensor of ``shape`` ``[B, C]``, else a
    ``TermError`` naming it."""
    if not isinstance(positions, torch.Tensor):
        raise TermError(f"{term_label(term)}: positions() returned {type(positions).__name__}, "
                        f"expected a bool tensor of shape [B, C] = {list(shape)}")
    if tuple(positions.shape) != tuple(shape) or positions.dtype != torch.bool:
        raise TermError(f"{term_label(term)}: positions() returned a {positions.dtype} tensor of "
                        f"shape {list(positions.shape)}, expected torch.bool of shape [B, C] = "
                        f"{list(shape)}")
    return positions


def checked_loss(term: Any, answer: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """A term's ``loss(...)`` answer: ``(scalar tensor, metrics dict)``, else a ``TermError`` naming
    the term."""
    if not (isinstance(answer, tuple) and len(answer) == 2):
        raise TermError(f"{term_label(term)}: loss() returned {type(answer).__name__}, expected "
                        "(loss, metrics)")
    loss, metrics = answer
    if not isinstance(loss, torch.Tensor):
        raise TermError(f"{term_label(term)}: loss() returned a {type(loss).__name__} loss "
                        f"({loss!r:.40}), expected a scalar torch tensor computed from the logits "
                        "(a number carries no gradient)")
    if loss.dim() != 0:
        raise TermError(f"{term_label(term)}: loss() returned a loss of shape {list(loss.shape)}, "
                        "expected a scalar (reduce it over its positions: "
                        "hindsearch.hindsight.losses.agg)")
    if not isinstance(metrics, dict):
        raise TermError(f"{term_label(term)}: loss() returned metrics of type "
                        f"{type(metrics).__name__}, expected a dict")
    return loss, metrics


def aux_key(term: str, key: str) -> str:
    """Inputs-dict key of a term tensor: ``aux:<term>:<key>``."""
    return f"{AUX_PREFIX}{term}:{key}"


def term_inputs(inputs: dict[str, Any], term: str) -> dict[str, torch.Tensor]:
    """The tensors a term returned from ``prepare`` (keys as it named them), sliced like
    ``inputs``."""
    pre = f"{AUX_PREFIX}{term}:"
    return {k[len(pre) :]: v for k, v in inputs.items() if k.startswith(pre)}


def selected_logits(hidden: torch.Tensor, lm_head: torch.nn.Module, completion_len: int,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at the selected completion positions only: ``(logits [N, V], idx [N, 2])``.

    ``positions``: bool ``[B, C]`` (the union of what the terms distil); ``idx`` holds its ``(row,
    t)`` pairs in row-major order and ``logits[n]`` predicts ``completion_ids[idx[n, 0], idx[n,
    1]]``. The head runs on the ``N`` gathered hidden states, so memory is ``N * V`` in the model's
    dtype instead of ``B * C * V``.
    """
    idx = positions.nonzero()  # [N, 2]
    h = hidden[:, -completion_len - 1 : -1, :]
    return lm_head(h[idx[:, 0], idx[:, 1]]), idx


def update_shares(grpo_loss: torch.Tensor, weighted: Sequence[tuple[str, torch.Tensor]],
                  hidden: Sequence[torch.Tensor]) -> dict[str, float]:
    """Each term's share of the update: ``|d(lam L_k)/dh| / |d L_GRPO/dh|`` at the last hidden
    states ``h``.

    ``hidden``: the backbone outputs ``[B, P + C, H]`` of the forward both losses were computed from
    (TRL 1.16's fused LM head never builds the GRPO logits, so the last common node is the hidden
    state, not the logits). Only the head and the losses are differentiated (``retain_graph``), not
    the backbone. Nothing is returned when GRPO's gradient is 0 (every group with equal rewards).
    """
    hs = [h for h in hidden if h.requires_grad]
    if not hs or not grpo_loss.requires_grad:
        return {}

    def gnorm(x: torch.Tensor) -> float:
        if not x.requires_grad:
            return 0.0
        gs = torch.autograd.grad(x, hs, retain_graph=True, allow_unused=True)
        return float(torch.sqrt(sum((g.float().pow(2).sum() for g in gs if g is not None),
                                    torch.tensor(0.0))))

    # Every norm first, then the division: an early return on one rank's zero GRPO gradient would
    # make ranks run different numbers of backwards through a sharded LM head (ZeRO-3 / FSDP) and
    # hang.
    base = gnorm(grpo_loss)
    norms = {name: gnorm(x) for name, x in weighted}
    return {name: v / base for name, v in norms.items()} if base > 0.0 else {}
