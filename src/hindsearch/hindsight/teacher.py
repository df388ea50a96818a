"""Teacher contexts and teacher-forced log-probs of the student's completion.

The teacher sees the student's question with a hindsight line added to the user message
(``protocol.FEEDBACK_TEMPLATE`` with a critique for HindSearch, ``protocol.GOLD_HINDSIGHT_TEMPLATE``
with the first gold answer for IGSD), the chat template applied, followed by **exactly** the
student's completion ids. ``continuation_logprobs`` scores any batch of (prefix, continuation) id
lists in one padded forward: prefixes are left-padded so every continuation starts at the same
column, positions are computed from the attention mask, so row ``i``'s scores equal those of an
unpadded forward of ``prefix_i + continuation_i`` (tested). ``out[i, t]`` is the log-prob of
``continuation_i[t]`` given ``prefix_i + continuation_i[:t]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from hindsearch.agent import protocol
from hindsearch.hindsight import sync

TEACHERS = ("frozen", "live", "ema")


encode_prompt = protocol.encode_prompt  # the same prompt rule as the student's rollouts


def hindsearch_prompt_ids(tokenizer: Any, question: str, critique: str) -> list[int]:
    """HindSearch teacher prompt: the user message plus ``Feedback on a previous attempt: {critique}``."""
    return encode_prompt(tokenizer, question, protocol.FEEDBACK_TEMPLATE.format(critique=critique))


def igsd_prompt_ids(tokenizer: Any, question: str, golds: Sequence[str]) -> list[int]:
    """IGSD teacher prompt: the user message plus ``(The correct answer is: {golds[0]}.)``."""
    if not golds:
        raise ValueError(f"IGSD teacher needs a gold answer; question {question!r} has none")
    return encode_prompt(tokenizer, question, protocol.GOLD_HINDSIGHT_TEMPLATE.format(answer=golds[0]))


def select_teacher(kind: str, ctx: Any) -> Any:
    """``frozen`` → ``ctx.frozen``, ``live`` → ``ctx.policy``, ``ema`` → ``ctx.ema`` (must exist)."""
    if kind not in TEACHERS:
        raise ValueError(f"teacher = {kind!r} is not one of {TEACHERS}")
    model = {"frozen": ctx.frozen, "live": ctx.policy, "ema": ctx.ema}[kind]
    if model is None:
        raise ValueError(f"teacher = {kind!r} but the trainer provided no such model (AuxContext.{kind if kind != 'live' else 'policy'} is None)")
    return model


def through_last_query(completion_ids: Sequence[int], query_mask: Sequence[int], limit: int) -> list[int]:
    """``completion_ids[:min(limit, last query token + 1)]``: the part a teacher forward must see.

    Both distillation terms read teacher log-probs only at query tokens; a causal model's scores
    there do not depend on later tokens, so the final information block and the answer turn after
    the last query (often half the completion) need no forward. ``[]`` when there is no query token.
    """
    qm = list(query_mask[:limit])
    last = max((t for t, q in enumerate(qm) if q), default=-1)
    return list(completion_ids[: last + 1])


NEUTRAL_CRITIQUE = "none."
"""The neutral control's feedback text: the teacher prompt shape with no information in it."""

ACTION_TAGS = ("<search>", "<answer>")


def action_mask(traj: Any, tokenizer: Any) -> list[int]:
    """1 on the tokens where a turn after an information block chooses its action, else 0.

    For every turn that follows a search turn with an injected block: the turn's first content token
    (the first token after a leading ``<think>`` tag, else the first generated token: where a reasoning
    opener already commits to searching again or answering) and the tokens overlapping its first
    ``<search>`` or ``<answer>`` opening tag. Length = ``len(completion_ids)``.
    """
    n = len(traj.completion_ids)
    out = [0] * n
    turns = list(traj.turns)
    for prev, turn in zip(turns, turns[1:]):
        if prev.action != "search" or prev.inject_span[1] <= prev.inject_span[0]:
            continue
        s, e = turn.gen_span
        e = min(e, n)
        if e <= s:
            continue
        ids = traj.completion_ids[s:e]
        ends = [len(tokenizer.decode(ids[: j + 1])) for j in range(len(ids))]
        text = tokenizer.decode(ids)
        lead = len(text) - len(text.lstrip())
        if text[lead:].startswith("<think>"):
            lead += len("<think>")
            lead += len(text[lead:]) - len(text[lead:].lstrip())
        first = next((j for j, end in enumerate(ends) if end > lead), 0)
        out[s + first] = 1
        hits = [(text.find(tag), tag) for tag in ACTION_TAGS if tag in text]
        if not hits:
            continue
        c0, tag = min(hits)
        c1 = c0 + len(tag)
        prev_end = 0
        for j, end in enumerate(ends):
            if end > c0 and prev_end < c1:
                out[s + j] = 1
            prev_end = end
    return out


def distill_mask(traj: Any, tokenizer: Any, distill_on: str = "query") -> list[int]:
    """The tokens a hindsight term distils: ``query`` → ``query_mask``; ``action`` → ``query_mask`` OR ``action_mask``."""
    if distill_on == "query":
        return list(traj.query_mask)
    if distill_on == "action":
        return [int(bool(q) or bool(a)) for q, a in zip(traj.query_mask, action_mask(traj, tokenizer))]
    raise ValueError(f"distill_on = {distill_on!r} is not one of ('query', 'action')")


def _pad_id(model: Any) -> int:
    pid = getattr(model.config, "pad_token_id", None)
    if pid is None:
        pid = getattr(model.config, "eos_token_id", None)
        if isinstance(pid, list):
            pid = pid[0]
    return int(pid or 0)


def _logits_forward(model: Any, kw: dict[str, Any], keep: int) -> Any:
    """``model(**kw)`` keeping only the last ``keep`` positions' logits where the architecture allows it."""
    try:
        return model(**kw, logits_to_keep=keep)  # only the positions that predict the continuation
    except TypeError:  # architectures without logits_to_keep
        return model(**kw)


@torch.no_grad()
def continuation_logprobs(
    model: Any,
    prefix_ids_list: Sequence[Sequence[int]],
    cont_ids_list: Sequence[Sequence[int]],
    topk: int = 0,
    batch_size: int = 16,
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced log-probs of each continuation after its prefix, batched, no grad.

    Returns ``lT [B, T]`` (log-prob of ``cont[t]``; 0 beyond a row's length), ``topk_ids [B, T, k]``
    (long) and ``topk_logp [B, T, k]`` (the model's top-k log-probs at each continuation position;
    ``k = 0`` gives empty last dims). ``T`` = longest continuation. Every prefix must be non-empty.
    Runs in micro-batches of ``batch_size`` rows; logits are kept only for continuation positions.
    """
    B = len(prefix_ids_list)
    if B != len(cont_ids_list):
        raise ValueError(f"{B} prefixes but {len(cont_ids_list)} continuations")
    T = max((len(c) for c in cont_ids_list), default=0)
    lT = torch.zeros(B, T)
    ids_out = torch.zeros(B, T, topk, dtype=torch.long)
    lp_out = torch.zeros(B, T, topk)
    # multi-process: every rank runs as many forwards as the busiest one (hindsight.sync)
    with sync.lockstep(lambda: sync.pad_forward(model, _pad_id(model))()):
        if B == 0 or T == 0:
            return lT, ids_out, lp_out
        device = next(model.parameters()).device
        pad = _pad_id(model)
        for s in range(0, B, batch_size):
            rows = range(s, min(s + batch_size, B))
            P = max(len(prefix_ids_list[i]) for i in rows)
            Tb = max(len(cont_ids_list[i]) for i in rows)
            if Tb == 0:
                continue
            ids = torch.full((len(rows), P + Tb), pad, dtype=torch.long)
            att = torch.zeros(len(rows), P + Tb, dtype=torch.long)
            for j, i in enumerate(rows):
                p, c = list(prefix_ids_list[i]), list(cont_ids_list[i])
                if not p:
                    raise ValueError(f"row {i}: empty prefix (a continuation needs at least one context token)")
                ids[j, P - len(p) : P + len(c)] = torch.tensor(p + c, dtype=torch.long)
                att[j, P - len(p) : P + len(c)] = 1
            pos = (att.cumsum(-1) - 1).clamp(min=0)
            kw = dict(input_ids=ids.to(device), attention_mask=att.to(device), position_ids=pos.to(device))
            out = sync.forward(_logits_forward, model, kw, Tb + 1)
            logits = out.logits[:, -(Tb + 1) : -1].float()  # [b, Tb, V]: column P-1+t predicts cont[t]
            lse = torch.logsumexp(logits, dim=-1)  # [b, Tb]; no full log-softmax copy of [b, Tb, V]
            tgt = ids[:, P:].to(device)
            got = logits.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) - lse
            cmask = att[:, P:].to(device).bool()
            lT[s : s + len(rows), :Tb] = torch.where(cmask, got, torch.zeros_like(got)).cpu()
            if topk > 0:
                if topk > logits.shape[-1]:
                    raise ValueError(f"topk = {topk} exceeds the vocabulary size {logits.shape[-1]}")
                v, k_ids = logits.topk(topk, dim=-1)
                ids_out[s : s + len(rows), :Tb] = k_ids.cpu()
                lp_out[s : s + len(rows), :Tb] = (v - lse.unsqueeze(-1)).cpu()
        return lT, ids_out, lp_out


def teacher_token_logprobs(
    model: Any,
    teacher_prompt_ids_list: Sequence[Sequence[int]],
    completion_ids_list: Sequence[Sequence[int]],
    topk: int = 0,
    batch_size: int = 16,
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher log-probs of the student's completion tokens: ``(lT [B, T], topk_ids [B, T, k], topk_logp [B, T, k])``.

    Row ``i``, column ``t`` scores ``completion_ids_list[i][t]`` after ``teacher_prompt_ids_list[i] +
    completion[:t]`` — the same token the student's row has at ``t``, whatever the prompt lengths.
    """
    return continuation_logprobs(model, teacher_prompt_ids_list, completion_ids_list, topk, batch_size)
