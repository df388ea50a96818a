"""Teacher prompts, the teacher a term reads (``select_teacher``), the positions a term distils
(``distill_weights``, ``ready_decision_mask``) and teacher-forced log-probs of the student's
completion: row ``i``, column ``t`` of ``teacher_token_logprobs`` scores ``completion_i[t]`` after
``teacher_prompt_i + completion_i[:t]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from hindsearch.agent import protocol
from hindsearch.config.fields import DISTILL_ON, TEACHERS
from hindsearch.core.scoring import score_continuations


def hindsearch_prompt_ids(tokenizer: Any, question: str, critique: str) -> list[int]:
    """HindSearch teacher prompt: the user message plus ``Feedback on a previous attempt:
    {critique}``."""
    return protocol.encode_prompt(tokenizer, question,
                                  protocol.FEEDBACK_TEMPLATE.format(critique=critique))


def igsd_prompt_ids(tokenizer: Any, question: str, golds: Sequence[str]) -> list[int]:
    """IGSD teacher prompt: the user message plus ``(The correct answer is: {golds[0]}.)``."""
    if not golds:
        raise ValueError(f"IGSD teacher needs a gold answer; question {question!r} has none")
    return protocol.encode_prompt(tokenizer, question,
                                  protocol.GOLD_HINDSIGHT_TEMPLATE.format(answer=golds[0]))


def select_teacher(kind: str, ctx: Any, ema_decay: float | None = None) -> Any:
    """``frozen`` → ``ctx.frozen``, ``live`` → ``ctx.policy``, ``ema`` → ``ctx.emas[ema_decay]``
    (must exist)."""
    if kind not in TEACHERS:
        raise ValueError(f"teacher = {kind!r} is not one of {TEACHERS}")
    model = (ctx.emas.get(ema_decay) if kind == "ema"
             else {"frozen": ctx.frozen, "live": ctx.policy}[kind])
    if model is None:
        what = {"frozen": "frozen", "live": "policy", "ema": f"emas[{ema_decay}]"}[kind]
        raise ValueError(f"teacher = {kind!r} but the trainer provided no such model "
                         f"(AuxContext.{what} is None)")
    return model


def through_last_query(completion_ids: Sequence[int],
                       query_mask: Sequence[int], limit: int) -> list[int]:
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


def later_query_mask(traj: Any) -> list[int]:
    """``query_mask`` restricted to the turns after an information block (the second query
    onwards)."""
    n = len(traj.completion_ids)
    out = [0] * n
    for s, e in protocol.post_information_turns(traj, n):
        out[s:e] = [int(bool(q)) for q in traj.query_mask[s:e]]
    return out


def distill_weights(traj: Any, tokenizer: Any, distill_on: str = "query",
                    action_weight: float = 1.0) -> list[float]:
    """Per-token weights of a hindsight term's loss (0 = not distilled), length
    ``len(completion_ids)``.

    ``query``: 1 on ``query_mask``. ``action``: ``query_mask`` plus ``action_mask`` (the first token
    and the tag of each post-information turn). ``decision``: ``decision_mask`` alone (the whole
    decision, no query token). ``decision_query``: ``decision_mask`` plus the query tokens of the
    post-information turns (the second query, where a critique like "first find B" must also act).
    ``answer_decision``: ``decision_mask`` of the turns that answered (the failed decision to answer
    now; with ``divergence = one_sided`` the term can then only lower answering where the teacher
    would search again). Decision/action tokens weigh ``action_weight``, query tokens 1, so that
    query tokens where teacher and student agree cannot dilute the decision under a mean.
    """
    if distill_on == "query":
        return [float(bool(q)) for q in traj.query_mask]
    if distill_on == "action":
        act, query = protocol.action_mask(traj, tokenizer), traj.query_mask
    elif distill_on == "decision":
        act, query = protocol.decision_mask(traj, tokenizer), [0] * len(traj.completion_ids)
    elif distill_on == "decision_query":
        act, query = protocol.decision_mask(traj, tokenizer), later_query_mask(traj)
    elif distill_on == "answer_decision":
        act, query = protocol.decision_mask(traj, tokenizer, ("answer",)), [0] * len(
            traj.completion_ids)
    else:
        raise ValueError(f"distill_on = {distill_on!r} is not one of {DISTILL_ON}")
    return [float(action_weight) if a and not q else float(bool(q)) for q, a in zip(query, act)]



READY_CRITIQUE = ("The retrieved passages already contain the answer; read them again and answer "
                  "from them.")
"""What the teacher reads at a failed decision whose retrieved text already holds a gold string
(``hindsearch.ready_states = answer_now``): the oracle judge's wording for evidence that was
retrieved."""


def ready_decision_mask(traj: Any, tokenizer: Any, golds: Sequence[str]) -> list[int]:
    """1 on the decision tokens (``protocol.decision_mask``) of each post-information turn whose
    preceding completion (the retrieved text included) already contains a gold answer string
    (``answers.answer_in_text``), else 0; length ``len(completion_ids)``. At such a state searching
    again can only cost the answer."""
    from hindsearch.answers import answer_in_text

    n = len(traj.completion_ids)
    out = [0] * n
    dec = protocol.decision_mask(traj, tokenizer)
    for s, e in protocol.post_information_turns(traj, n):
        if answer_in_text(golds, tokenizer.decode(list(traj.completion_ids[:s]))):
            out[s:e] = dec[s:e]
    return out


def ready_turn_spans(traj: Any, ready: Sequence[int]) -> list[tuple[int, int]]:
    """The post-information turn spans that hold a ready decision (``ready_decision_mask``)."""
    n = len(traj.completion_ids)
    return [(s, e) for s, e in protocol.post_information_turns(traj, n) if any(ready[s:e])]


def teacher_token_logprobs(
    model: Any,
    teacher_prompt_ids_list: Sequence[Sequence[int]],
    completion_ids_list: Sequence[Sequence[int]],
    topk: int = 0,
    batch_size: int = 16,
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher log-probs of the student's completion tokens: ``(lT [B, T], topk_ids [B, T, k],
    topk_logp [B, T, k])``.

    Row ``i``, column ``t`` scores ``completion_ids_list[i][t]`` after ``teacher_prompt_ids_list[i]
    + completion[:t]`` — the same token the student's row has at ``t``, whatever the prompt lengths.
    """
    return score_continuations(model, teacher_prompt_ids_list, completion_ids_list,
                               topk, batch_size)
