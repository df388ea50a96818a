"""Judge prompts, redaction, degenerate critiques, LM/oracle judges and the HindSearch term end to end
(real tiny models; gradient only on query tokens of failed rollouts; fallbacks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.config import Config
from hindsearch.core.model import pad_id
from hindsearch.hindsight import judge as J
from hindsearch.hindsight.methods.hindsearch import HindSearchConfig, HindSearchTerm
from hindsearch.hindsight.methods.igsd import IGSDTerm
from hindsearch.hindsight.registry import make_terms
from hindsearch.hindsight.teacher import teacher_token_logprobs
from hindsearch.models import tiny_random_model
from hindsearch.records import Trajectory, Turn
from hindsearch.hindsight.contract import AuxContext
from test_hindsight_losses import loss_from_full_logits

TEMPLATE = HindSearchConfig().judge_template


@pytest.fixture(scope="module")
def frozen(tok):
    return tiny_random_model(tok, seed=2)


def make_traj(tok, model, question, golds, segments, reward=0.0, evidence=(), extra=None):
    """A trajectory from ``(text, kind)`` segments: kind ``gen`` | ``query`` | ``inject``; turns follow the queries."""
    prompt = protocol.encode_prompt(tok, question, None)
    ids, gen, qm, turns = [], [], [], []
    for text, kind, *docs in segments:
        t_ids = tok(text, add_special_tokens=False)["input_ids"]
        start = len(ids)
        ids += t_ids
        gen += [0 if kind == "inject" else 1] * len(t_ids)
        qm += [1 if kind == "query" else 0] * len(t_ids)
        if kind == "query":
            titles = docs[0] if docs else []
            turns.append(Turn("search", text.strip(), (start, len(ids)), (start, len(ids)), doc_titles=list(titles),
                              doc_snippets=[f"text about {t}" for t in titles]))
    lp, _, _ = teacher_token_logprobs(model, [prompt], [ids])
    logprobs = [float(x) if g else 0.0 for x, g in zip(lp[0], gen)]
    return Trajectory(qid=question[:8], question=question, golden_answers=list(golds), prompt_ids=prompt,
                      completion_ids=ids, gen_mask=gen, query_mask=qm, logprobs=logprobs, turns=turns,
                      answer="Port Ila", reward=reward, evidence=list(evidence), hops=2 if extra else 1, extra=extra or {})


def _segments(query, titles):
    return [("<think> I should search. </think>\n<search>", "gen"), (f" {query}", "query", titles),
            (" </search>", "gen"), ("\n\n<information>Doc 1(Title: A) b</information>\n\n", "inject"),
            ("<answer> Port Ila </answer>", "gen")]


def _ctx(model, frozen, tok, step=0):
    return AuxContext(policy=model, frozen=frozen, tokenizer=tok, retriever=None, step=step)


def test_judge_prompt_gold_iff_sees_gold(tok, model):
    tr = make_traj(tok, model, "Where was Edwin Marlow born", ["Kestrel Bay"], _segments("Edwin Marlow painter", ['"Edwin Marlow"']))
    with_gold = J.build_judge_prompt(tr, TEMPLATE, True, 768, tok)
    without = J.build_judge_prompt(tr, TEMPLATE, False, 768, tok)
    assert "Kestrel Bay" in with_gold and "Kestrel Bay" not in without
    for msg in (with_gold, without):
        assert "Where was Edwin Marlow born" in msg and "'Edwin Marlow painter'" in msg
        assert "[Edwin Marlow: text about" in msg and "Predicted answer: Port Ila" in msg


def test_judge_prompt_truncation_rule(tok, model):
    segs = []
    for q in ("first query about rivers", "second query about towns", "third query about painters"):
        segs += [("<search>", "gen"), (f" {q}", "query", [f"Doc {q} {i}" for i in range(3)]), (" </search>", "gen")]
    tr = make_traj(tok, model, "Which painter was born in the river town", ["Ann"], segs)
    full, steps = J.judge_prompt_with_steps(tr, TEMPLATE, True, 10_000, tok)
    assert steps == [] and "text about" in full
    n = lambda m: len(tok(J.protocol.apply_template(tok, m), add_special_tokens=False)["input_ids"])  # noqa: E731
    no_snip = J._fill(TEMPLATE, tr, True, tr.question, J._search_lines(tr, False, 0))
    msg, steps = J.judge_prompt_with_steps(tr, TEMPLATE, True, n(no_snip), tok)
    assert steps == ["snippets"] and "text about" not in msg and "first query" in msg
    msg, steps = J.judge_prompt_with_steps(tr, TEMPLATE, True, n(no_snip) - 5, tok)
    assert steps == ["snippets", "oldest_searches:1"] and "first query" not in msg
    assert "(1 earlier search omitted)" in msg and "third query" in msg and n(msg) <= n(no_snip) - 5
    tiny = n(J._fill(TEMPLATE, tr, True, "", J._search_lines(tr, False, 3))) + 3
    msg, steps = J.judge_prompt_with_steps(tr, TEMPLATE, True, tiny, tok)
    assert steps[-1] == "question" and n(msg) <= tiny and "Correct answer: Ann" in msg


def test_redact_and_clean():
    text, n = J.redact("It is kestrel bay, not Kestrel Bayview; KESTREL BAY again.", ["Kestrel Bay", ""])
    assert text == "It is [ANSWER], not Kestrel Bayview; [ANSWER] again." and n == 2
    assert J.redact("nothing here", ["Ann"]) == ("nothing here", 0)
    assert J.redact("Ann Lee met Ann", ["Ann", "Ann Lee"]) == ("[ANSWER] met [ANSWER]", 2)  # longest first
    assert J.clean_critique("Search the town. Then the river! Then more.\n\nignored") == "Search the town. Then the river!"
    assert J.clean_critique("  one line\nsecond line\n\nthird") == "one line second line"


@pytest.mark.parametrize("text,bad", [
    ("", True), ("   \n", True), ("...!?", True), ("ok", True), ("Searchbirthplace", True),
    ("Critique:", True), ("In 1-2 sentences, say what the searches should have looked for.", True),
    ("Search for the painter's birthplace instead.", False),
    # a protocol-tuned judge answering as the agent (seen in a real tiny-cpu comparison run)
    ("<think> I need to look this up. </think> <search> Who founded the Skoukhar Company?", True),
    ("The answer should be in <answer> tags", True),
    ("Search for who founded the company, not where it is.", False),
])
def test_is_degenerate(text, bad):
    assert J.is_degenerate(text, TEMPLATE) is bad


def test_oracle_judge(tok, model):
    tr = make_traj(tok, model, "In which country is the birthplace of Edwin Marlow", ["Vostria"],
                   _segments("Edwin Marlow", ['"Edwin Marlow"']), evidence=["Edwin Marlow", "Kestrel Bay"],
                   extra={"metadata": {"bridge": "Kestrel Bay"}})
    c = J.OracleJudge(True).critique([tr])[0]
    assert "Kestrel Bay" in c.text and "Edwin Marlow" not in c.text.split(";")[0] and c.usable
    blind = J.OracleJudge(False).critique([tr])[0]
    assert "Kestrel Bay" not in blind.text and "not find the answer" in blind.text and blind.usable
    tr2 = make_traj(tok, model, "Where was Edwin Marlow born", ["Edwin"], _segments("Edwin", ['"Edwin Marlow"']),
                    evidence=["Edwin Marlow"])
    c2 = J.OracleJudge(True).critique([tr2])[0]
    assert "[ANSWER]" in c2.text and c2.redactions >= 1  # the gold is redacted from the oracle critique too


def test_lm_judge_batched_greedy_and_fallbacks(tok, model):
    trs = [make_traj(tok, model, f"Where was person {i} born", ["Kestrel Bay"], _segments(f"person {i}", ["P"])) for i in range(3)]
    cfg = HindSearchConfig(critique_max_tokens=6)
    judge = J.LMJudge(model, tok, cfg, batch_size=2)
    out = judge.critique(trs)
    assert len(out) == 3 and all(c.raw and c.error is None for c in out) and judge.errors == 0
    again = J.LMJudge(model, tok, cfg).critique(trs)
    assert [c.raw for c in again] == [c.raw for c in out]  # greedy, batch-size independent
    # the same text as transformers' greedy generate of each prompt alone (core.decode is the decoder)
    for tr, c in zip(trs, out):
        msg = J.build_judge_prompt(tr, cfg.judge_template, cfg.judge_sees_gold, cfg.judge_max_prompt_tokens, tok)
        p = tok(J.protocol.apply_template(tok, msg), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            g = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=6, do_sample=False, pad_token_id=pad_id(tok, model))
        assert c.raw == tok.decode(g[0, len(p):], skip_special_tokens=True)
    # a judge whose vocabulary is too small raises inside generate: fallback, counted
    broken = tiny_random_model(tok, seed=0, vocab_size=64)
    bj = J.LMJudge(broken, tok, cfg)
    res = bj.critique(trs[:2])
    assert bj.errors == 2 and all(c.error and not c.usable for c in res)


def test_hindsearch_term_gradient_only_on_query_tokens_of_failed(tok, model, frozen):
    failed = make_traj(tok, model, "Where was Edwin Marlow born", ["Kestrel Bay"], _segments("Edwin Marlow painter", ['"X"']),
                       evidence=["Edwin Marlow"])
    ok = make_traj(tok, model, "Where was Ann born", ["Port Ila"], _segments("Ann birthplace", ['"Ann"']), reward=1.0)
    noq = make_traj(tok, model, "Who is Bo", ["Bo"], [("<answer> Port Ila </answer>", "gen")])
    trajs = [failed, ok, noq]
    T = max(len(t.completion_ids) for t in trajs) + 2
    term = HindSearchTerm(HindSearchConfig(judge_kind="oracle"))
    batch = term.prepare(trajs, T, _ctx(model, frozen, tok))
    m = batch.metrics
    assert m["failed"] == 2 and m["eligible"] == 1 and m["critiques"] == 1 and m["judge_kind_oracle"] == 1.0
    assert batch.tensors["hind_mask"].sum() == sum(failed.query_mask)
    assert batch.samples[0]["critique"] and len(batch.samples[0]["lT"]) == sum(failed.query_mask)
    assert len(batch.samples[0]["distill_tokens"]) == sum(failed.query_mask)
    assert batch.samples[1] == {} and batch.samples[2] == {}
    ids = torch.zeros(3, T, dtype=torch.long)
    for i, t in enumerate(trajs):
        ids[i, : len(t.completion_ids)] = torch.tensor(t.completion_ids)
    logits = torch.randn(3, T, len(tok), requires_grad=True)
    # make the student worse than the teacher on every token so every weight is positive
    with torch.no_grad():
        logits -= 20 * torch.nn.functional.one_hot(ids, len(tok))
    L, lm = loss_from_full_logits(term, logits, ids, batch.tensors)
    assert L.item() > 0 and lm["tokens"] == sum(failed.query_mask)
    L.backward()
    hit = logits.grad.abs().sum(-1) > 0
    expect = torch.zeros(3, T, dtype=torch.bool)
    expect[0, : len(failed.query_mask)] = torch.tensor(failed.query_mask, dtype=torch.bool)
    assert torch.equal(hit, expect)


@pytest.mark.parametrize("div", ["reverse_kl", "jsd"])
def test_hindsearch_term_topk_divergences(tok, model, frozen, div):
    tr = make_traj(tok, model, "Where was Edwin Marlow born", ["Kestrel Bay"], _segments("Edwin Marlow", ['"X"']),
                   evidence=["Edwin Marlow"])
    term = HindSearchTerm(HindSearchConfig(judge_kind="oracle", divergence=div, topk=7))
    T = len(tr.completion_ids)
    batch = term.prepare([tr], T, _ctx(model, frozen, tok))
    assert batch.tensors["hind_topk_ids"].shape == (1, T, 7)
    logits = torch.randn(1, T, len(tok), requires_grad=True)
    L, _ = loss_from_full_logits(term, logits, torch.tensor([tr.completion_ids]), batch.tensors)
    assert L.item() > 0
    L.backward()
    hit = logits.grad.abs().sum(-1)[0] > 0
    assert torch.equal(hit, torch.tensor(tr.query_mask, dtype=torch.bool))


def test_hindsearch_term_nothing_to_distil_is_exact_zero(tok, model, frozen):
    tr = make_traj(tok, model, "Where was Edwin Marlow born", ["Kestrel Bay"], _segments("Edwin Marlow", ['"X"']))
    T = len(tr.completion_ids)
    # a real LM judge limited to 1 token writes a degenerate critique → no distillation, counted
    term = HindSearchTerm(HindSearchConfig(critique_max_tokens=1))
    batch = term.prepare([tr], T, _ctx(model, frozen, tok))
    assert batch.metrics["degenerate"] == 1 and batch.metrics["critiques"] == 0
    assert batch.tensors["hind_mask"].sum() == 0 and batch.samples[0]["critique_usable"] is False
    logits = torch.randn(1, T, len(tok), requires_grad=True)
    L, _ = loss_from_full_logits(term, logits, torch.tensor([tr.completion_ids]), batch.tensors)
    assert L.item() == 0.0 and L.requires_grad
    L.backward()
    assert logits.grad.abs().sum() == 0
    # no failed rollouts at all
    tr.reward = 1.0
    batch = term.prepare([tr], T, _ctx(model, frozen, tok))
    assert batch.metrics["failed"] == 0 and batch.tensors["hind_mask"].sum() == 0


def test_make_terms():
    names = {m: [t.name for t in make_terms(Config(method=m))] for m in ("grpo", "hindsearch", "igsd", "hindsearch+igsd")}
    assert names == {"grpo": [], "hindsearch": ["hind"], "igsd": ["igsd"], "hindsearch+igsd": ["hind", "igsd"]}
    t = make_terms(Config(method="hindsearch+igsd"))
    assert isinstance(t[0], HindSearchTerm) and isinstance(t[1], IGSDTerm) and t[0].lam == 0.01 and t[1].lam == 0.1
    with pytest.raises(ValueError):
        make_terms(SimpleNamespace(method="ppo"))
