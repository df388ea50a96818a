"""The terms are registered and assembled, not self-loading: each method's options, its term and its metric
declarations come from the method registry, and a judge on ``hindsearch.judge_model`` is loaded where the run is
assembled (``HindSearchTerm.load_models``), never in ``prepare``."""

from __future__ import annotations

import pytest

from hindsearch.config import Config, ConfigError
from hindsearch.hindsight.contract import AuxContext
from hindsearch.hindsight.judge import OracleJudge
from hindsearch.hindsight.methods.hindsearch import HindSearchTerm, make_judge
from hindsearch.hindsight.methods.igsd import IGSDTerm
from hindsearch.hindsight.registry import METHODS, make_terms, method, reduction_of, resolve_methods


def ctx() -> AuxContext:
    return AuxContext(policy=None, frozen=None, tokenizer=None, retriever=None)


def test_a_term_never_loads_the_judge_model():
    cfg = resolve_methods(Config.load(None, ['method="hindsearch"', 'hindsearch.judge_model="some/judge"']))
    term = make_terms(cfg)[0]
    with pytest.raises(RuntimeError, match="loaded where the run is assembled"):
        term.judge(ctx())
    injected = OracleJudge(True, cfg.hindsearch.judge_template)
    term = HindSearchTerm(cfg.hindsearch, judge=injected)
    assert term.judge(ctx()) is injected


def test_default_judges_come_from_the_config_and_context():
    cfg = resolve_methods(Config.load(None, ['method="hindsearch+igsd"', 'hindsearch.judge_kind="oracle"']))
    terms = make_terms(cfg)
    assert [t.name for t in terms] == ["hind", "igsd"]
    assert terms[0].judge(ctx()).kind == "oracle"
    lm = make_judge(resolve_methods(Config.load(None, [])).hindsearch, model="M", tokenizer="T")
    assert lm.kind == "lm"


def test_run_assembly_loads_the_judge_model_once():
    """``load_models`` (called by ``train.run.build_trainer``) loads ``hindsearch.judge_model`` (here the tiny random
    model) for the term; without a judge model the judge is built from the context."""
    cfg = resolve_methods(Config.load(None, ['method="hindsearch"', 'hindsearch.judge_model="tiny-random"', 'model.device="cpu"']))
    term = make_terms(cfg)[0]
    term.load_models(cfg.model)
    judge = term.judge(ctx())
    assert judge.kind == "lm" and not judge.model.training
    term.load_models(cfg.model)
    assert term.judge(ctx()) is judge  # once
    plain = make_terms(resolve_methods(Config.load(None, ['method="hindsearch"', 'hindsearch.judge_kind="oracle"'])))[0]
    plain.load_models(cfg.model)
    assert plain._judge is None  # the oracle is built from the context, no model loaded


def test_methods_come_from_the_registry_and_compose():
    names = list(METHODS)  # a plugin another test imported may follow the built-ins
    assert names[:3] == ["grpo", "hindsearch", "igsd"] and "hindsearch+igsd" in names
    assert "igsd+hindsearch" in METHODS and "grpo+igsd" not in METHODS and "hindsearch+hindsearch" not in METHODS
    assert [t.name for t in make_terms(resolve_methods(Config.load(None, ['method="igsd+hindsearch"'])))] == ["igsd", "hind"]
    assert method("grpo").term is None and method("hindsearch").term is HindSearchTerm
    with pytest.raises(ConfigError, match="method = .ppo. is not allowed; choose one of grpo, hindsearch, igsd"):
        resolve_methods(Config.load(None, ['method="ppo"']))
    cfg = resolve_methods(Config.load(None, []))
    assert list(cfg.sections)[:2] == ["hindsearch", "igsd"]  # the [hindsearch] and [igsd] tables, from the registry
    keys = list(cfg.to_dict())
    assert keys[keys.index("train") + 1:][:2] == ["hindsearch", "igsd"] and keys[-1] == "eval"


def test_every_method_has_its_own_ema_decay():
    """IGSD's EMA teacher has its own decay (``igsd.ema_decay``, the same default); a term without an EMA teacher
    asks for none."""
    cfg = resolve_methods(Config.load(None, ['method="hindsearch+igsd"', 'hindsearch.teacher="ema"', 'igsd.teacher="ema"',
                             "hindsearch.ema_decay=0.9"]))
    hind, igsd = make_terms(cfg)
    assert (hind.ema_decay, igsd.ema_decay) == (0.9, 0.99)
    assert [t.ema_decay for t in make_terms(resolve_methods(Config.load(None, ['method="hindsearch+igsd"'])))] == [None, None]


def test_metric_reductions_are_declared_not_guessed():
    """Counts and seconds of a rank's rows add up over processes; rates, means and losses average; a key a term
    does not declare is an error (tests/test_multiprocess.py checks hind/failed = 1 + 0 on two processes)."""
    hind, igsd = HindSearchTerm, IGSDTerm
    for term, key in ((hind, "failed"), (hind, "critiques"), (hind, "judge_time"), (igsd, "time_proposal"),
                      (igsd, "positions_selected"), (igsd, "cache_hits")):
        assert reduction_of(term, key) == "sum", key
    for term, key in ((hind, "failed_frac"), (hind, "critique_minus_neutral"), (hind, "judge_kind_oracle"),
                      (hind, "L_hind"), (hind, "tokens"), (igsd, "mean_gate"), (igsd, "cache_hit_rate"),
                      (igsd, "positions")):
        assert reduction_of(term, key) == "mean", key
    with pytest.raises(KeyError, match="without declaring its reduction"):
        reduction_of(hind, "kl")
