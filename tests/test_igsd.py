"""IGSD: positions, matched completion, cached execution, shared controls, paired gain and gate,
the term's loss — real tiny models, a real BM25 index over a small constructed corpus."""

from __future__ import annotations

import random

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.agent.engine import RolloutEngine
from hindsearch.agent.hf_backend import HFBackend
from hindsearch.config import RolloutConfig
from hindsearch.hindsight.methods.igsd import IGSDConfig
from hindsearch.hindsight import igsd as G
from hindsearch.core.scoring import score_continuations, shared_prefix_utilities
from hindsearch.hindsight.methods.igsd import IGSDTerm
from hindsearch.hindsight.teacher import igsd_prompt_ids, teacher_token_logprobs
from hindsearch.models import tiny_random_model
from hindsearch.records import Passage, Trajectory, Turn, make_contents
from hindsearch.retrieval.factory import build_index, load_index
from hindsearch.hindsight.contract import AuxContext
from test_hindsight_losses import loss_from_full_logits

FACTS = [
    ("Edwin Marlow", "Edwin Marlow was a painter born in the harbour town of Kestrel Bay in 1821."),
    ("Kestrel Bay", "Kestrel Bay is a harbour town in Vostria, known for its lighthouse."),
    ("Bread", "Bread is baked from flour, water and yeast in many kitchens."),
    ("Rye", "Rye bread recipes use sour dough and caraway."),
    ("Lighthouse", "A lighthouse guides ships with a lamp at night."),
    ("Vostria", "Vostria is a small country with a long coast."),
    ("Oak", "The oak is a tree with hard wood and acorns."),
    ("Tea", "Tea is brewed from dried leaves of the tea plant."),
]
CORPUS = [Passage(id=str(i), contents=make_contents(t, x)) for i, (t, x) in enumerate(FACTS)]


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    d = tmp_path_factory.mktemp("igsd_index")
    build_index(CORPUS, d, kind="bm25", show_progress=False)
    return load_index(d)


def make_traj(tok, question, golds, query, reward=0.0):
    """Prompt + ``<think>..</think>\\n<search>`` + query tokens + `` </search>`` + an information block + answer."""
    prompt = protocol.encode_prompt(tok, question, None)
    segs = [("<think> search it </think>\n<search>", 0, 1), (f" {query}", 1, 1), (" </search>", 0, 1),
            ("\n\n<information>Doc 1(Title: Oak) The oak.</information>\n\n", 0, 0), ("<answer> Oak </answer>", 0, 1)]
    ids, qm, gm = [], [], []
    for text, q, g in segs:
        t = tok(text, add_special_tokens=False)["input_ids"]
        ids += t
        qm += [q] * len(t)
        gm += [g] * len(t)
    qs = qm.index(1)
    qe = qs + sum(qm)
    return Trajectory(qid="q", question=question, golden_answers=golds, prompt_ids=prompt, completion_ids=ids,
                      gen_mask=gm, query_mask=qm, logprobs=[0.0] * len(ids), reward=reward, answer="Oak",
                      turns=[Turn("search", query, (0, qe), (qs, qe))])


def test_select_positions():
    qm = [0, 1, 1, 1, 1, 0]
    a = [9, 1, 2, 3, 4, 9]
    b = [9, 1, 7, 8, 6, 9]
    pref = [0, 0, 0.5, 2.0, 1.0, 0]
    rng = random.Random(0)
    assert G.select_positions(qm, a, b, pref, "disagree", 2, rng) == [3, 4]  # largest teacher preference
    assert G.select_positions(qm, a, b, pref, "disagree", 8, rng) == [2, 3, 4]
    assert G.select_positions(qm, a, b, pref, "all", 3, rng) == [1, 2, 3]
    r = G.select_positions(qm, a, b, pref, "random", 2, rng)
    assert len(r) == 2 and set(r) <= {1, 2, 3, 4}
    assert G.select_positions([0, 0], [1, 2], [3, 4], [0, 0], "disagree", 4, rng) == []
    with pytest.raises(ValueError):
        G.select_positions(qm, a, b, pref, "best", 2, rng)


def test_unseen_answer_positions():
    # completion 5 6 7 8, query at 1..3; the teacher proposes answer token 42 at 1 and 3, and answer token 5 at 2
    comp, prop, qm = [5, 6, 7, 8], [9, 42, 5, 42], [0, 1, 1, 1]
    assert G.unseen_answer_positions(comp, prop, qm, [1, 2], {42, 5}) == {1, 3}  # 5 was already generated at 0
    assert G.unseen_answer_positions(comp, prop, qm, [1, 42], {42, 5}) == set()  # 42 is in the prompt
    assert G.unseen_answer_positions(comp, prop, [0, 0, 0, 0], [1], {42}) == set()  # not a query token
    assert G.unseen_answer_positions([5, 42, 7, 8], prop, qm, [1], {42}) == {1}  # seen at 1 only after position 1


def test_answer_token_ids(tok):
    ids = lambda text: set(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert G.answer_token_ids(tok, ["Kestrel Bay"]) == ids("Kestrel Bay") | ids(" Kestrel Bay")
    assert G.answer_token_ids(tok, ["Kestrel Bay", "Oak"]) == ids("Kestrel Bay") | ids(" Kestrel Bay") | ids("Oak") | ids(" Oak")


def _prefers(model, token_id: int):
    """A copy of ``model`` whose LM head adds a large bias to ``token_id``: a teacher whose top token is always it."""
    import copy

    teacher = copy.deepcopy(model)
    old = teacher.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[token_id] = 1e3
    teacher.lm_head = head
    return teacher


def test_propose_drops_unseen_answer_tokens(tok, model):
    """``answer_tokens = drop``: a proposed token of the gold answer that the student never saw is neither verified
    nor distilled (counted); the same token is kept when the question contains it, and always under ``keep``."""
    gold = "Kestrel Bay"
    x = tok(" Kestrel", add_special_tokens=False)["input_ids"][0]
    teacher = _prefers(model, x)
    keep_cfg = IGSDConfig(proposals="any", positions="all", max_positions_per_rollout=64)
    drop_cfg = IGSDConfig(proposals="any", positions="all", max_positions_per_rollout=64, answer_tokens="drop")

    def propose(tr, cfg):
        m = dict.fromkeys(G.METRIC_KEYS, 0.0)
        return G.propose_pairs([tr], len(tr.completion_ids), teacher, tok, cfg, random.Random(0), m), m

    unseen = make_traj(tok, "Where was Edwin Marlow born?", [gold], "Edwin Marlow birthplace")
    assert x not in unseen.prompt_ids and x not in unseen.completion_ids
    kept, m_keep = propose(unseen, keep_cfg)
    n_query = sum(unseen.query_mask)
    assert len(kept) == n_query and all(p.b == x for p in kept) and m_keep["answer_tokens_dropped"] == 0
    left, m = propose(unseen, drop_cfg)
    assert left == [] and m["answer_tokens_dropped"] == n_query
    seen = make_traj(tok, "Was Edwin Marlow born in Kestrel Bay?", [gold], "Edwin Marlow birthplace")
    left, m = propose(seen, drop_cfg)  # the student read " Kestrel" in its question: the teacher's token is fair
    assert len(left) == sum(seen.query_mask) and m["answer_tokens_dropped"] == 0


def test_cache_dedupes_identical_queries(retriever):
    cache = G.QueryCache()
    res = cache.fetch(retriever, ["Edwin Marlow", "bread", "Edwin Marlow", "", "bread"], 2)
    assert cache.calls == 1 and cache.misses == 3 and cache.hits == 2
    assert res[0] is res[2] and res[3] == [] and res[0][0].bare_title == "Edwin Marlow"
    cache.fetch(retriever, ["bread", "tea"], 2)
    assert cache.calls == 2 and cache.hits == 3


def test_answer_split(tok):
    ctx, ans = G.answer_split(tok, "\n\n<information>x</information>\n\n", "Kestrel Bay")
    assert tok.decode(ans).strip() == "Kestrel Bay" and tok.decode(ctx).endswith("<answer>")


def _utility(model, tok, state, passages, gold):
    ctx, ans = G.answer_split(tok, protocol.information_block(passages), gold)
    lp, _, _ = score_continuations(model, [state + ctx], [ans])
    return float(lp[0].mean())


def test_run_igsd_controls_shared_and_ig_recomputed(tok, model, retriever, term_context):
    tr = make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "Edwin Marlow painter birthplace")
    cfg = IGSDConfig(positions="all", max_positions_per_rollout=2, max_query_tokens=4, n_controls=2, proposals="any",
                     utility_state="query")  # each side scored after its own query, as recomputed below
    T = len(tr.completion_ids) + 3
    tens, m, samples = G.run_igsd([tr], T, term_context(model, tok, retriever), cfg, rng=random.Random(1))
    assert m["positions_selected"] == 2 and m["positions_verified"] == 2 and m["completions"] == 4
    assert m["retrieval_calls"] == 1 and m["retrieval_queries"] + m["cache_hits"] == 4
    assert tens["igsd_mask"].sum() == 2 and all(torch.isfinite(v.float()).all() for v in tens.values())
    byid = {p.id: p for p in CORPUS}
    for rec in samples[0]["igsd_pairs"]:
        assert len(rec["control_ids"]) == 2 and all(len(c) == 2 for c in rec["control_ids"])
        controls = [[byid[i] for i in c] for c in rec["control_ids"]]
        t = rec["t"]
        igs = {}
        for side, tok_id in (("S", tr.completion_ids[t]), ("T", tens["igsd_b"][0, t].item())):
            pre = tr.prompt_ids + tr.completion_ids[:t] + [tok_id]
            o, = HFBackend(model, tok).complete_queries([pre], cfg.max_query_tokens)
            ids = o.ids[:-1] if o.finish == "eos" else o.ids
            kept, closed = protocol.cut_at_search_close(tok, ids, tr.completion_ids[G.query_start(tr.query_mask, t) : t] + [tok_id])
            state = pre + kept + ([] if closed else protocol.search_close_ids(tok))
            docs = retriever.retrieve([rec[f"q_{side}"]], 2)[0]
            assert [d.bare_title for d in docs] == rec[f"titles_{side}"]
            u = _utility(model, tok, state, docs, "Kestrel Bay")
            c = [_utility(model, tok, state, ctl, "Kestrel Bay") for ctl in controls]  # the SAME controls for both sides
            igs[side] = u - sum(c) / 2
            assert rec[f"ig_{side}"] == pytest.approx(igs[side], abs=1e-4)
        assert rec["delta"] == pytest.approx(igs["T"] - igs["S"], abs=1e-4)


def test_swapping_tokens_negates_delta_and_zeroes_gate(tok, model, retriever, term_context):
    tr = make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "bread")
    t = tr.query_mask.index(1)
    a = tr.completion_ids[t]
    b = tok(" Edwin", add_special_tokens=False)["input_ids"][0]
    cfg = IGSDConfig(proposals="any", max_query_tokens=3, n_controls=2)
    res = {}
    for name, (x, y) in {"orig": (a, b), "swap": (b, a)}.items():
        pair = G.Pair(0, t, x, y, (0.5, 0.5), t)
        m = dict.fromkeys(G.METRIC_KEYS, 0.0)
        G.verify_pairs([pair], [tr], term_context(model, tok, retriever), cfg, corpus=CORPUS, rng=random.Random(7), m=m)
        res[name] = pair
    assert res["orig"].queries["T"] == res["swap"].queries["S"]
    assert res["orig"].delta == pytest.approx(-res["swap"].delta, abs=1e-6) and res["orig"].delta != 0
    assert min(res["orig"].gate, res["swap"].gate) == 0.0


def test_edge_cases_never_crash(tok, model, retriever, term_context):
    from hindsearch.retrieval.client import RemoteRetriever

    tr = make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay Harbour Town Of The North"], "Edwin Marlow")
    T = len(tr.completion_ids)
    kw = dict(rng=random.Random(0))
    # no failed rollouts
    ok = make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "Edwin", reward=1.0)
    tens, m, _ = G.run_igsd([ok], T, term_context(model, tok, retriever), IGSDConfig(proposals="any"), **kw)
    assert m["failed"] == 0 and tens["igsd_mask"].sum() == 0
    # no query tokens
    nq = make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "x")
    nq.query_mask = [0] * len(nq.query_mask)
    tens, m, _ = G.run_igsd([nq], T, term_context(model, tok, retriever), IGSDConfig(proposals="any"), **kw)
    assert m["rows_no_query"] == 1 and m["positions_selected"] == 0
    # never-closed completions, garbage queries with empty results, answer over budget, empty controls
    cfg = IGSDConfig(proposals="any", positions="all", max_query_tokens=1, max_answer_tokens=2, control="empty")
    tens, m, s = G.run_igsd([tr], T, term_context(model, tok, retriever), cfg, **kw)
    assert m["never_closed"] > 0 and m["answers_cut"] > 0 and m["positions_verified"] > 0
    assert all(torch.isfinite(v.float()).all() for v in tens.values()) and m["mean_delta"] == m["mean_delta"]
    assert all(all(c == [] for c in r["control_ids"]) for r in s[0]["igsd_pairs"])
    # teacher agreeing everywhere: put the teacher's own argmax on every query token
    agree = make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "Edwin Marlow")
    prompt = igsd_prompt_ids(tok, agree.question, agree.golden_answers)
    for t in [i for i, q in enumerate(agree.query_mask) if q]:
        _, top, _ = teacher_token_logprobs(model, [prompt], [agree.completion_ids], topk=1)
        agree.completion_ids[t] = int(top[0, t, 0])
    tens, m, _ = G.run_igsd([agree], T, term_context(model, tok, retriever), IGSDConfig(proposals="any"), **kw)
    assert m["teacher_agree"] == sum(agree.query_mask) and m["positions_selected"] == 0
    # a retriever that is down: pairs are not verified, errors counted
    dead = RemoteRetriever("http://127.0.0.1:9", timeout_s=0.5, retries=0)
    tens, m, _ = G.run_igsd([tr], T, term_context(model, tok, dead), IGSDConfig(proposals="any", positions="all", max_query_tokens=2), **kw)
    assert m["retrieval_errors"] > 0 and m["positions_verified"] == 0 and tens["igsd_mask"].sum() == 0


@pytest.mark.parametrize("gate", ["positive_sigmoid", "none"])
def test_igsd_term_with_rollout_engine(tok, model, retriever, gate):
    frozen = tiny_random_model(tok, seed=6)
    engine = RolloutEngine(model, tok, retriever, RolloutConfig(), topk=2)
    trs = [make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "Edwin Marlow painter"),
           make_traj(tok, "Where was Edwin Marlow born", ["Kestrel Bay"], "Edwin Marlow", reward=1.0)]
    T = max(len(t.completion_ids) for t in trs)
    term = IGSDTerm(IGSDConfig(proposals="any", hindsight="answer", positions="all", max_positions_per_rollout=3, max_query_tokens=3, gate=gate))
    ctx = AuxContext.of_engine(engine, frozen, step=3)
    batch = term.prepare(trs, T, ctx)
    assert batch.metrics["positions_verified"] == 3 and batch.metrics["completions"] == 6
    assert batch.samples[1] == {} and len(batch.samples[0]["igsd_pairs"]) == 3
    logits = torch.randn(2, T, len(tok), requires_grad=True)
    ids = torch.zeros(2, T, dtype=torch.long)
    L, lm = loss_from_full_logits(term, logits, ids, batch.tensors)
    assert torch.isfinite(L)
    L.backward()
    hit = logits.grad.abs().sum(-1) > 0
    gated = (batch.tensors["igsd_mask"] > 0) & (batch.tensors["igsd_gate"] > 0) & (batch.tensors["igsd_a"] != batch.tensors["igsd_b"])
    assert torch.equal(hit, gated)
    if gate == "none":
        assert torch.equal(batch.tensors["igsd_gate"], batch.tensors["igsd_mask"])
    # nothing to distil: exact zero, attached
    empty = {k: torch.zeros_like(v) for k, v in batch.tensors.items()}
    z, _ = loss_from_full_logits(term, logits, ids, empty)
    assert z.item() == 0.0 and z.requires_grad


@pytest.mark.slow
def test_constructed_case_teacher_query_finds_evidence(retriever):
    """SmolLM2-135M (real weights): completing ``<search> Edwin`` retrieves the evidence passage,
    ``<search> bread`` does not; the answer is likelier after the evidence → delta > 0, gate > 0.5;
    swapping the two tokens gives a zero gate."""
    from hindsearch.config import ModelConfig
    from hindsearch.models import load_policy

    model, tok = load_policy(ModelConfig(name="smollm2-135m", device="cpu"))
    tr = make_traj(tok, "Where was the painter Edwin Marlow born", ["Kestrel Bay"], "bread recipes")
    t = tr.query_mask.index(1)
    a, b = tr.completion_ids[t], tok(" Edwin", add_special_tokens=False)["input_ids"][0]
    cfg = IGSDConfig(proposals="any", max_query_tokens=6, n_controls=2)
    out = {}
    for name, (x, y) in {"orig": (a, b), "swap": (b, a)}.items():
        pair = G.Pair(0, t, x, y, (0.5, 0.5), t)
        m = dict.fromkeys(G.METRIC_KEYS, 0.0)
        G.verify_pairs([pair], [tr], AuxContext(policy=model, frozen=model, tokenizer=tok, retriever=retriever,
                                                complete=HFBackend(model, tok), topk=2),
                       cfg, corpus=CORPUS, rng=random.Random(3), m=m)
        out[name] = pair
    p = out["orig"]
    assert "Edwin" in p.queries["T"] and "Edwin Marlow" in [d.bare_title for d in p.docs["T"]]
    assert "Edwin Marlow" not in [d.bare_title for d in p.docs["S"]]
    assert p.delta > 0 and p.gate > 0.5, (p.queries, p.ig)
    assert out["swap"].gate == 0.0


def test_cached_prefix_utility_and_completion_equal_plain(tok, model, retriever, term_context):
    """Prefix-cached utilities / greedy completions (groups sharing a prefix, chunked micro-batches, ragged
    lengths, an identical state twice, an empty answer) equal the plain full-sequence ones; the whole
    driver gives the same u, IG, delta and gate with and without the prefix cache."""
    trs = [make_traj(tok, q, ["Kestrel Bay"], x) for q, x in
           (("Where was Edwin Marlow born", "Edwin Marlow painter"), ("What is rye bread", "rye bread recipe sour"),
                                                           ("Where is Kestrel Bay", "Kestrel"))]
    states, ctxs, answers, groups = [], [], [], []
    for g, tr in enumerate(trs):
        for t, docs in ((3, CORPUS[:2]), (5, CORPUS[2:5]), (5, []), (3, CORPUS[:2])):
            ctx, ans = G.answer_split(tok, protocol.information_block(docs), "Kestrel Bay" if t == 3 else "a long gold answer")
            states.append(tr.prompt_ids + tr.completion_ids[: t + 4 * (g % 2)])
            ctxs.append(ctx), answers.append(ans), groups.append(g)
    answers[2] = []
    u = shared_prefix_utilities(model, states, ctxs, answers, groups, batch_size=2)  # 2 chunks of groups
    plain = [float(score_continuations(model, [s + c], [a])[0][0].mean()) if a else 0.0 for s, c, a in zip(states, ctxs, answers)]
    assert u.shape == (12,) and u[2] == 0.0 and float(u[0]) == pytest.approx(float(u[3]), abs=1e-6)
    assert u.tolist() == pytest.approx(plain, abs=1e-4)
    prefixes = [s + [a[0] if a else 5] for s, a in zip(states, answers)]
    cached = HFBackend(model, tok).complete_queries(prefixes, 5, groups, batch_size=2)
    plain = HFBackend(model, tok).complete_queries(prefixes, 5)
    assert [(o.ids, o.finish) for o in cached] == [(o.ids, o.finish) for o in plain]
    assert [x for o in cached for x in o.logprobs] == pytest.approx([x for o in plain for x in o.logprobs], abs=1e-4)
    cfg = IGSDConfig(proposals="any", positions="all", max_positions_per_rollout=1, max_query_tokens=3, n_controls=2)
    T = max(len(t.completion_ids) for t in trs)
    runs = [G.run_igsd(trs[:2], T, term_context(model, tok, retriever), cfg, rng=random.Random(4), batch_size=2,
                       prefix_cache=pc) for pc in (True, False)]
    assert runs[0][1]["utility_evals"] == runs[1][1]["utility_evals"] > 0
    assert torch.allclose(runs[0][0]["igsd_gate"], runs[1][0]["igsd_gate"], atol=1e-4)
    for ra, rb in zip(runs[0][2], runs[1][2]):
        for pa, pb in zip(ra["igsd_pairs"], rb["igsd_pairs"]):
            assert (pa["q_T"], pa["q_S"], pa["control_ids"]) == (pb["q_T"], pb["q_S"], pb["control_ids"])
            for key in ("u_S", "u_T", "ig_S", "ig_T", "delta", "gate"):
                assert pa[key] == pytest.approx(pb[key], abs=1e-4), key
