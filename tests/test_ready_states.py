"""HindSearch without the one-hop cost, the candidate built here: at a failed decision whose retrieved text already
holds the gold string, the teacher reads "answer now from them" instead of the rollout's critique
(``hindsearch.ready_states = answer_now``), and that turn's second query is not distilled."""

from __future__ import annotations

import pytest
import torch

from hindsearch.hindsight import teacher as T
from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight.methods.hindsearch import HindSearchConfig, HindSearchTerm
from hindsearch.models import tiny_random_model
from hindsearch.answers import normalize_answer

from test_trainer import tok, world  # noqa: F401  (fixtures; tests dir on sys.path)
from test_transfer import _demos


def _gold_before(d, tok, s):
    names = [normalize_answer(g) for g in d.golden_answers]
    seen = f" {normalize_answer(tok.decode(list(d.completion_ids[:s])))} "
    return any(n and f" {n} " in seen for n in names)


def test_ready_mask_marks_the_decisions_after_the_gold_was_retrieved(world, tok):
    from hindsearch.agent import protocol

    ready_turns = other_turns = 0
    for d in _demos(world, tok, n=12):
        r = T.ready_decision_mask(d, tok, d.golden_answers)
        dec = protocol.decision_mask(d, tok)
        for s, e in protocol.post_information_turns(d, len(d.completion_ids)):
            if _gold_before(d, tok, s):
                assert r[s:e] == dec[s:e] and any(r[s:e])
                ready_turns += 1
            else:
                assert not any(r[s:e])
                other_turns += 1
        assert not any(x and q for x, q in zip(r, d.query_mask))
    assert ready_turns and other_turns  # the demos hold both kinds of state
    d = _demos(world, tok, n=1)[0]
    assert not any(T.ready_decision_mask(d, tok, ["", "  "]))  # no usable gold: nothing is ready


@pytest.mark.parametrize("topk,ready_states", [(0, "answer_now"), (8, "answer_now"), (8, "answer_line")])
def test_answer_now_teacher_at_ready_decisions(world, tok, topk, ready_states):
    """The term's teacher log-probs at ready decisions are those of the READY_CRITIQUE prompt (``answer_now``) or
    of the answer line (``answer_line``), elsewhere the critique's; the ready turns' query tokens leave the mask;
    ``critique`` (the default) changes nothing."""
    demos = [d for d in _demos(world, tok, n=12) if any(T.ready_decision_mask(d, tok, d.golden_answers))][:3]
    for d in demos:
        d.reward, d.em = 0.0, 0.0  # failed: the term acts on failed rollouts only
    model = tiny_random_model(tok, seed=3)
    Tn = max(len(d.completion_ids) for d in demos)
    ctx = AuxContext(policy=model, frozen=model, tokenizer=tok, retriever=None)
    div = "reverse_kl" if topk else "clamped_sampled"
    base = dict(judge_kind="oracle", distill_on="decision_query", divergence=div, topk=max(topk, 1))
    plain = HindSearchTerm(HindSearchConfig(**base)).prepare(demos, Tn, ctx)
    now = HindSearchTerm(HindSearchConfig(**base, ready_states=ready_states)).prepare(demos, Tn, ctx)
    assert "ready_decisions" not in plain.metrics and now.metrics["ready_decisions"] > 0
    for i, d in enumerate(demos):
        n = len(d.completion_ids)
        r = T.ready_decision_mask(d, tok, d.golden_answers)
        spans = T.ready_turn_spans(d, r)
        comp = T.through_last_query(d.completion_ids, [int(x > 0) for x in now.tensors["hind_mask"][i, :n]], Tn)
        prompt = (T.igsd_prompt_ids(tok, d.question, d.golden_answers) if ready_states == "answer_line"
                  else T.hindsearch_prompt_ids(tok, d.question, T.READY_CRITIQUE))
        want, _, _ = T.teacher_token_logprobs(model, [prompt], [comp])
        on = [t for t in range(len(comp)) if r[t]]
        assert on
        assert torch.allclose(now.tensors["hind_lT"][i, on], want[0, on], atol=1e-5)
        assert not torch.allclose(plain.tensors["hind_lT"][i, on], want[0, on], atol=1e-3)
        for s, e in spans:  # the ready turn's second query is not distilled; its decision is
            assert all(now.tensors["hind_mask"][i, t] == 0 for t in range(s, e) if d.query_mask[t])
            assert any(now.tensors["hind_mask"][i, t] > 0 for t in range(s, e))
        off = [t for t in range(len(comp)) if not r[t] and now.tensors["hind_mask"][i, t] > 0]
        assert torch.equal(now.tensors["hind_lT"][i, off], plain.tensors["hind_lT"][i, off])
