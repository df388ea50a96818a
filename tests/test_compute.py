"""The model core: padding, the one stop rule, scoring and the decode loop against unpadded / transformers references."""

from __future__ import annotations

import pytest
import torch

from hindsearch.core.decode import decode, decode_shared
from hindsearch.core.model import left_pad, pad_id, positions
from hindsearch.core.sampling import GREEDY, SamplingParams, Stop, repetition_penalty, stop_reason
from hindsearch.core import scoring
from hindsearch.core.scoring import score_chunks, score_continuations

pytestmark = pytest.mark.usefixtures("one_thread")


def test_left_pad_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions(mask).tolist() == [[0, 1, 2], [0, 0, 0]]
    # with right parts (a prefix and its continuation): every right part starts at column 3, right-padded
    ids, mask = left_pad([[5, 6, 7], [8], []], pad=0, right=[[1], [2, 3], [4]])
    assert ids.tolist() == [[5, 6, 7, 1, 0], [0, 0, 8, 2, 3], [0, 0, 0, 4, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 1, 0]]


def test_pad_id_fallbacks(tok, model):
    class T:
        pad_token_id, eos_token_id = None, 7

    assert pad_id(T()) == 7
    assert pad_id(tok) == (tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    assert pad_id(None, None) == 0


def test_stop_rule_order_and_lead(tok):
    close = tok("</search>", add_special_tokens=False)["input_ids"]
    stop = Stop(tok, {tok.eos_token_id}, ("</search>",))
    assert stop_reason(stop, [], [5, tok.eos_token_id], 2) == "eos"  # EOS before the budget
    assert stop_reason(stop, [], close, len(close)) == "stop"  # the stop string before the budget
    assert stop_reason(stop, [], [5, 6], 2) == "length"
    assert stop_reason(stop, [], [5], 2) is None
    # a stop string that starts in the context's last id counts
    assert stop_reason(stop, close[:1], close[1:], 99) == ("stop" if len(close) > 1 else None)


def test_score_continuations_equal_unpadded(model):
    prefixes, conts = [[3, 4, 5, 6], [7], [8, 9]], [[10, 11], [12, 13, 14], []]
    lT, ids, lp = score_continuations(model, prefixes, conts, topk=3, batch_size=2)
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
        score_continuations(model, [[]], [[1]])


def test_score_chunks_cap_logits_not_rows():
    assert score_chunks([3, 1, 4, 1, 5], 2, None) == [range(0, 2), range(2, 4), range(4, 5)]  # rows only
    assert score_chunks([3, 1, 4, 1, 5], 2, 10, budget=10**6) == [range(0, 2), range(2, 4), range(4, 5)]
    # budget 100, vocab 10: rows x (longest + 1) <= 10; a row over it alone still goes
    assert score_chunks([3, 1, 4, 1, 12, 2], 4, 10, budget=100) == [
        range(0, 2), range(2, 4), range(4, 5), range(5, 6)]
    assert score_chunks([], 4, 10, budget=100) == []


def test_score_continuations_same_under_a_logits_budget(model, monkeypatch):
    """A budget that splits every batch (16 GiB of Qwen2.5 logits ran an H200 out of memory) changes no number."""
    prefixes, conts = [[3, 4, 5, 6], [7], [8, 9], [5]], [[10, 11], [12, 13, 14], [], [9, 9, 9, 9]]
    full = score_continuations(model, prefixes, conts, topk=3, batch_size=4)
    monkeypatch.setattr(scoring, "SCORE_LOGITS_BUDGET", 4 * model.config.vocab_size)
    assert score_chunks([len(c) for c in conts], 4, model.config.vocab_size) == [
        range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    split = score_continuations(model, prefixes, conts, topk=3, batch_size=4)
    for i, c in enumerate(conts):  # within each continuation (past its end the top-k read padding)
        for a, b in zip(full, split):
            assert torch.allclose(a[i, : len(c)].float(), b[i, : len(c)].float(), atol=1e-5)
    assert (split[0][2] == 0).all() and (full[0][2] == 0).all()


def test_greedy_decode_equals_transformers_generate(tok, model):
    prefixes = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    stop = Stop(tok, set())
    outs = decode(model, prefixes, stop, SamplingParams(greedy=True), [6, 4, 0])
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
    first = decode(model, prefixes, Stop(tok, set()), SamplingParams(greedy=True), [1, 1])
    eos = {first[0].ids[0]} - {first[1].ids[0]}
    if not eos:
        pytest.skip("both rows start with the same id")
    outs = decode(model, prefixes, Stop(tok, eos), SamplingParams(greedy=True), [5, 5])
    assert outs[0].finish == "eos" and outs[0].ids == first[0].ids
    assert len(outs[1].ids) == 5 or outs[1].finish == "eos"


def test_repetition_penalty_hook():
    hook = repetition_penalty([[1, 2]], 2.0)
    logits = torch.tensor([[1.0, -1.0, 4.0, 3.0]])
    out = hook([0], [[3]], logits.clone())
    assert out.tolist() == [[1.0, -2.0, 2.0, 1.5]]
    assert repetition_penalty([[1]], 1.0) is None


def test_decode_on_stop_queues_an_observation_and_the_row_goes_on(tok, model):
    """A row that stops is called back with every row that stopped at the same step; the ids it gets queued are
    fed on top of its saved keys/values and it decodes on: its ids equal a fresh decode of the whole context."""
    prefixes = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    obs = {0: [20, 21, 22], 2: [30]}
    calls, segs = [], {}

    def on_stop(rows, outs):
        calls.append(list(rows))
        res = []
        for i, o in zip(rows, outs):
            segs.setdefault(i, []).append(list(o.ids))
            res.append((obs.pop(i), 3) if i in obs else None)
        return res

    budgets = [2, 4, 3]
    outs = decode(model, prefixes, Stop(tok, set()), GREEDY, budgets, on_stop=on_stop)
    assert calls[0] == [0] and sorted(i for c in calls for i in c) == [0, 0, 1, 2, 2]
    first = decode(model, prefixes, Stop(tok, set()), GREEDY, budgets)
    assert [s[0] for _, s in sorted(segs.items())] == [o.ids for o in first]
    for i, more in ((0, [20, 21, 22]), (2, [30])):
        ref = decode(model, [prefixes[i] + segs[i][0] + more], Stop(tok, set()), GREEDY, [3])[0]
        assert segs[i][1] == outs[i].ids == ref.ids
        assert torch.allclose(torch.tensor(outs[i].logprobs), torch.tensor(ref.logprobs), atol=1e-5)


def test_decode_max_rows_and_shared_prefixes_change_nothing(tok, model):
    prefixes = [[3, 4, 5, 6, 7], [3, 4, 5, 9], [10, 11, 12], [3, 4, 5, 6, 7]]
    stop = Stop(tok, set())
    ref = decode(model, prefixes, stop, GREEDY, [4] * 4)
    assert [o.ids for o in decode(model, prefixes, stop, GREEDY, [4] * 4, max_rows=1)] == [o.ids for o in ref]
    shared = decode_shared(model, prefixes, stop, GREEDY, 4, groups=[0, 0, 1, 0], batch_size=1)
    assert [o.ids for o in shared] == [o.ids for o in ref] and shared[0] is shared[3]  # identical rows once
