"""Teacher contexts and teacher-forced log-probs: token-by-token alignment with the student's completion."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.hindsight import teacher as T


def _unpadded(model, prefix, cont, k=0):
    ids = torch.tensor([prefix + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    rows = logp[len(prefix) - 1 : len(prefix) + len(cont) - 1]
    lt = rows.gather(-1, torch.tensor(cont)[:, None])[:, 0]
    return lt, rows.topk(k, -1) if k else None


def test_prompts_carry_the_hindsight_line(tok):
    fb = tok.decode(T.hindsearch_prompt_ids(tok, "Who wrote Xy", "search the author"))
    assert "Feedback on a previous attempt: search the author" in fb and "Question: Who wrote Xy?" in fb
    assert "<|im_start|>" in fb  # chat template applied
    gold = tok.decode(T.igsd_prompt_ids(tok, "Who wrote Xy", ["Ann Lee", "A. Lee"]))
    assert "(The correct answer is: Ann Lee.)" in gold
    plain = protocol.encode_prompt(tok, "Who wrote Xy", None)
    assert plain == list(tok(protocol.make_prompt(tok, "Who wrote Xy"), add_special_tokens=False)["input_ids"])
    with pytest.raises(ValueError, match="gold"):
        T.igsd_prompt_ids(tok, "q", [])


def test_alignment_matches_one_by_one_unpadded_forward(tok, model):
    prompts = [
        T.hindsearch_prompt_ids(tok, "Where was Edwin Marlow born", "search for Edwin Marlow's birthplace"),
        T.hindsearch_prompt_ids(tok, "Who", "a much longer critique that says what the searches should have looked for"),
        T.igsd_prompt_ids(tok, "Which river flows through the old capital of Vostria", ["Ember"]),
    ]
    comps = [
        tok("<think> ok </think>\n<search> Edwin Marlow </search>", add_special_tokens=False)["input_ids"],
        tok("<answer> no </answer>", add_special_tokens=False)["input_ids"],
        tok("<search> capital of Vostria river </search>\n\n<information>Doc 1(Title: V) a</information>", add_special_tokens=False)["input_ids"],
    ]
    assert len({len(p) for p in prompts}) >= 2  # prefixes of different lengths
    lT, ids, lp = T.teacher_token_logprobs(model, prompts, comps, topk=5, batch_size=2)
    assert lT.shape == (3, max(map(len, comps))) and ids.shape == lp.shape == (3, lT.shape[1], 5)
    for i in range(3):
        ref, (tv, ti) = _unpadded(model, prompts[i], comps[i], 5)
        n = len(comps[i])
        assert torch.allclose(lT[i, :n], ref, atol=1e-4), i
        assert torch.equal(ids[i, :n], ti) and torch.allclose(lp[i, :n], tv, atol=1e-4)
        assert torch.all(lT[i, n:] == 0)


def test_empty_and_errors(tok, model):
    lT, ids, lp = T.teacher_token_logprobs(model, [], [], topk=3)
    assert lT.shape == (0, 0) and ids.shape == (0, 0, 3)
    lT, _, _ = T.teacher_token_logprobs(model, [[1, 2]], [[]])
    assert lT.shape == (1, 0)
    with pytest.raises(ValueError, match="empty prefix"):
        T.teacher_token_logprobs(model, [[]], [[1]])


def test_select_teacher():
    ctx = SimpleNamespace(frozen="F", policy="P", emas={0.9: "E"})
    assert T.select_teacher("frozen", ctx) == "F" and T.select_teacher("live", ctx) == "P"
    assert T.select_teacher("ema", ctx, 0.9) == "E"
    with pytest.raises(ValueError, match=r"emas\[0.5\]"):
        T.select_teacher("ema", ctx, 0.5)
    with pytest.raises(ValueError, match="one of"):
        T.select_teacher("other", ctx)


def test_through_last_query_keeps_the_query_scores_exact(model):
    comp = [5, 6, 7, 8, 9, 10, 11, 12]
    qmask = [0, 1, 1, 0, 0, 1, 0, 0]
    assert T.through_last_query(comp, qmask, 8) == [5, 6, 7, 8, 9, 10]
    assert T.through_last_query(comp, qmask, 3) == [5, 6, 7]
    assert T.through_last_query(comp, [0] * 8, 8) == []
    prompt = [3, 4]
    full, _, _ = T.teacher_token_logprobs(model, [prompt], [comp])
    cut, _, _ = T.teacher_token_logprobs(model, [prompt], [T.through_last_query(comp, qmask, 8)])
    q = torch.tensor(qmask[:6]).bool()
    assert torch.allclose(full[0, :6][q], cut[0][q], atol=1e-5)
