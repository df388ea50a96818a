"""The model-compute core: padding, the one stop rule, scoring and decoding against unpadded / transformers references."""

from __future__ import annotations

import pytest
import torch

from hindsearch import compute
from hindsearch.agent.backend import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def test_left_pad_and_positions():
    ids, mask = compute.left_pad([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert compute.positions(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_pad_id_fallbacks(tok, model):
    class T:
        pad_token_id, eos_token_id = None, 7

    assert compute.pad_id(T()) == 7
    assert compute.pad_id(tok) == (tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    assert compute.pad_id(None, None) == 0


def test_stop_rule_order_and_lead(tok):
    close = tok("</search>", add_special_tokens=False)["input_ids"]
    stop = compute.Stop(tok, {tok.eos_token_id}, ("</search>",))
    assert compute.stop_reason(stop, [], [5, tok.eos_token_id], 2) == "eos"  # EOS before the budget
    assert compute.stop_reason(stop, [], close, len(close)) == "stop"  # the stop string before the budget
    assert compute.stop_reason(stop, [], [5, 6], 2) == "length"
    assert compute.stop_reason(stop, [], [5], 2) is None
    # a stop string that starts in the context's last id counts
    assert compute.stop_reason(stop, close[:1], close[1:], 99) == ("stop" if len(close) > 1 else None)


def test_score_continuations_equal_unpadded(model):
    prefixes, conts = [[3, 4, 5, 6], [7], [8, 9]], [[10, 11], [12, 13, 14], []]
    lT, ids, lp = compute.score_continuations(model, prefixes, conts, topk=3, batch_size=2)
    assert lT.shape == (3, 3) and ids.shape == (3, 3, 3) and lp.shape == (3, 3, 3)
    for i, (p, c) in enumerate(zip(prefixes, conts)):
        if not c:
            assert lT[i].abs().sum() == 0
            continue
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c])).logits[0].float().log_softmax(-1)
        ref = torch.tensor([logits[len(p) - 1 + t, c[t]] for t in range(len(c))])
        assert torch.allclose(lT[i, : len(c)], ref, atol=1e-5)
        assert torch.allclose(lp[i, 0, 0], logits[len(p) - 1].max(), atol=1e-5)
    with pytest.raises(ValueError, match="empty prefix"):
        compute.score_continuations(model, [[]], [[1]])


def test_score_chunks_cap_logits_not_rows():
    assert compute.score_chunks([3, 1, 4, 1, 5], 2, None) == [range(0, 2), range(2, 4), range(4, 5)]  # rows only
    assert compute.score_chunks([3, 1, 4, 1, 5], 2, 10, budget=10**6) == [range(0, 2), range(2, 4), range(4, 5)]
    # budget 100, vocab 10: rows x (longest + 1) <= 10; a row over it alone still goes
    assert compute.score_chunks([3, 1, 4, 1, 12, 2], 4, 10, budget=100) == [
        range(0, 2), range(2, 4), range(4, 5), range(5, 6)]
    assert compute.score_chunks([], 4, 10, budget=100) == []


def test_score_continuations_same_under_a_logits_budget(model, monkeypatch):
    """A budget that splits every batch (16 GiB of Qwen2.5 logits ran an H200 out of memory) changes no number."""
    prefixes, conts = [[3, 4, 5, 6], [7], [8, 9], [5]], [[10, 11], [12, 13, 14], [], [9, 9, 9, 9]]
    full = compute.score_continuations(model, prefixes, conts, topk=3, batch_size=4)
    monkeypatch.setattr(compute, "SCORE_LOGITS_BUDGET", 4 * model.config.vocab_size)
    assert compute.score_chunks([len(c) for c in conts], 4, model.config.vocab_size) == [
        range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    split = compute.score_continuations(model, prefixes, conts, topk=3, batch_size=4)
    for i, c in enumerate(conts):  # within each continuation (past its end the top-k read padding)
        for a, b in zip(full, split):
            assert torch.allclose(a[i, : len(c)].float(), b[i, : len(c)].float(), atol=1e-5)
    assert (split[0][2] == 0).all() and (full[0][2] == 0).all()


def test_greedy_decode_equals_transformers_generate(tok, model):
    prefixes = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    stop = compute.Stop(tok, set())
    outs = compute.decode(model, prefixes, stop, SamplingParams(greedy=True), [6, 4, 0])
    assert [o.finish for o in outs] == ["length", "length", "length"] and outs[2].ids == []
    for p, o, n in zip(prefixes, outs[:2], [6, 4]):
        with torch.no_grad():
            ref = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert o.ids == ref[0, len(p):].tolist()
        assert len(o.logprobs) == n and all(lp <= 0 for lp in o.logprobs)


def test_decode_stops_each_row_on_its_own(tok, model):
    """A row whose first greedy id is made the EOS stops after one id, the other decodes to its budget."""
    prefixes = [[3, 4, 5], [6, 7]]
    first = compute.decode(model, prefixes, compute.Stop(tok, set()), SamplingParams(greedy=True), [1, 1])
    eos = {first[0].ids[0]} - {first[1].ids[0]}
    if not eos:
        pytest.skip("both rows start with the same id")
    outs = compute.decode(model, prefixes, compute.Stop(tok, eos), SamplingParams(greedy=True), [5, 5])
    assert outs[0].finish == "eos" and outs[0].ids == first[0].ids
    assert len(outs[1].ids) == 5 or outs[1].finish == "eos"


def test_repetition_penalty_hook():
    hook = compute.repetition_penalty([[1, 2]], 2.0)
    logits = torch.tensor([[1.0, -1.0, 4.0, 3.0]])
    out = hook([0], [[3]], logits.clone())
    assert out.tolist() == [[1.0, -2.0, 2.0, 1.5]]
    assert compute.repetition_penalty([[1]], 1.0) is None
