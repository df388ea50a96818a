"""Rollout engine: exact ids and masks on scripted rollouts of a tiny random model, budgets, failures."""

from __future__ import annotations

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.agent.engine import RolloutEngine
from hindsearch.core import decode as core_decode
from hindsearch.core.sampling import SamplingParams, sample_tokens, top_p_filter
from hindsearch.config import RolloutConfig
from hindsearch.config import ModelConfig
from hindsearch.models import load_policy
from hindsearch.records import Passage, QARecord, make_contents
from hindsearch.retrieval.factory import build_index, load_index

PASSAGES = [
    Passage("d0", make_contents("Zorbin Quell", "Zorbin Quell was born in Maravel in 1821.")),
    Passage("d1", make_contents("Maravel", "Maravel is a harbour town on the river Tesh.")),
    Passage("d2", make_contents("Tesh", "The Tesh flows into the Amber Sea.")),
    Passage("d3", make_contents("Ilda Vorn", "Ilda Vorn wrote the novel Glass Orchard.")),
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(PASSAGES, d, kind="bm25", show_progress=False)
    return load_index(d)


class ScriptHook:
    """Force the model to write ``scripts[traj][turn]`` (token ids of the text, tokenized alone), then EOS."""

    def __init__(self, tok, scripts: list[list[str]]):
        self.ids = [[tok(t, add_special_tokens=False)["input_ids"] for t in s] for s in scripts]
        self.eos = tok.eos_token_id

    def __call__(self, rows, new_ids, logits):
        out = torch.full_like(logits, float("-inf"))
        for j, ((traj, turn, _qid), ids) in enumerate(zip(rows, new_ids)):
            script = self.ids[traj][turn] if turn < len(self.ids[traj]) else []
            out[j, script[len(ids)] if len(ids) < len(script) else self.eos] = 0.0
        return out


def make_engine(model, tok, retriever, scripts=None, **cfg):
    hook = ScriptHook(tok, scripts) if scripts else None
    kw = dict(max_turns=3, max_new_tokens_per_turn=32, max_total_tokens=1024, temperature=1.0)
    kw.update(cfg)
    return RolloutEngine(model, tok, retriever, RolloutConfig(**kw), topk=2, retries=1, retry_wait_s=0.0, logits_hook=hook)


def spans_of(mask, value=0):
    """Maximal runs of ``value`` in a 0/1 mask as half-open spans."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [1 - value]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            out.append((start, i))
            start = None
    return out


Q1 = QARecord("q1", "Where was Zorbin Quell born", ["Maravel"])
Q2 = QARecord("q2", "Who wrote Glass Orchard", ["Ilda Vorn"])
SCRIPTS = [
    ["<think>I need to look.</think>\n<search> Zorbin Quell birthplace </search>", "<answer> Maravel </answer>"],
    ["<search> Glass Orchard author </search>", "hmm no tags here, " * 20, "<search>Ilda Vorn</search>", "<answer> the Ilda Vorn. </answer>"],
]


def test_scripted_rollout_exact_ids_and_masks(model, tok, retriever):
    eng = make_engine(model, tok, retriever, SCRIPTS)
    trajs = eng.rollout([Q1, Q2], num_generations=1, seed=0)
    assert [t.qid for t in trajs] == ["q1", "q2"]
    for t, script in zip(trajs, SCRIPTS):
        n = len(t.completion_ids)
        assert len(t.gen_mask) == len(t.query_mask) == len(t.logprobs) == n
        # generated spans are exactly the scripted ids (never re-tokenised)
        gen_spans = [t.completion_ids[a:b] for a, b in spans_of(t.gen_mask, 1)]
        # (the tag-less turn runs into max_new_tokens_per_turn = 32: an invalid turn)
        assert gen_spans == [tok(s, add_special_tokens=False)["input_ids"][:32] for s in script]
        assert [tuple(tr.gen_span) for tr in t.turns] == spans_of(t.gen_mask, 1)
        # gen_mask = 0 spans decode exactly to the injected blocks, in order
        injected = [tok.decode(t.completion_ids[a:b]) for a, b in spans_of(t.gen_mask, 0)]
        expected = []
        for tr in t.turns:
            if tr.action == "search":
                docs = eng.retriever.retrieve([tr.content], 2)[0]
                assert tr.doc_ids == [p.id for p in docs]
                expected.append(protocol.information_block(docs))
            elif tr.action == "invalid":
                expected.append(protocol.INVALID_NOTICE)
        assert injected == expected
        assert [tuple(tr.inject_span) for tr in t.turns if tr.inject_span != (0, 0)] == spans_of(t.gen_mask, 0)
        # query_mask decodes to exactly the queries
        q_spans = spans_of(t.query_mask, 1)
        assert [tok.decode(t.completion_ids[a:b]).strip() for a, b in q_spans] == t.queries
        assert [tuple(tr.query_span) for tr in t.turns if tr.action == "search"] == q_spans
        # forced tokens have log-prob 0 (all mass on them); injected tokens 0.0 too
        assert all(abs(lp) < 1e-5 for lp in t.logprobs)
        assert t.stop_reason == "answer"
    assert trajs[0].queries == ["Zorbin Quell birthplace"]
    assert trajs[0].answer == "Maravel" and trajs[0].em == 1.0 and trajs[0].reward == 1.0
    assert [tr.action for tr in trajs[1].turns] == ["search", "invalid", "search", "answer"]
    assert trajs[1].answer == "the Ilda Vorn." and trajs[1].em == 1.0
    assert trajs[0].turns[0].doc_titles[0] == "Zorbin Quell"


def test_max_turns_final_search_not_executed(model, tok, retriever):
    scripts = [["<search> a </search>", "<search> b </search>", "<search> c </search>"]]
    eng = make_engine(model, tok, retriever, scripts, max_turns=2)
    (t,) = eng.rollout([Q1])
    assert [tr.action for tr in t.turns] == ["search", "search", "search"]
    assert t.stop_reason == "max_turns"
    assert t.turns[-1].doc_ids == [] and t.turns[-1].inject_span == (0, 0)
    assert t.gen_mask[-1] == 1  # nothing injected after the unexecuted search
    assert t.answer is None and t.reward == 0.0


def test_eos_and_empty_answer(model, tok, retriever):
    scripts = [["I do not know."], ["<answer>  </answer>"], ["no tags " * 20, "I give up."]]
    t_eos, t_empty, t_notice = make_engine(model, tok, retriever, scripts).rollout([Q1, Q2, Q1])
    assert t_eos.stop_reason == "eos" and t_eos.completion_ids[-1] == tok.eos_token_id and t_eos.answer is None
    assert t_empty.stop_reason == "answer" and t_empty.answer == "" and t_empty.em == 0.0
    # the injected notice holds "<answer> and </answer>": never taken as the model's answer
    assert [tr.action for tr in t_notice.turns] == ["invalid", "invalid"] and t_notice.stop_reason == "eos"
    assert "<answer> and </answer>" in t_notice.completion_text and t_notice.answer is None


def test_budget_truncation(model, tok, retriever):
    prompt_len = len(make_engine(model, tok, retriever).prompt_ids(Q1.question))
    # room for the search turn and part of the information block only
    script = [["<search> Zorbin Quell </search>", "<answer> Maravel </answer>"]]
    n_search = len(tok(script[0][0], add_special_tokens=False)["input_ids"])
    eng = make_engine(model, tok, retriever, script, max_total_tokens=prompt_len + n_search + 5)
    (t,) = eng.rollout([Q1])
    assert t.stop_reason == "length"
    assert len(t.prompt_ids) + len(t.completion_ids) == prompt_len + n_search + 5
    assert t.gen_mask == [1] * n_search + [0] * 5
    # a turn cut by the total budget is 'truncated'
    eng = make_engine(model, tok, retriever, [["<think> a very long thought that never ends and goes on"]],
                      max_total_tokens=prompt_len + 4)
    (t,) = eng.rollout([Q1])
    assert t.stop_reason == "length" and t.turns[-1].action == "truncated" and len(t.completion_ids) == 4
    # a prompt over budget is an error, not a crash
    eng = make_engine(model, tok, retriever, max_total_tokens=10)
    (t,) = eng.rollout([Q1])
    assert t.stop_reason == "error" and t.errors and t.completion_ids == []


class FlakyRetriever:
    """Delegates to a real retriever but raises ConnectionError for the first ``fail`` calls."""

    def __init__(self, inner, fail):
        self.inner, self.fail, self.calls = inner, fail, 0

    def retrieve(self, queries, k):
        self.calls += 1
        if self.calls <= self.fail:
            raise ConnectionError("retrieval server down")
        return self.inner.retrieve(queries, k)


def test_retriever_failure_recorded_not_raised(model, tok, retriever):
    # per row: one batched call per decode step at which search turns end (the rows' turns end at other steps),
    # and one retry each
    flaky = FlakyRetriever(retriever, fail=10)
    eng = make_engine(model, tok, flaky, SCRIPTS)
    t1, t2 = eng.rollout([Q1, Q2])
    assert flaky.calls == 2 * sum(len(t.queries) for t in (t1, t2)) and eng.stats["retrieve_calls"] == flaky.calls
    for t in (t1, t2):
        assert t.errors and "ConnectionError" in t.errors[0]
        assert t.stop_reason == "answer"
        assert t.turns[0].error and t.turns[0].doc_ids == []
        a, b = t.turns[0].inject_span
        assert tok.decode(t.completion_ids[a:b]) == protocol.information_block([])
    # a transient failure is retried and succeeds
    flaky = FlakyRetriever(retriever, fail=1)
    eng = make_engine(model, tok, flaky, SCRIPTS)
    t1, _ = eng.rollout([Q1, Q2])
    assert not t1.errors and t1.turns[0].doc_ids


def test_sampling_seeded_batched_logprobs(model, tok, retriever):
    eng = make_engine(model, tok, retriever, max_new_tokens_per_turn=12, max_turns=1)
    a = eng.rollout([Q1, Q2], num_generations=3, seed=7)
    b = eng.rollout([Q1, Q2], num_generations=3, seed=7)
    assert [t.completion_ids for t in a] == [t.completion_ids for t in b]
    assert [t.qid for t in a] == ["q1"] * 3 + ["q2"] * 3
    assert len({tuple(t.completion_ids) for t in a}) > 1
    # recorded log-probs equal a fresh teacher-forced forward at temperature 1 (left padding is exact)
    t = a[0]
    n = t.turns[0].gen_span[1]
    ids = torch.tensor([t.prompt_ids + t.completion_ids[:n]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(t.prompt_ids) - 1 : -1].float()
    ref = logits.log_softmax(-1).gather(-1, ids[0, len(t.prompt_ids):, None]).squeeze(-1)
    assert torch.allclose(ref, torch.tensor(t.logprobs[:n]), atol=1e-4)
    # greedy rollouts of a batch equal one-at-a-time rollouts
    g_batch = eng.rollout([Q1, Q2], greedy=True)
    g_single = [eng.rollout([q], greedy=True)[0] for q in (Q1, Q2)]
    assert [t.completion_ids for t in g_batch] == [t.completion_ids for t in g_single]


class FirstTurnScript(ScriptHook):
    """Force turn 0 of trajectory i to ``scripts[i][0]`` (no EOS after it); later turns sample freely."""

    def __call__(self, rows, new_ids, logits):
        logits = logits.clone()
        for j, ((traj, turn, _qid), ids) in enumerate(zip(rows, new_ids)):
            script = self.ids[traj % len(self.ids)][0] if turn == 0 else []
            if len(ids) < len(script):
                logits[j] = float("-inf")
                logits[j, script[len(ids)]] = 0.0
        return logits


def test_cross_turn_kv_cache_matches_full_forward(model, tok, retriever):
    # rows stop at different steps (queries of different lengths, one free invalid turn) so later turns
    # resume from caches of different lengths with information blocks / notices of different lengths
    scripts = [["<search> Zorbin </search>"], ["<search> Glass Orchard author of the novel </search>"], ["no tags"]]
    eng = make_engine(model, tok, retriever, max_new_tokens_per_turn=10, max_turns=2)
    eng.logits_hook = FirstTurnScript(tok, scripts)
    trajs = eng.rollout([Q1, Q2, Q1], num_generations=1, seed=3)
    assert eng.backend.stats["prefill_tokens"] < sum(  # earlier turns were not re-read
        len(t.prompt_ids) + len(t.completion_ids) for t in trajs)
    for t in trajs:
        assert len(t.turns) == 3 and {tr.action for tr in t.turns[1:]} <= {"invalid", "truncated"}
        # every log-prob of the free (sampled) turns equals a teacher-forced forward of the whole sequence
        ids = torch.tensor([t.prompt_ids + t.completion_ids])
        with torch.no_grad():
            logp = model(ids).logits[0, :-1].float().log_softmax(-1)
        for tr in t.turns[1:]:
            a, b = tr.gen_span
            P = len(t.prompt_ids)
            ref = logp[P + a - 1 : P + b - 1].gather(-1, ids[0, P + a : P + b, None]).squeeze(-1)
            assert torch.allclose(ref, torch.tensor(t.logprobs[a:b]), atol=1e-4)


def test_sampling_helpers():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    f = top_p_filter(logits, 0.7)
    assert torch.isfinite(f).tolist() == [[True, True, False, False]]
    tok_, lp = sample_tokens(logits, SamplingParams(greedy=True), None)
    assert tok_.tolist() == [0] and torch.allclose(lp, logits.log_softmax(-1)[:, 0])
    g = torch.Generator().manual_seed(0)
    toks = [int(sample_tokens(logits, SamplingParams(temperature=1.0, top_p=0.7), g)[0]) for _ in range(50)]
    assert set(toks) <= {0, 1} and len(set(toks)) == 2


def test_complete_queries(model, tok):
    """THE query completer (``Backend.complete_queries``): greedy to ``</search>``, an EOS or the budget; batched,
    one at a time and with a shared prefix (``groups``) give the same ids."""
    from hindsearch.agent.hf_backend import HFBackend

    be = HFBackend(model, tok)
    base = protocol.encode_prompt(tok, Q1.question) + tok("<search> Zorbin", add_special_tokens=False)["input_ids"]
    prefixes = [base, base[:-1], base]
    res = be.complete_queries(prefixes, 5)
    assert len(res) == 3
    for pre, o in zip(prefixes, res):
        assert 0 < len(o.ids) <= 5 and len(o.logprobs) == len(o.ids)
        closed = "</search>" in tok.decode(pre[-1:] + o.ids)
        assert o.finish == ("eos" if o.ids[-1] in be.eos_ids else "stop" if closed else "length")
        assert o.finish != "length" or len(o.ids) == 5
    assert be.complete_queries([base], 5)[0].ids == res[0].ids
    grouped = be.complete_queries(prefixes, 5, groups=[0, 0, 0], batch_size=1)
    assert [o.ids for o in grouped] == [o.ids for o in res] and grouped[0] is grouped[2]  # identical rows once


def test_load_policy_tiny_and_errors():
    model, tok = load_policy(ModelConfig(name="tiny-random", device="cpu"))
    assert tok.padding_side == "left" and tok.pad_token_id is not None and tok.chat_template
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64 and not model.training
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    with pytest.raises(FileNotFoundError, match="not an alias"):
        load_policy(ModelConfig(name="./no/such/model-dir", device="cpu"))
    with pytest.raises(ValueError, match="model.dtype"):
        load_policy(ModelConfig(name="tiny-random", dtype="int3"))


def test_per_row_scheduling_greedy_equals_turn_synchronous(model, tok, retriever, monkeypatch):
    """Rows whose turns end at different steps (scripted first turns of different lengths, then free greedy
    turns) rejoin decoding on their own; every greedy trajectory equals the decode loop's turn-synchronous
    schedule (a cache it cannot merge: rows wait for an empty batch and re-read their whole context)."""
    scripts = [["<search> Zorbin </search>"], ["<search> Glass Orchard author of the novel </search>"], ["no tags"],
               ["<answer> Maravel </answer>"]]
    recs = [Q1, Q2, Q1, Q2, Q1]
    res = {}
    for per_row in (True, False):
        if not per_row:
            monkeypatch.setattr(core_decode, "mergeable", lambda cache: False)
        eng = make_engine(model, tok, retriever, max_new_tokens_per_turn=12, max_turns=3, max_total_tokens=400)
        eng.logits_hook = FirstTurnScript(tok, scripts)
        res[per_row] = (eng.rollout(recs, num_generations=2, greedy=True), eng.backend.stats)
    got, ref = res[True][0], res[False][0]
    # both schedules ran: per row, earlier turns are never re-read
    assert res[True][1]["kv_save_s"] > 0 and res[False][1]["kv_save_s"] == 0
    assert res[True][1]["prefill_tokens"] < res[False][1]["prefill_tokens"]
    assert len({len(t.turns) for t in ref}) > 1  # rows really end at different turns
    for a, b in zip(got, ref):
        assert a.completion_ids == b.completion_ids and a.gen_mask == b.gen_mask and a.query_mask == b.query_mask
        assert [(x.action, x.gen_span, x.inject_span, x.doc_ids) for x in a.turns] == \
               [(x.action, x.gen_span, x.inject_span, x.doc_ids) for x in b.turns]
        assert a.stop_reason == b.stop_reason and a.answer == b.answer
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    # sampled per-row rollouts are reproducible from the seed
    eng = make_engine(model, tok, retriever, max_new_tokens_per_turn=12, max_turns=3)
    one, two = eng.rollout(recs, num_generations=2, seed=5), eng.rollout(recs, num_generations=2, seed=5)
    assert [t.completion_ids for t in one] == [t.completion_ids for t in two]


def test_a_decode_step_reads_the_device_once(model, tok, monkeypatch):
    """The sampled ids and log-probs of a step come back in one ``tolist``, never one read per row (on a GPU each
    read waits for the device): at batch 8, one host read per sampled step, one in the prefill, one at the end."""
    reads = {"n": 0}
    for name in ("tolist", "item", "__int__", "__float__", "__index__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            reads["n"] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    contexts = [[5 + i, 6, 7] for i in range(8)]
    stats: dict[str, float] = {}
    core_decode.decode(model, contexts, core_decode.Stop(tok, set()), SamplingParams(temperature=1.0), [6] * 8,
                       generator=torch.Generator().manual_seed(0), stats=stats, pad=tok.pad_token_id)
    monkeypatch.undo()
    assert stats["decode_steps"] == 5 and reads["n"] <= stats["decode_steps"] + 3, reads  # + the prefill count, the stats


def test_inverse_cdf_draws_the_same_distribution_once_per_row():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0]).repeat(40_000, 1)
    g = torch.Generator().manual_seed(0)
    from hindsearch.core.sampling import draw_inverse_cdf

    tok_ = draw_inverse_cdf(probs, g)
    freq = torch.bincount(tok_, minlength=5).float() / len(tok_)
    assert freq[1] == 0 and freq[4] == 0 and torch.allclose(freq, probs[0], atol=0.01)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert draw_inverse_cdf(probs[:7], g1).tolist() == draw_inverse_cdf(probs[:7], g2).tolist()
    assert g1.get_state().equal(g2.get_state())  # one uniform per row: 7 draws consumed
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4, 1)
    sp = SamplingParams(temperature=1.0, top_p=0.7, draw="inverse_cdf")
    toks = sample_tokens(logits, sp, torch.Generator().manual_seed(0))[0].tolist()
    assert set(toks) <= {0, 1}
    with pytest.raises(ValueError, match="sampling draw 'gumbel'"):
        sample_tokens(logits, SamplingParams(draw="gumbel"), None)


def test_rollout_sampler_option_reaches_the_decode(model, tok, retriever):
    """``rollout.sampler = inverse_cdf``: seeded and reproducible, another stream than multinomial, greedy unchanged."""
    base = make_engine(model, tok, retriever, max_new_tokens_per_turn=12, max_turns=1)
    inv = make_engine(model, tok, retriever, max_new_tokens_per_turn=12, max_turns=1, sampler="inverse_cdf")
    assert inv.sampling(False).draw == "inverse_cdf" and base.sampling(False).draw == "multinomial"
    a, b = (inv.rollout([Q1, Q2], num_generations=2, seed=7) for _ in range(2))
    m = base.rollout([Q1, Q2], num_generations=2, seed=7)
    assert [t.completion_ids for t in a] == [t.completion_ids for t in b]
    assert [t.completion_ids for t in a] != [t.completion_ids for t in m]
    assert ([t.completion_ids for t in inv.rollout([Q1, Q2], greedy=True)]
            == [t.completion_ids for t in base.rollout([Q1, Q2], greedy=True)])
