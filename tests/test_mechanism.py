"""The mechanism pieces of issue 12: tail-bucket divergences, the signed form, unbiased diagnostics,
the action mask, hindsight-reading demonstrations and the teacher probes."""

from __future__ import annotations

import math

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.agent.engine import RolloutEngine
from hindsearch.agent.hf_backend import HFBackend
from hindsearch.config import Config
from hindsearch.hindsight.registry import resolve_methods
from hindsearch.hindsight import losses as L
from hindsearch.models import tiny_random_model
from test_hindsight_losses import distill, distill_mask, loss_from_full_logits


# ------------------------------------------------------------------ pure losses
def test_tail_bucket_hand_numbers():
    # vocabulary of 4; the teacher's top-2 ids {0, 1} with full-vocabulary probabilities 0.3, 0.3 -> tail 0.4
    s_logits = torch.log(torch.tensor([[[0.1, 0.2, 0.3, 0.4]]]))  # student: top-2 mass 0.3, tail 0.7
    ids = torch.tensor([[[0, 1]]])
    t_logp = torch.log(torch.tensor([[[0.3, 0.3]]]))
    mask = torch.ones(1, 1)
    ps, pt = [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]
    rkl = sum(a * math.log(a / b) for a, b in zip(ps, pt))
    assert distill("reverse_kl", mask, logits=s_logits, topk_ids=ids, topk_logp=t_logp).item() == pytest.approx(rkl, abs=1e-6)
    m = [(a + b) / 2 for a, b in zip(ps, pt)]
    jsd = 0.5 * sum(b * math.log(b / c) for b, c in zip(pt, m)) + 0.5 * sum(a * math.log(a / c) for a, c in zip(ps, m))
    assert distill("jsd", mask, logits=s_logits, topk_ids=ids, topk_logp=t_logp).item() == pytest.approx(jsd, abs=1e-6)
    from trl.experimental.sdpo.loss_utils import add_tail_bucket

    assert add_tail_bucket(t_logp).exp().sum().item() == pytest.approx(1.0, abs=1e-6)


def test_tail_bucket_gives_a_sampled_token_outside_the_topk_a_gradient():
    """Student id 3 (outside the teacher's top-2) gets d KL / d logit_3 = p_3 * (log(p_tail / q_tail) - KL_tail_part)."""
    z = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])).requires_grad_(True)
    ids = torch.tensor([[[0, 1]]])
    t_logp = torch.log(torch.tensor([[[0.3, 0.3]]]))
    kl = L.topk_divergence_per_token(z.view(1, 1, 4), ids, t_logp, 1.0).sum()
    kl.backward()
    assert z.grad[3].item() != 0.0 and z.grad[2].item() != 0.0
    # hand-computed: KL = sum_j p_j log(p_j/q_j) over buckets; d/dz_i = p_i * (log(p_b(i)/q_b(i)) - KL) for softmax z
    ps, pt = [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]
    klv = sum(a * math.log(a / b) for a, b in zip(ps, pt))
    assert z.grad[3].item() == pytest.approx(0.4 * (math.log(0.7 / 0.4) - klv), abs=1e-5)
    assert z.grad[0].item() == pytest.approx(0.1 * (math.log(0.1 / 0.3) - klv), abs=1e-5)
    # the old renormalised form had exactly zero gradient there: check that the tail is what gives it
    z2 = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])).requires_grad_(True)
    s = z2[:2]
    log_ps = s - torch.logsumexp(s, -1)
    (log_ps.exp() * (log_ps - torch.log(torch.tensor([0.5, 0.5])))).sum().backward()
    assert z2.grad[3].item() == 0.0


def test_signed_form_hand_numbers_and_direction():
    lS = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    lT = torch.tensor([[-0.5, -4.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = distill("signed", mask, lS, lT, clip=1.0)
    # a = clip(lT - lS) = (0.5, -1.0); loss = -(0.5 * -1 + -1 * -2) / 2 = -(1.5) / 2
    assert loss.item() == pytest.approx(-0.75)
    loss.backward()
    assert lS.grad.tolist()[0] == pytest.approx([-0.25, 0.5, 0.0])  # descent raises token 0, lowers token 1
    assert distill("signed", mask, lS, lS.detach()).item() == 0.0


def test_one_sided_lowers_a_failed_token_only_where_the_teacher_likes_it_less():
    """Two actions at a decision position (0 = search again, 1 = answer now); the failed rollout sampled 1. Where the
    teacher searches more than the student, one step lowers "answer now" and raises "search again". Where the
    student already searches more than the teacher, ``one_sided`` does nothing, while ``reverse_kl`` and ``signed``
    pull the student back: they raise the failed token."""
    def step(div: str, p_student: float, p_teacher: float) -> float:
        z = torch.log(torch.tensor([[p_student, 1 - p_student]])).requires_grad_(True)
        lt = torch.log(torch.tensor([[p_teacher, 1 - p_teacher]]))
        ids = torch.tensor([1])  # the failed rollout answered
        lS = L.token_logprobs(z, ids)
        x = L.DistillInputs(lS, lt.gather(-1, ids[:, None])[:, 0], z, topk_ids=torch.tensor([[0, 1]]),
                            topk_logp=lt, signed_clip=1.0)
        L.divergence(div).fn(x).sum().backward()
        with torch.no_grad():
            return float(torch.softmax(z - 0.5 * z.grad, -1)[0, 0])  # P(search again) after one SGD step

    assert step("one_sided", 0.25, 0.45) > 0.25  # the teacher searches more: pulled up
    assert step("one_sided", 0.55, 0.45) == pytest.approx(0.55, abs=1e-7)  # past the teacher: left alone
    assert step("reverse_kl", 0.55, 0.45) < 0.55 and step("signed", 0.55, 0.45) < 0.55  # the anchor
    lS = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    lT = torch.tensor([-0.5, -4.0, -0.5])
    v = L.divergence("one_sided").fn(L.DistillInputs(lS, lT, torch.zeros(3, 2), signed_clip=1.0))
    v.sum().backward()
    assert v.tolist() == pytest.approx([0.0, -2.0, 0.0])  # a = (0, -1, 0): only token 1 is lowered
    assert lS.grad.tolist() == pytest.approx([0.0, 1.0, 0.0])


def test_gap_diagnostics_zero_for_equal_and_eps():
    lS = torch.randn(3, 5)
    d = L.gap_diagnostics(lS.clone(), lS, torch.ones(3, 5))
    assert d["mean_lT_minus_lS"] == 0.0 and d["frac_w_pos"] == 0.0 and d["mean_w"] == 0.0 and d["tokens"] == 15
    d = L.gap_diagnostics(lS + 0.5, lS, torch.ones(3, 5))
    assert d["mean_lT_minus_lS"] == pytest.approx(0.5) and d["frac_w_pos"] == 1.0
    assert L.gap_diagnostics(lS, lS, torch.zeros(3, 5))["tokens"] == 0.0


# ------------------------------------------------------------------ a small world and tokenizer
from test_trainer import tok, world  # noqa: E402,F401  (the same small world and BPE fixtures; tests dir on sys.path)


def _two_hop(w):
    return [r for r in w.splits["train"] + w.splits["dev"] + w.splits["test"] if r.hops == 2]


# ------------------------------------------------------------------ action mask
def test_action_mask_covers_exactly_the_action_openers(world, tok):
    from hindsearch.train.scripted import ScriptedSearcher
    from hindsearch.train.demos import tokenize_demo

    w, retriever = world
    demos = [tokenize_demo(tok, d) for d in ScriptedSearcher(retriever, topk=2, p_bridge=1.0).demos(_two_hop(w)[:6])]
    checked = 0
    for d in demos:
        m = protocol.action_mask(d, tok)
        marked = [i for i, v in enumerate(m) if v]
        expect: list[int] = []
        for prev, turn in zip(d.turns, d.turns[1:]):
            assert prev.action == "search"
            s, e = turn.gen_span
            text = tok.decode(d.completion_ids[s:e])
            ends = [len(tok.decode(d.completion_ids[s : s + j + 1])) for j in range(e - s)]
            lead = len("<think> ")
            expect.append(s + next(j for j, x in enumerate(ends) if x > lead))
            tag = "<search>" if "<search>" in text else "<answer>"
            c0 = text.find(tag)
            expect += [s + j for j, x in enumerate(ends) if x > c0 and (ends[j - 1] if j else 0) < c0 + len(tag)]
        assert marked == sorted(set(expect))
        assert all(d.gen_mask[i] for i in marked)  # only generated tokens
        assert not any(m[: d.turns[0].gen_span[1]])  # nothing before the first information block
        decoded = "".join(tok.decode([d.completion_ids[i]]) for i in marked)
        assert "<answer>" in decoded.replace(" ", "") or "<search>" in decoded.replace(" ", "")
        checked += len(d.turns) - 1
    assert checked >= 6
    dm = distill_mask(demos[0], tok, "action")
    assert all(dm[i] for i, q in enumerate(demos[0].query_mask) if q) and sum(dm) > sum(demos[0].query_mask)
    assert distill_mask(demos[0], tok, "query") == demos[0].query_mask


# ------------------------------------------------------------------ hindsight-reading demonstrations
def test_oracle_demos_carry_the_judges_exact_text_and_change_the_queries(world):
    from hindsearch.hindsight.judge import OracleJudge
    from hindsearch.train.scripted import ScriptedSearcher

    w, retriever = world
    recs = w.splits["train"] + w.splits["dev"] + w.splits["test"]
    gold = ScriptedSearcher(retriever, topk=2, p_bridge=0.0, p_feedback=1.0, feedback_kinds=["oracle_gold"]).demos(recs)
    hinted = [d for d in gold if d.extra.get("hint")]
    assert hinted, "no oracle-gold demo"
    for d in hinted:
        assert d.extra["hint"].startswith("Feedback on a previous attempt: The searches never retrieved")
    two = [d for d in hinted if d.hops == 2]
    assert two and all(d.num_searches >= 2 for d in two)  # the critique makes it search the bridge
    for d in two:
        bridge = d.extra["bridge"]
        assert any(t.content == bridge for t in d.turns if t.action == "search")
        # exactly what the oracle judge writes about the one-search attempt
        attempt = ScriptedSearcher(retriever, topk=2, p_bridge=0.0)._write(
            next(r for r in recs if r.id == d.qid), __import__("random").Random(0), chain=False)
        assert d.extra["hint"] == protocol.FEEDBACK_TEMPLATE.format(critique=OracleJudge(True).critique([attempt])[0].text)
    nogold = ScriptedSearcher(retriever, topk=2, p_bridge=0.0, p_feedback=1.0, feedback_kinds=["oracle_nogold"]).demos(recs)
    hn = [d for d in nogold if d.extra.get("hint")]
    assert hn and all("did not find the answer" in d.extra["hint"] for d in hn)
    assert all(d.num_searches == 1 for d in hn)  # no privileged information: an unhinted draw (p_bridge = 0)
    ans = ScriptedSearcher(retriever, topk=2, p_bridge=0.0, p_feedback=1.0, feedback_kinds=["answer_line"]).demos(recs)
    assert all(d.extra["hint"] == f"(The correct answer is: {d.golden_answers[0]}.)\n" for d in ans)
    with pytest.raises(ValueError, match="feedback_kinds"):
        ScriptedSearcher(retriever, feedback_kinds=["nope"])


def test_answer_query_demos_name_the_answer_and_the_retriever_decides(world):
    """``answer_query``: IGSD's answer line, and the first query names the answer before the question. Where that
    search returned a passage holding the gold string the demo answers it after one search; where it returned
    nothing useful it follows the two-hop chain like an unhinted searcher. Both cases occur in a real world."""
    from hindsearch.train.scripted import ScriptedSearcher, find_in_docs

    w, retriever = world
    recs = w.splits["train"] + w.splits["dev"] + w.splits["test"]
    by_id = {r.id: r for r in recs}
    demos = ScriptedSearcher(retriever, topk=2, p_bridge=0.0, p_feedback=1.0, max_turns=3,
                             feedback_kinds=["answer_query"]).demos(recs)
    found = {True: 0, False: 0}
    for d in demos:
        gold = d.golden_answers[0]
        assert d.extra["hint"] == protocol.GOLD_HINDSIGHT_TEMPLATE.format(answer=gold)
        first = d.turns[0]
        assert first.action == "search" and first.content == f"{gold} {protocol.format_question(d.question)}"
        docs = retriever.retrieve([first.content], 2)[0]
        helped = find_in_docs(d.golden_answers, docs) is not None
        assert d.extra["answer_query_found"] is helped
        found[helped] += 1
        if helped:
            assert d.num_searches == 1 and d.em == 1.0  # it answers from what the hindsight query retrieved
        elif d.hops == 2 and by_id[d.qid].metadata.get("bridge"):
            assert d.extra["followed_chain"] and d.num_searches >= 2  # nothing useful: it searches on
    assert found[True] and found[False], found
    # the other kinds are unchanged: the answer line with the question as first query
    line = ScriptedSearcher(retriever, topk=2, p_bridge=0.0, p_feedback=1.0, feedback_kinds=["answer_line"]).demos(recs)
    assert all(d.turns[0].content == protocol.format_question(d.question) for d in line)


# ------------------------------------------------------------------ diagnostics through the term
@pytest.mark.parametrize("temperature", [0.5, 1.3])
def test_term_diagnostics_are_zero_when_teacher_is_student(world, tok, temperature, monkeypatch, one_thread):
    """Teacher = the live policy with the student's own prompt: the logged gap is 0 at any rollout temperature
    (the old diagnostics compared temperature-1 teacher scores with sampling log-probs and were biased)."""
    from types import SimpleNamespace

    from hindsearch.hindsight.methods import hindsearch as terms

    w, retriever = world
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1).eval()
    cfg = resolve_methods(Config.load(None, ['model.name="tiny-random"', "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=12",
                             f"rollout.temperature={temperature}", 'hindsearch.judge_kind="oracle"',
                             'hindsearch.teacher="live"', 'hindsearch.distill_on="action"', "hindsearch.neutral_control=true"]))
    eng = RolloutEngine(model, tok, retriever, cfg.rollout, topk=2, backend=HFBackend(model, tok))
    recs = w.splits["train"][:6]
    trajs = eng.rollout(recs, num_generations=2, seed=1, hints=None,
                        prefixes=[tok("<think> x </think>\n<search>", add_special_tokens=False)["input_ids"]] * len(recs))
    for t in trajs:  # make every rollout a failed one with a query (the prefix is part of the prompt here)
        t.reward = 0.0
        t.query_mask = [1 if g else 0 for g in t.gen_mask]
    monkeypatch.setattr(terms, "hindsearch_prompt_ids", lambda tk, q, c: next(x.prompt_ids for x in trajs if x.question == q))
    term = terms.HindSearchTerm(cfg.hindsearch)
    ctx = SimpleNamespace(policy=model, frozen=model, ema=None, tokenizer=tok, config=cfg, step=0)
    Tn = max(len(t.completion_ids) for t in trajs)
    with torch.no_grad():
        batch = term.prepare(trajs, Tn, ctx)
        logits = torch.zeros(len(trajs), Tn, model.config.vocab_size)
        ids = torch.zeros(len(trajs), Tn, dtype=torch.long)
        for i, t in enumerate(trajs):
            full = torch.tensor([t.prompt_ids + t.completion_ids])
            logits[i, : len(t.completion_ids)] = model(input_ids=full).logits[0, len(t.prompt_ids) - 1 : -1]
            ids[i, : len(t.completion_ids)] = torch.tensor(t.completion_ids)
    assert batch.metrics["distill_tokens"] > 0
    assert batch.metrics["critique_minus_neutral"] == pytest.approx(0.0, abs=1e-4)
    _, met = loss_from_full_logits(term, logits, ids, batch.tensors)
    assert met["tokens"] > 0
    assert met["mean_lT_minus_lS"] == pytest.approx(0.0, abs=1e-4)
    assert met["frac_w_pos"] == 0.0 and met["mean_w"] == pytest.approx(0.0, abs=1e-4)
    # the biased version: sampling log-probs against temperature-1 teacher scores give w > 0 on some tokens
    lp = torch.tensor([x for t in trajs for x, q in zip(t.logprobs, t.query_mask) if q])
    lt = batch.tensors["hind_lT"][batch.tensors["hind_mask"].bool()]
    assert float((lt - lp).abs().max()) > 1e-2 and float(((lt - lp) > 1e-4).float().mean()) > 0


# ------------------------------------------------------------------ probes on a constructed case
class HintReader(RolloutEngine):
    """The real engine with scripted sampled tokens: with a hint that names a title ("search for X directly")
    it searches X and answers the gold; otherwise it searches ``weather`` and answers ``nobody``."""

    def __init__(self, model, tok, retriever, cfg):
        super().__init__(model, tok, retriever, cfg, topk=2, backend=HFBackend(model, tok), logits_hook=self._force)
        self._scripts: list[list[list[int]]] = []

    def rollout(self, records, num_generations=1, hints=None, prefixes=None, **kw):
        import re

        enc = lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self._scripts = []
        for i, r in enumerate(records):
            m = re.search(r"search for (.+?) directly", (hints or [None] * len(records))[i] or "")
            for _ in range(num_generations):
                if m:
                    turns = [f"<search> {m.group(1)} </search>", f"<answer> {r.golden_answers[0]} </answer>"]
                else:
                    turns = ["<search> weather </search>", "<answer> nobody </answer>"]
                self._scripts.append([enc(t) for t in turns])
        return super().rollout(records, num_generations, hints=hints, prefixes=prefixes, **kw)

    def _force(self, rows, new_ids, logits):
        out = torch.full_like(logits, float("-inf"))
        for j, (row, ids) in enumerate(zip(rows, new_ids)):
            script = self._scripts[row[0]][row[1]] if row[1] < len(self._scripts[row[0]]) else []
            out[j, script[len(ids)] if len(ids) < len(script) else self.tokenizer.eos_token_id] = 0.0
        return out


def test_probe_finds_the_gain_of_a_hint_that_names_the_evidence(world, tok, one_thread):
    from hindsearch.study.probe import format_probe, run_probe

    w, retriever = world
    cfg = resolve_methods(Config.load(None, ['model.name="tiny-random"', "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=24",
                             "rollout.max_total_tokens=2048", 'hindsearch.judge_kind="oracle"']))
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1).eval()
    eng = HintReader(model, tok, retriever, cfg.rollout)
    recs = [r for r in w.splits["train"] if r.hops == 1][:6]
    with torch.no_grad():
        res = run_probe(eng, recs, cfg, n=6, samples=2, seed=0, log=lambda *_: None)
    assert res["n_failed"] == 6 and res["student_em"] == 0.0
    h = res["hints"]
    gold = h["critique_gold"]
    assert gold["usable"] == 6
    assert gold["rerun"]["em"] == 1.0 and gold["rerun"]["evidence_recall"] > res["student"]["rerun"]["evidence_recall"]
    assert gold["state"]["hit_missed"] > res["student"]["state"]["hit_missed"]
    # hints that name nothing change nothing
    for name in ("neutral", "critique_nogold", "answer"):
        assert h[name]["rerun"]["em"] == 0.0
        assert h[name]["rerun"]["evidence_recall"] == res["student"]["rerun"]["evidence_recall"]
        assert h[name]["state"]["hit_missed"] == res["student"]["state"]["hit_missed"]
    assert "critique_gold" in format_probe(res)
    # probe 5: IGSD's own driver on the same failures. The scripted tokens are forced by the hook, not the tiny
    # model's argmax, so its answer-line top token differs from the student's at most query positions
    g = res["igsd"]
    assert g["positions_considered"] > 0 and g["teacher_differs"] > 0.5
    assert g["delta_pos_pairs"] + g["delta_nonpos_pairs"] == g["pairs_verified"] > 0
    assert 0.0 <= g["precision_pos"] <= 1.0 and 0.0 <= g["precision_nonpos"] <= 1.0
    assert "the gate's precision" in format_probe(res)


# ------------------------------------------------------------------ the new loss options through the trainer
@pytest.mark.parametrize("divergence,distill_on", [("signed", "action"), ("reverse_kl", "action"), ("jsd", "query"),
                                                ("one_sided", "decision_query"), ("one_sided", "answer_decision")])
def test_two_steps_of_each_new_loss_option(divergence, distill_on, world, tok, tmp_path, one_thread):
    import json

    from test_trainer import OVERRIDES, make_trainer

    w, retriever = world
    cfg = resolve_methods(Config.load(None, OVERRIDES + ['method="hindsearch"', "train.kl_coef=0.0", 'hindsearch.judge_kind="oracle"',
                                         f'hindsearch.divergence="{divergence}"', f'hindsearch.distill_on="{distill_on}"',
                                         "hindsearch.neutral_control=true", "hindsearch.topk=8", "hindsearch.lam=0.5",
                                         "train.grad_share_steps=1"]))
    run = tmp_path / "run"
    trainer, _ = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    trainer.train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["hind/loss"])
        assert "hind/mean_lT_minus_lS" in r and "hind/critique_minus_neutral" in r
    assert any(r.get("hind/grad_share", 0) > 0 for r in rows), rows
    if distill_on == "action":
        assert any(r["hind/action_tokens"] > 0 for r in rows)


# ------------------------------------------------------------------ paired bootstrap of the comparison
def test_paired_bootstrap_and_rows(tmp_path):
    import json

    from hindsearch.study.results import run_name
    from hindsearch.records import Trajectory, Turn
    from hindsearch.study.paired import bootstrap_markdown, bootstrap_rows, paired_bootstrap

    def run_dir(m, s):
        return tmp_path / run_name(m, s)

    m, lo, hi = paired_bootstrap([0.5] * 40)
    assert (m, lo, hi) == (0.5, 0.5, 0.5)
    m, lo, hi = paired_bootstrap([1.0, -1.0] * 50, n_boot=500)
    assert m == 0.0 and lo < 0 < hi
    assert paired_bootstrap([]) == (0.0, 0.0, 0.0)

    def write(method, seed, em_of):
        rd = tmp_path / run_name(method, seed)
        d = rd / "eval" / "test-world"
        d.mkdir(parents=True)
        rows = []
        for i in range(20):
            hops = 2 if i % 2 else 1
            em = em_of(i, hops)
            t = Trajectory(qid=f"q{i}", question="q?", golden_answers=["x"], prompt_ids=[], em=em, hops=hops,
                           evidence=["A", "B"] if hops == 2 else ["A"],
                           turns=[Turn(action="search", doc_titles=['"A"'] + (['"B"'] if em else []))])
            rows.append({"benchmark": "world", **t.to_dict()})
        (d / "trajectories.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (rd / "done.json").write_text("{}")

    for s in (0, 1):
        write("grpo", s, lambda i, h: 1.0 if h == 1 else 0.0)
        write("hindsearch", s, lambda i, h: 1.0)  # also solves every two-hop question (and retrieves B)
    rows = bootstrap_rows(run_dir, ["grpo", "hindsearch"], [0, 1], n_boot=200)
    assert len(rows) == 1 and rows[0]["seeds"] == 2 and rows[0]["questions"] == 20
    em, lo, hi = rows[0]["em"]
    assert em == 0.5 and 0.0 < lo < 0.5 < hi <= 1.0 and rows[0]["em_2hop"] == (1.0, 1.0, 1.0)
    assert rows[0]["recall"][0] == pytest.approx(0.25)  # two-hop recall 0.5 -> 1.0 on half the questions
    assert "+100.0 [+100.0, +100.0]" in bootstrap_markdown(run_dir, ["grpo", "hindsearch"], [0, 1])
