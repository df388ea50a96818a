"""The transfer pieces of issue 21: the decision mask and per-token action weights, the weighted reduction, the
shuffled-critique control, GRPO's loss scale (the distillation-only check) and the direction of one step."""

from __future__ import annotations

import json

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.config import Config
from hindsearch.hindsight.registry import resolve_methods
from hindsearch.hindsight import losses as L
from hindsearch.hindsight import teacher as T
from hindsearch.hindsight.methods.hindsearch import HindSearchTerm
from hindsearch.models import tiny_random_model
from test_hindsight_losses import distill_mask, loss_from_full_logits

from test_trainer import OVERRIDES, make_trainer, tok, world  # noqa: F401  (fixtures; tests dir on sys.path)

TWO_TURNS = ["rollout.max_turns=2", "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=2048"]


def _demos(world, tok, n=6):
    from hindsearch.train.demos import tokenize_demo
    from hindsearch.train.scripted import ScriptedSearcher

    w, retriever = world
    two = [r for r in w.splits["train"] + w.splits["dev"] + w.splits["test"] if r.hops == 2][:n]
    return [tokenize_demo(tok, d) for d in ScriptedSearcher(retriever, topk=2, p_bridge=1.0).demos(two)]


# ------------------------------------------------------------------ masks and weights
def test_decision_mask_covers_each_post_information_turn_up_to_its_tag(world, tok):
    checked = 0
    for d in _demos(world, tok):
        m = protocol.decision_mask(d, tok)
        assert not any(m[: d.turns[0].gen_span[1]])  # nothing in the first turn
        assert not any(v and q for v, q in zip(m, d.query_mask))  # no query token
        for prev, turn in zip(d.turns, d.turns[1:]):
            s, e = turn.gen_span
            marked = [j for j in range(s, e) if m[j]]
            assert marked == list(range(s, s + len(marked)))  # one span from the turn's first token
            text = tok.decode(d.completion_ids[s : s + len(marked)])
            tag = "<search>" if "<search>" in tok.decode(d.completion_ids[s:e]) else "<answer>"
            assert text.rstrip().endswith(tag), text  # ... through the action tag, not past it
            assert tag not in tok.decode(d.completion_ids[s : s + len(marked) - 1])
            checked += 1
        # the old action mask's positions are all inside the decision span
        assert all(m[j] for j, a in enumerate(protocol.action_mask(d, tok)) if a)
    assert checked >= 6


def test_distill_weights_per_mode(world, tok):
    d = next(x for x in _demos(world, tok) if len(x.turns) >= 3)  # search, search again, answer
    q, act, dec = d.query_mask, protocol.action_mask(d, tok), protocol.decision_mask(d, tok)
    later = T.later_query_mask(d)
    first_q = [j for j in range(*d.turns[0].gen_span) if q[j]]
    assert first_q and not any(later[j] for j in first_q) and any(later)
    assert T.distill_weights(d, tok, "query") == [float(x) for x in q]
    assert T.distill_weights(d, tok, "action") == [float(bool(a) or bool(b)) for a, b in zip(q, act)]
    w = T.distill_weights(d, tok, "decision_query", action_weight=4.0)
    assert w == [4.0 if x and not y else float(bool(y)) for x, y in zip(dec, later)]
    assert T.distill_weights(d, tok, "decision", action_weight=3.0) == [3.0 * x for x in dec]
    assert distill_mask(d, tok, "decision_query") == [int(x > 0) for x in w]
    # answer_decision: the decision of the turn that answered, not of the turn that searched again
    answered = T.distill_weights(d, tok, "answer_decision", action_weight=2.0)
    spans = {t.action: t.gen_span for t in d.turns[1:]}
    assert set(spans) == {"search", "answer"}
    assert not any(answered[j] for j in range(*spans["search"])) and any(dec[j] for j in range(*spans["search"]))
    assert [answered[j] for j in range(*spans["answer"])] == [2.0 * dec[j] for j in range(*spans["answer"])]
    assert sum(answered) > 0 and not any(a and b for a, b in zip(answered, q))
    with pytest.raises(ValueError, match="distill_on"):
        T.distill_weights(d, tok, "tokens")


def test_weighted_reduction_is_the_weighted_mean_and_exact_on_binary_masks():
    torch.manual_seed(0)
    v = torch.randn(3, 5)
    m = (torch.rand(3, 5) > 0.4).float()
    for mode in L.AGGREGATIONS:  # 0/1 mask: exactly the unweighted reduction (loss * 1 is loss)
        ref = L.AGGREGATIONS[mode](torch.where(m.bool(), v, torch.zeros_like(v)), m)
        assert torch.equal(L.agg(v, m, mode), ref)
    w = m * torch.tensor([1.0, 4.0, 1.0, 4.0, 1.0])
    assert L.agg(v, w, "token-mean").item() == pytest.approx(float((v * w).sum() / w.sum()), rel=1e-6)
    assert L.micro_batch_weight(w[:1], w, "token-mean") == pytest.approx(float(w[0].sum() / w.sum()))


# ------------------------------------------------------------------ the shuffled-critique control
def test_shuffled_control_shows_another_questions_critique(world, tok):
    from types import SimpleNamespace

    cfg = resolve_methods(Config.load(None, ['hindsearch.critique_source="shuffled"', 'hindsearch.judge_kind="oracle"']))
    term = HindSearchTerm(cfg.hindsearch)
    trs = [SimpleNamespace(qid=q) for q in ("a", "a", "b")]
    texts = {0: "crit a0", 1: "crit a1", 2: "crit b"}
    met, samples = {"shuffle_missing": 0.0}, [{} for _ in trs]
    kept, shown = term._shuffle(trs, [0, 1, 2], texts, step=0, met=met, samples=samples)
    assert kept == [0, 1, 2] and shown[0] == shown[1] == "crit b" and shown[2] in ("crit a0", "crit a1")
    assert samples[2]["critique_shown"] == shown[2]
    # one question alone in a fresh term: nothing of another question to show, the rows are dropped and counted
    lone = HindSearchTerm(cfg.hindsearch)
    met = {"shuffle_missing": 0.0}
    kept, _ = lone._shuffle(trs[:2], [0, 1], texts, step=0, met=met, samples=[{}, {}])
    assert kept == [] and met["shuffle_missing"] == 2.0
    # ... but a later step draws from the earlier steps' critiques
    kept, shown = lone._shuffle([SimpleNamespace(qid="c")], [0], {0: "crit c"}, step=1, met=met, samples=[{}])
    assert kept == [0] and shown[0] in ("crit a0", "crit a1")


# ------------------------------------------------------------------ one step moves the decision toward the teacher
def test_one_step_of_the_decision_term_moves_the_student_toward_the_teachers_token(world, tok):
    """A constructed case: at the decision tokens of a failed rollout the teacher puts its top-k mass on
    ``<search>``; one SGD step of ``L_hind`` (reverse KL, top-k + tail) raises the student's probability of
    ``<search>`` there and lowers the KL."""
    d = _demos(world, tok)[0]  # search, search again, answer: two decisions
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    cfg = resolve_methods(Config.load(None, ['hindsearch.divergence="reverse_kl"', 'hindsearch.distill_on="decision"', "hindsearch.topk=4"]))
    term = HindSearchTerm(cfg.hindsearch)
    w = torch.tensor(T.distill_weights(d, tok, "decision"))
    n = len(d.completion_ids)
    pos = w.nonzero().flatten()
    assert len(pos) >= 2
    search_id = tok.convert_tokens_to_ids("<search>")
    k = 4
    ids = torch.zeros(1, n, k, dtype=torch.long)
    logp = torch.full((1, n, k), -30.0)
    ids[0, :, 0] = search_id
    logp[0, :, 0] = 0.0  # the teacher: <search> with probability ~1 at every decision token
    ids[0, :, 1:] = torch.arange(1, k).view(1, k - 1)
    inputs = {"hind_mask": w.view(1, n), "hind_lT": torch.zeros(1, n), "hind_topk_ids": ids, "hind_topk_logp": logp}
    full = torch.tensor([d.prompt_ids + d.completion_ids])
    comp = torch.tensor([d.completion_ids])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def step_values():
        logits = model(input_ids=full).logits[:, len(d.prompt_ids) - 1 : -1]  # [1, n, V]
        p = torch.softmax(logits[0, pos].float(), -1)[:, search_id]
        loss, _ = loss_from_full_logits(term, logits, comp, inputs)
        return loss, p

    loss0, p0 = step_values()
    opt.zero_grad()
    loss0.backward()
    opt.step()
    with torch.no_grad():
        loss1, p1 = step_values()
    assert float(loss1) < float(loss0)
    assert bool((p1 > p0).all()), (p0, p1)


# ------------------------------------------------------------------ GRPO's loss scale and the weighted term through the trainer
def test_grpo_scale_zero_leaves_the_policy_to_the_hindsight_term(world, tok, tmp_path):
    """``train.grpo_scale = 0``: a GRPO run's weights do not move (SGD, no weight decay), a HindSearch run's
    do, through the decision term alone; the metrics still log GRPO's rewards."""
    w, retriever = world
    base = OVERRIDES + TWO_TURNS + ["train.steps=1", "train.kl_coef=0.0", "train.grpo_scale=0.0", "train.lr=0.5",
                                    'train.trl.optim="sgd"', 'hindsearch.judge_kind="oracle"', "hindsearch.lam=5.0",
                                    'hindsearch.distill_on="decision"', "train.grad_share_steps=1",
                                    'hindsearch.divergence="reverse_kl"', "hindsearch.topk=8"]
    moved = {}
    for method in ("grpo", "hindsearch"):
        cfg = resolve_methods(Config.load(None, base + [f'method="{method}"']))
        trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:2], tmp_path / method)
        before = [p.detach().clone() for p in model.parameters()]
        trainer.train()
        moved[method] = float(sum((p.detach() - b).abs().sum() for p, b in zip(model.parameters(), before)))
        row = json.loads((tmp_path / method / "metrics.jsonl").read_text().splitlines()[0])
        assert "reward" in row or any(k.startswith("rewards/") for k in row), row
        if method == "hindsearch":
            assert row["hind/distill_tokens"] > 0 and row["hind/action_tokens"] == row["hind/distill_tokens"]
            assert "hind/grad_share" not in row  # no GRPO gradient to compare with
    assert moved["grpo"] == 0.0
    assert moved["hindsearch"] > 0.0


def test_micro_batches_keep_the_weighted_terms_weight(world, tok, tmp_path):
    """With ``action_weight`` the micro-batches count weights, not tokens: one SGD step with micro-batches of one
    rollout equals the whole-batch step (as ``test_micro_batches_do_not_change_the_hindsight_weight`` for 0/1)."""
    w, retriever = world
    base = OVERRIDES + TWO_TURNS + ['method="hindsearch"', "train.steps=1", "train.kl_coef=0.0",
                                    'hindsearch.judge_kind="oracle"', "hindsearch.lam=5.0", "train.lr=0.5",
                                    'train.trl.optim="sgd"', "train.grad_share_steps=0",
                                    'hindsearch.distill_on="action"', "hindsearch.action_weight=4.0",
                                    'hindsearch.divergence="reverse_kl"', "hindsearch.topk=8"]
    deltas = {}
    for mb in ("none", "1"):
        cfg = resolve_methods(Config.load(None, base + ([] if mb == "none" else [f"train.micro_batch_size={mb}"])))
        trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:2], tmp_path / f"mb-{mb}")
        before = [p.detach().clone() for p in model.parameters()]
        trainer.train()
        deltas[mb] = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
        row = json.loads((tmp_path / f"mb-{mb}" / "metrics.jsonl").read_text().splitlines()[0])
        assert row["hind/loss"] != 0.0 and row["hind/distill_tokens"] > row["hind/action_tokens"] > 0, row
    full, micro = deltas["none"], deltas["1"]
    assert full.norm() > 0
    assert (micro - full).norm() / full.norm() < 1e-4, float((micro - full).norm() / full.norm())


def test_micro_batch_share_counts_weights_not_tokens():
    """Rows of different composition: a micro-batch's share of a weighted term is its share of the weight (6/10),
    not of the tokens (3/4); a term without ``unit_weights`` still counts its positions."""
    from types import SimpleNamespace

    from hindsearch.train.trainer import _units

    cfg = resolve_methods(Config.load(None, ['hindsearch.distill_on="action"', "hindsearch.action_weight=4.0"]))
    term = HindSearchTerm(cfg.hindsearch)
    inputs = {"hind_mask": torch.tensor([[1.0, 1.0, 4.0], [4.0, 0.0, 0.0]])}
    units = _units(term, inputs, 3)
    assert L.micro_batch_weight(units[:1], units, "token-mean") == pytest.approx(0.6)
    plain = SimpleNamespace(positions=lambda x, C: x["hind_mask"] > 0)
    assert L.micro_batch_weight(_units(plain, inputs, 3)[:1], _units(plain, inputs, 3), "token-mean") == pytest.approx(0.75)


def test_held_out_states_round_trip_and_measures(world, tok, one_thread):
    """The start's two-hop failures cut after their first information block, saved and read back, and the per-state
    measures of a scripted engine that always searches ``weather``: it searches again from every state (sampled and
    greedy), and that query never retrieves the missed evidence."""
    from test_mechanism import HintReader

    from hindsearch.study.probe import HeldOutStates, held_out_states, state_measures, summarize_states

    w, retriever = world
    cfg = resolve_methods(Config.load(None, ['model.name="tiny-random"', "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=24",
                             "rollout.max_total_tokens=2048"]))
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1).eval()
    eng = HintReader(model, tok, retriever, cfg.rollout)
    recs = w.splits["train"] + w.splits["dev"] + w.splits["test"]
    with torch.no_grad():
        st = held_out_states(eng, recs, n=4)  # the small world has 3 two-hop test questions
        assert len(st.records) == 4 and all(r.hops == 2 for r in st.records)
        assert all(p == list(f.completion_ids[: len(p)]) for p, f in zip(st.prefixes, st.failed))
        back = HeldOutStates.from_dict(json.loads(json.dumps(st.to_dict())), recs)
        assert [r.id for r in back.records] == [r.id for r in st.records] and back.prefixes == st.prefixes
        rows = state_measures(eng, back, samples=2, seed=0)
    assert len(rows) == 4
    s = summarize_states(rows)
    assert s["p_search"] == 1.0 and s["search_again"] == 1.0 and s["hit_missed"] == 0.0 and s["em"] == 0.0
    with pytest.raises(ValueError, match="not in the test split"):
        HeldOutStates.from_dict(st.to_dict(), recs[:0])


def test_sampled_rows_roll_out_a_few_questions_at_a_time(world, tok, one_thread):
    """K samples of every test question, rolled out ``batch`` questions per call (all 600 x 4 at once were killed
    for memory): one row per question, each call at most batch x K rows, the same rows for any batch size's
    bookkeeping (ids, k, hop counts)."""
    from test_mechanism import HintReader

    from hindsearch.study.sampled import sampled_rows

    w, retriever = world
    cfg = resolve_methods(Config.load(None, ['model.name="tiny-random"', "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=8"]))
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1).eval()
    eng = HintReader(model, tok, retriever, cfg.rollout)
    calls: list[int] = []
    real = eng.rollout

    def counted(records, **kw):
        calls.append(len(records) * kw.get("num_generations", 1))
        return real(records, **kw)

    eng.rollout = counted
    recs = w.splits["test"][:5]
    with torch.no_grad():
        rows = sampled_rows(eng, recs, k=3, seed=0, batch=2)
    assert calls == [6, 6, 3]  # 2 + 2 + 1 questions, 3 samples each
    assert [r["id"] for r in rows] == [r.id for r in recs] and all(r["k"] == 3 for r in rows)
    assert all(0.0 <= r["em"] <= r["pass_k"] <= 1.0 for r in rows)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        sampled_rows(eng, recs, k=3, seed=0, batch=0)


# ------------------------------------------------------------------ sampled behaviour in compare's tables
def _fake_run(d, em2, p_search, seeds_done=True):
    from hindsearch.records import Trajectory
    from hindsearch.study.sampled import SAMPLED_FILE, STATES_FILE, write_rows

    d.mkdir(parents=True)
    if seeds_done:
        (d / "done.json").write_text("{}")
    write_rows(d / SAMPLED_FILE, [{"id": f"q{i}", "hops": 2.0, "em": em2[i], "pass_k": float(em2[i] > 0), "recall": 0.5,
                                   "k": 4} for i in range(len(em2))] + [{"id": "one", "hops": 1.0, "em": 1.0, "pass_k": 1.0,
                                                                         "recall": 1.0, "k": 4}])
    write_rows(d / STATES_FILE, [{"id": f"{i}:q{i}", "p_search": p, "search_again": float(p > 0.5), "hit_missed": 0.0,
                                  "em": 0.0} for i, p in enumerate(p_search)])
    g = d / "eval" / "test-world"
    g.mkdir(parents=True)
    g.joinpath("trajectories.jsonl").write_text("".join(
        json.dumps(Trajectory(qid=f"q{i}", question="x", golden_answers=["a"], prompt_ids=[], hops=2, reward=float(e > 0.5)).to_dict()) + "\n"
        for i, e in enumerate(em2)))


def test_sampled_tables_pair_each_method_with_grpo_and_its_controls(tmp_path):
    from hindsearch.study.paired import comparison_pairs, pair_rows, pairs_markdown
    from hindsearch.study.sampled import summary, summary_markdown

    methods = ["grpo", "hindsearch", "hindsearch-nogold", "hindsearch-shuffled", "igsd", "igsd-nogate"]
    assert comparison_pairs(methods) == [(m, "grpo") for m in methods[1:]] + [
        ("hindsearch", "hindsearch-nogold"), ("hindsearch", "hindsearch-shuffled"), ("igsd", "igsd-nogate")]
    n = 20
    for s in (0, 1):
        _fake_run(tmp_path / f"grpo-s{s}", [0.25] * n, [0.2] * n)
        _fake_run(tmp_path / f"hindsearch-s{s}", [0.5] * n, [0.6] * n)
        _fake_run(tmp_path / f"hindsearch-nogold-s{s}", [0.25] * n, [0.2] * n)
    rd = lambda m, s: tmp_path / f"{m}-s{s}"  # noqa: E731
    rows = {(r["method"], r["against"]): r for r in pair_rows(rd, methods[:3], [0, 1])}
    r = rows[("hindsearch", "grpo")]
    assert r["seeds"] == 2
    assert r["sampled EM 2-hop"][:3] == pytest.approx((0.25, 0.25, 0.25)) and r["sampled EM 2-hop"][3] == n  # 2-hop only
    assert r["P(search again), held-out states"][0] == pytest.approx(0.4)
    assert rows[("hindsearch", "hindsearch-nogold")]["pass@k 2-hop"][0] == pytest.approx(0.0)
    assert rows[("hindsearch-nogold", "grpo")]["P(search again), held-out states"][:3] == pytest.approx((0.0, 0.0, 0.0))
    md = pairs_markdown(rd, methods[:3], [0, 1])
    assert "| hindsearch | hindsearch-nogold | 2 |" in md and "+40.0 [+40.0, +40.0] (n=20)" in md
    assert summary(rd("hindsearch", 0))["sampled_em_2hop"] == pytest.approx(0.5)
    assert summary(rd("hindsearch", 0))["sampled_em"] == pytest.approx((0.5 * n + 1) / (n + 1))
    sm = summary_markdown(rd, methods[:3], [0, 1])
    assert "4 samples per question" in sm and "| hindsearch | 2 | " in sm
    assert pairs_markdown(rd, ["grpo"], [0, 1]) == ""


def _greedy_evals(d, final, at, steps=200):
    """A run folder's greedy world evaluations: the final one (``results.json`` names its step) and ``{step: ems}``."""
    from hindsearch.records import Trajectory

    d.mkdir(parents=True, exist_ok=True)
    (d / "done.json").write_text("{}")
    (d / "results.json").write_text(json.dumps({"steps": steps}))
    for tag, ems in [("", final)] + [(f"-step-{n}", e) for n, e in at.items()]:
        g = d / "eval" / f"test-world{tag}"
        g.mkdir(parents=True)
        g.joinpath("trajectories.jsonl").write_text("".join(
            json.dumps(Trajectory(qid=f"q{i}", question="x", golden_answers=["a"], prompt_ids=[], hops=1 + i % 2,
                                  em=e).to_dict()) + "\n" for i, e in enumerate(ems)))


def test_paired_differences_along_the_way_and_seed_by_seed(tmp_path):
    from hindsearch.study.paired import (curve_pair_rows, curve_pairs_markdown, evaluated_steps, pair_rows,
                                         seeds_markdown)
    from hindsearch.study.paired import SEED_METRICS

    n = 20  # questions q0..q19: the odd ones are two-hop
    zeros, ones = [0.0] * n, [1.0] * n
    half = [float(i < n // 2) for i in range(n)]  # q0..q9 right
    for s in (0, 1):
        _greedy_evals(tmp_path / f"grpo-s{s}", zeros, {10: zeros, 50: zeros})
    _greedy_evals(tmp_path / "hindsearch-s0", half, {10: zeros, 50: ones})
    _greedy_evals(tmp_path / "hindsearch-s1", ones, {10: ones})  # no step-50 evaluation in seed 1
    rd = lambda m, s: tmp_path / f"{m}-s{s}"  # noqa: E731
    assert evaluated_steps(rd("hindsearch", 1)) == {10: "-step-10", 200: ""}
    assert evaluated_steps(tmp_path / "missing") == {}

    rows = {r["step"]: r for r in curve_pair_rows(rd, ["grpo", "hindsearch"], [0, 1])}
    assert sorted(rows) == [10, 50, 200]
    assert rows[10]["seeds"] == 2 and rows[10]["EM"][0] == pytest.approx(0.5)       # seed 0: 0, seed 1: 1
    assert rows[50]["seeds"] == 1 and rows[50]["EM 2-hop"][:3] == pytest.approx((1.0, 1.0, 1.0))
    assert rows[200]["EM"][0] == pytest.approx(0.75) and rows[200]["EM"][3] == n   # per question, the seeds' mean
    assert rows[200]["EM 2-hop"][0] == pytest.approx(0.5 * (0.5 + 1.0)) and rows[200]["EM 2-hop"][3] == n // 2
    md = curve_pairs_markdown(rd, ["grpo", "hindsearch"], [0, 1])
    assert "| step 10 | step 50 | step 200 |" in md and "+100.0 [+100.0, +100.0] (1 seeds)" in md

    by_seed = {r["seed"]: r for r in pair_rows(rd, ["grpo", "hindsearch"], [0, 1], metrics=SEED_METRICS, per_seed=True)}
    assert by_seed[0]["greedy EM"][0] == pytest.approx(0.5) and by_seed[1]["greedy EM"][:3] == pytest.approx((1, 1, 1))
    assert by_seed[0]["greedy EM 2-hop"][0] == pytest.approx(0.5)  # q1, q3, ..., q9: 5 of the 10 two-hop ones
    md = seeds_markdown(rd, ["grpo", "hindsearch"], [0, 1])
    assert "| metric | seed 0 | seed 1 |" in md and "| hindsearch | grpo | greedy EM | +50.0 [" in md
    assert seeds_markdown(rd, ["grpo", "hindsearch"], [0]) == ""  # one seed: the pooled tables say it all
    assert curve_pairs_markdown(rd, ["grpo"], [0, 1]) == ""


def test_a_step_is_read_from_each_runs_own_evaluation(tmp_path):
    """Step 100 is a 100-step run's final evaluation and a 200-step run's '-step-100' one: a seed extended with
    shorter runs pools each run's own step 100, never another run's final (step 200) evaluation."""
    from hindsearch.study.paired import curve_pair_rows

    n = 20
    zeros, ones = [0.0] * n, [1.0] * n
    _greedy_evals(tmp_path / "grpo-s1", ones, {100: zeros})                  # 200 steps: wrong at 100, right at 200
    _greedy_evals(tmp_path / "hindsearch-s1", zeros, {100: ones})
    _greedy_evals(tmp_path / "grpo-s0", zeros, {}, steps=100)                # 100 steps: final = step 100
    _greedy_evals(tmp_path / "hindsearch-s0", ones, {}, steps=100)
    rd = lambda m, s: tmp_path / f"{m}-s{s}"  # noqa: E731
    rows = {r["step"]: r for r in curve_pair_rows(rd, ["grpo", "hindsearch"], [0, 1])}
    assert rows[100]["seeds"] == 2 and rows[100]["EM"][:3] == pytest.approx((1.0, 1.0, 1.0))
    assert rows[200]["seeds"] == 1 and rows[200]["EM"][0] == pytest.approx(-1.0)


def test_weights_digest_pins_the_weights_not_the_files(tok, tmp_path):
    from hindsearch.models import weights_digest

    a = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    a.save_pretrained(tmp_path / "a")
    a.save_pretrained(tmp_path / "b", max_shard_size="50KB")  # the same weights in several files
    assert len(list((tmp_path / "b").glob("*.safetensors"))) > 1
    assert weights_digest(tmp_path / "a") == weights_digest(tmp_path / "b")
    with torch.no_grad():
        next(a.parameters()).view(-1)[0] += 1e-3
    a.save_pretrained(tmp_path / "c")
    assert weights_digest(tmp_path / "c") != weights_digest(tmp_path / "a")
    assert weights_digest(tmp_path / "none") is None


def test_igsd_gate_precision_counts():
    """Verified pairs by the sign of delta, and how many of their teacher queries retrieved the question's evidence."""
    from types import SimpleNamespace

    from hindsearch.hindsight.igsd import gate_precision_counts
    from hindsearch.hindsight.igsd import METRIC_KEYS, Pair
    from hindsearch.records import Passage

    trajs = [SimpleNamespace(evidence=["Alpha"]), SimpleNamespace(evidence=["Beta"])]
    doc = lambda t: Passage(id=t, contents=f'"{t}"\ntext')  # noqa: E731

    def pair(row, delta, title):
        p = Pair(row=row, t=0, a=1, b=2, p_T=(0.5, 0.5), q_start=0, delta=delta)
        p.docs = {"T": [doc(title)], "S": []}
        return p

    m = dict.fromkeys(METRIC_KEYS, 0.0)
    gate_precision_counts([pair(0, 0.3, "Alpha"), pair(1, 0.1, "Gamma"), pair(1, -0.2, "Beta"), pair(0, 0.0, "Zeta")], trajs, m)
    assert (m["delta_pos_pairs"], m["delta_pos_teacher_hits"]) == (2.0, 1.0)
    assert (m["delta_nonpos_pairs"], m["delta_nonpos_teacher_hits"]) == (2.0, 1.0)


def test_keep_steps_saves_the_weights_of_those_steps(world, tok, tmp_path):
    """``train.keep_steps = [1]`` with 2 steps and ``save_total_limit = 1``: ``RUN/steps/step-1`` holds the step-1
    weights (loadable, different from the final ones) though checkpoint-1 itself was rotated away."""
    from hindsearch.models import weights_digest

    w, retriever = world
    cfg = resolve_methods(Config.load(None, OVERRIDES + ["train.kl_coef=0.0", "train.keep_steps=[1]", "train.trl.save_total_limit=1"]))
    trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:4], tmp_path / "run")
    trainer.train()
    kept = tmp_path / "run" / "steps" / "step-1"
    assert (kept / "config.json").exists() and (kept / "tokenizer_config.json").exists()
    assert not (tmp_path / "run" / "steps" / "step-2").exists()
    assert not (tmp_path / "run" / "checkpoints" / "checkpoint-1").exists()
    final = tmp_path / "final"
    trainer.save_model(str(final))
    assert weights_digest(kept) != weights_digest(final)
    with pytest.raises(ValueError, match="keep_steps"):
        make_trainer(resolve_methods(Config.load(None, OVERRIDES + ["train.keep_steps=[0]"])), tok, retriever, w.splits["train"][:4],
                     tmp_path / "bad")


def test_torch_threads_sets_and_restores_the_count():
    from hindsearch.models import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
