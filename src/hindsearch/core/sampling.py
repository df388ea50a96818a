"""Sampling and the stop rule of the decode loop: what picks the next id of a row and what ends the
row.

``SamplingParams`` (greedy, or temperature + top-p) and ``sample_tokens`` pick one id per row; its
log-prob is ``log softmax(logits / T)`` before top-p filtering, what a trainer recomputes from the
same logits. ``GenOutput`` is what a row generated. THE stop rule (``stop_reason``): an EOS id, a
stop string in the row's last ``STOP_WINDOW`` ids, or the row's budget. Also ``stop_token_ids`` and
``repetition_penalty`` (transformers' penalty as a logits hook). The exact rule: docs/protocol.md,
"The model core".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

LogitsHook = Callable[[list[int], list[list[int]], Tensor], Tensor]
"""``hook(rows, new_ids, logits[B, V]) -> logits``: ``rows[j]`` is the caller's index of batch row
``j`` and ``new_ids[j]`` what that row generated so far in its current segment."""

STOP_WINDOW = 16
"""Ids decoded when looking for a stop string (the context's last id and the newest ids); a stop
string of n characters spans at most n ids, and ours (``</search>``, ``</answer>``) have 9."""


DRAWS = ("multinomial", "inverse_cdf")
"""How a sampled id is drawn from a row's probabilities: ``multinomial`` (``torch.multinomial``: one
random number per vocabulary entry, the default and the random stream every seeded result so far was
made with) or ``inverse_cdf`` (one uniform number per row against the cumulative probabilities: the
same distribution, another random stream, several times less work at a real vocabulary;
``draw_inverse_cdf``)."""


@dataclass
class SamplingParams:
    """Explicit sampling parameters; greedy when ``greedy`` or ``temperature == 0``; ``draw`` one of
    ``DRAWS``."""

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    draw: str = "multinomial"

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


GREEDY = SamplingParams(greedy=True)


@dataclass
class GenOutput:
    """One segment a row generated: new ids, their sampling log-probs, why it stopped."""

    ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" (stop string), "eos", "length"


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Mask (to -inf) tokens outside the nucleus of mass ``top_p``. logits: [B, V] -> [B, V]."""
    if top_p >= 1.0:
        return logits
    sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    remove = probs.cumsum(-1) - probs > top_p  # keep the token that crosses top_p
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)


def sample_tokens(logits: Tensor, sampling: SamplingParams,
                  generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Pick next tokens and their log-probs. logits: [B, V] float -> (tokens [B], logprobs [B])."""
    if sampling.is_greedy:
        logp = logits.log_softmax(-1)
        tok = logits.argmax(-1)
    else:
        scaled = logits / sampling.temperature
        logp = scaled.log_softmax(-1)
        probs = top_p_filter(scaled, sampling.top_p).softmax(-1)
        if sampling.draw == "inverse_cdf":
            tok = draw_inverse_cdf(probs, generator)
        elif sampling.draw == "multinomial":
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        else:
            raise ValueError(f"sampling draw {sampling.draw!r}: choose one of {', '.join(DRAWS)}")
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def draw_inverse_cdf(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One id per row of ``probs [B, V]`` (rows summing to ~1, zeros allowed) from one uniform
    number per row: the first id whose cumulative probability (float64) passes ``u * total``. An id
    of probability 0 is never drawn. -> ``[B]`` int64."""
    cdf = probs.to(torch.float64).cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device,
                   dtype=torch.float64)
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    return tok.clamp_(max=probs.shape[-1] - 1)


def read_back(tok: Tensor, logp: Tensor) -> tuple[list[int], list[float]]:
    """A step's sampled ids and log-probs as Python lists, in one device-to-host read (one
    ``tolist``): per-row reads would each wait for the device. Ids travel as float64, exact for any
    vocabulary below 2^53."""
    both = torch.stack((tok.to(torch.float64), logp.to(torch.float64))).tolist()
    return [int(x) for x in both[0]], both[1]


def stop_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """EOS ids that end a row: the tokenizer's EOS and the model's
    ``generation_config.eos_token_id``(s)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gc = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gc if isinstance(gc, list) else [gc] if gc is not None else [])
    return ids


@dataclass
class Stop:
    """When a decoded row stops: an id in ``eos_ids``, a string of ``strings`` in its decoded tail,
    its budget."""

    tokenizer: Any
    eos_ids: set[int]
    strings: Sequence[str] = ()


def stop_reason(stop: Stop, lead: Sequence[int], ids: Sequence[int], budget: int) -> str | None:
    """THE stop rule (module docstring) for a row with new ``ids`` after a context ending in
    ``lead`` (its last id, or nothing): ``eos`` / ``stop`` / ``length``, or None to go on."""
    if ids and ids[-1] in stop.eos_ids:
        return "eos"
    if stop.strings:
        tail = (list(lead[-1:]) + list(ids))[-STOP_WINDOW:]
        text = stop.tokenizer.decode(tail, skip_special_tokens=False)
        if any(s in text for s in stop.strings):
            return "stop"
    return "length" if len(ids) >= budget else None


def repetition_penalty(contexts: Sequence[Sequence[int]],
                       penalty: float | None) -> LogitsHook | None:
    """transformers' repetition penalty as a logits hook (None when ``penalty`` is 1 or unset): the
    logit of every id already in the row (its context and new ids; never the padding) is divided by
    ``penalty`` (multiplied when negative). ``logits [B, V]`` -> ``[B, V]``; ``rows`` index
    ``contexts``."""
    if not penalty or penalty == 1.0:
        return None

    def hook(rows: list[int], new_ids: list[list[int]], logits: Tensor) -> Tensor:
        for j, i in enumerate(rows):
            seen = torch.tensor(sorted(set(contexts[i]) | set(new_ids[j])), dtype=torch.long,
                                device=logits.device)
            v = logits[j, seen]
            logits[j, seen] = torch.where(v < 0, v * penalty, v / penalty)
        return logits

    return hook
