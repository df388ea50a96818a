"""The terms are assembled, not self-loading: a judge on ``hindsearch.judge_model`` is injected by the caller."""

from __future__ import annotations

import pytest

from hindsearch.config import Config
from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight.judge import OracleJudge
from hindsearch.hindsight.terms import HindSearchTerm, make_judge, make_terms


def ctx() -> AuxContext:
    return AuxContext(policy=None, frozen=None, tokenizer=None, retriever=None, rollout_engine=None, config=None)


def test_a_term_never_loads_the_judge_model():
    cfg = Config.load(None, ['method="hindsearch"', 'hindsearch.judge_model="some/judge"'])
    term = make_terms(cfg)[0]
    with pytest.raises(RuntimeError, match="loaded where the run is assembled"):
        term.judge(ctx())
    injected = OracleJudge(True, cfg.hindsearch.judge_template)
    term = make_terms(cfg, judge=injected)[0]
    assert isinstance(term, HindSearchTerm) and term.judge(ctx()) is injected


def test_default_judges_come_from_the_config_and_context():
    cfg = Config.load(None, ['method="hindsearch+igsd"', 'hindsearch.judge_kind="oracle"'])
    terms = make_terms(cfg)
    assert [t.name for t in terms] == ["hind", "igsd"]
    assert terms[0].judge(ctx()).kind == "oracle"
    lm = make_judge(Config.load(None, []).hindsearch, model="M", tokenizer="T")
    assert lm.kind == "lm"


def test_run_assembly_loads_the_judge_model_once():
    """``train.run.build_judge`` loads ``hindsearch.judge_model`` (here the tiny random model) for the term."""
    from hindsearch.train.run import build_judge, make_terms as run_terms

    cfg = Config.load(None, ['method="hindsearch"', 'hindsearch.judge_model="tiny-random"', 'model.device="cpu"'])
    judge = build_judge(cfg)
    assert judge.kind == "lm" and not judge.model.training
    assert run_terms(cfg, judge=judge)[0].judge(ctx()) is judge
    assert build_judge(Config.load(None, ['method="igsd"', 'hindsearch.judge_model="tiny-random"'])) is None
    assert build_judge(Config.load(None, ['method="hindsearch"'])) is None  # the frozen policy: built from the context
