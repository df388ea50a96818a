"""Presets and config validation: every shipped preset loads; bad values fail before any model loads,
naming the key and the allowed values; the `train` CLI finds presets by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hindsearch import cli
from hindsearch.config import Config, ConfigError
from hindsearch.train.cli import find_config
from hindsearch.train.grpo_config import grpo_args
from hindsearch.train.dev_eval import format_table, summary_row
from hindsearch.train.run import preflight, truncate_jsonl

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = sorted(CONFIGS.glob("*.toml"))


@pytest.fixture
def no_models(monkeypatch):
    """Any model load fails the test: validation must happen first."""
    import hindsearch.models as models

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the config was validated")

    monkeypatch.setattr(models, "load_policy", boom)
    monkeypatch.setattr(models, "load_tokenizer", boom)


def test_presets_exist_and_load():
    names = {p.stem for p in PRESETS}
    for want in ("tiny-cpu", "tiny-cpu-hindsearch", "tiny-cpu-igsd", "qwen2.5-3b-instruct-grpo", "qwen2.5-7b-instruct-grpo",
                 "qwen2.5-3b-instruct-hindsearch", "qwen2.5-3b-instruct-hindsearch-nogold", "qwen2.5-3b-instruct-igsd",
                 "qwen2.5-7b-instruct-igsd"):
        assert want in names
    for p in PRESETS:
        cfg = Config.load(p)
        assert cfg.rollout.num_generations >= 2
    assert Config.load(CONFIGS / "qwen2.5-3b-instruct-hindsearch-nogold.toml").hindsearch.judge_sees_gold is False
    paper = Config.load(CONFIGS / "qwen2.5-3b-instruct-grpo.toml")
    assert (paper.rollout.num_generations, paper.train.lr, paper.train.kl_coef, paper.rollout.max_turns) == (5, 1e-6, 0.001, 4)
    assert paper.retrieval.topk == 3 and paper.rollout.backend == "vllm"
    assert (CONFIGS / "accelerate" / "zero3.yaml").exists() and (CONFIGS / "accelerate" / "fsdp.yaml").exists()


def test_default_preset_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repo: found relative to the package checkout
    assert find_config(None).name == "tiny-cpu.toml"
    assert find_config("tiny-cpu-igsd").name == "tiny-cpu-igsd.toml"
    with pytest.raises(FileNotFoundError, match="presets: .*tiny-cpu"):
        find_config("no-such-preset")


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.loss_type=\"ppo\"", "train.loss_type = 'ppo' is not allowed; choose one of grpo, dr_grpo, dapo, bnpo"),
        ("method=\"sft\"", "method = 'sft' is not allowed; choose one of grpo, hindsearch, igsd, hindsearch+igsd"),
        ("rollout.backend=\"tgi\"", "rollout.backend = 'tgi' is not allowed; choose one of hf, vllm"),
        ("igsd.gate=\"soft\"", "igsd.gate"),
        ("rollout.num_generations=1", "rollout.num_generations must be >= 2"),
        ("train.lr=-1", "train.lr must be > 0"),
        ("train.stepz=3", "unknown key train.stepz"),
        ("rollout.max_turns=\"four\"", "rollout.max_turns must be int"),
        ("data.max_train_questions=\"abc\"", "data.max_train_questions must be int"),
        ("data.max_train_questions=0", "data.max_train_questions must be > 0"),
        ("eval.limit=1.5", "eval.limit must be int"),
        ("model.lora.dropout=1.0", "model.lora.dropout must be >= 0.0 and < 1.0, got 1.0"),
        ("warmup.feedback_kinds=[\"critique\", \"gold\"]", "choose each from critique, oracle_gold"),
        ("train.kl_coef=-0.1", "train.kl_coef must be >= 0"),
        ("igsd.gate_sharpness=0", "igsd.gate_sharpness must be > 0"),
    ],
)
def test_bad_values_fail_before_any_model_loads(override, needle, no_models, capsys):
    rc = cli.main(["train", "--set", override])
    assert rc == 1
    err = capsys.readouterr().err
    assert needle in err, err


def test_missing_files_are_named_before_any_model_loads(no_models, capsys):
    rc = cli.main(["train", "--config", str(CONFIGS / "qwen2.5-3b-instruct-grpo.toml")])
    assert rc == 1
    assert "data.train = 'FILL_ME/nq_hotpotqa_train/train.parquet': file not found" in capsys.readouterr().err
    cfg = Config.load(CONFIGS / "tiny-cpu.toml", ['retrieval.index_dir="/nonexistent/index"'])
    with pytest.raises(ConfigError, match="retrieval.index_dir"):
        preflight(cfg)


def test_resume_rejects_overrides_and_non_run_dirs(tmp_path, no_models, capsys):
    assert cli.main(["train", "--resume", str(tmp_path), "--set", "train.steps=3"]) == 1
    assert "--resume uses the run's saved config.toml" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(tmp_path)]) == 1
    assert "no config.toml there" in capsys.readouterr().err


def test_grpo_args_mapping():
    cfg = Config.load(CONFIGS / "tiny-cpu.toml", ["train.steps=7", "train.kl_coef=0.01", 'train.loss_type="dapo"'])
    a = grpo_args(cfg, "/tmp/x")
    g = cfg.rollout.num_generations
    assert a.per_device_train_batch_size * a.gradient_accumulation_steps == cfg.train.questions_per_step * g
    assert (a.num_generations, a.max_steps, a.beta, a.loss_type) == (g, 7, 0.01, "dapo")
    assert a.learning_rate == cfg.train.lr and a.max_completion_length == cfg.rollout.max_total_tokens
    with pytest.raises(ConfigError, match="divisible by the number of processes"):
        grpo_args(Config.load(None, ["train.questions_per_step=3", "rollout.num_generations=3"]), "/tmp/x", 2)


def test_summary_table_and_truncate(tmp_path):
    res = {"benchmarks": {"dev": {"n": 4, "em": 0.5, "em_by_hops": {"1": 0.75, "2": 0.25},
                                  "searches_per_question": 1.25, "validity_rate": 1.0}}}
    row = summary_row(res)
    assert row == {"em": 0.5, "em_1hop": 0.75, "em_2hop": 0.25, "searches": 1.25, "validity": 1.0, "n": 4,
                   "multi_1hop": None}
    table = format_table({"base": row, "rl": row})
    assert "base model" in table and "after RL" in table and "after warm-up" not in table and "75.0" in table
    p = tmp_path / "m.jsonl"
    p.write_text("".join(f'{{"step": {i}}}\n' for i in range(1, 6)))
    assert truncate_jsonl(p, 3) == 2
    assert [line for line in p.read_text().splitlines()] == ['{"step": 1}', '{"step": 2}', '{"step": 3}']


def test_choices_are_declared_once_and_read_by_code():
    """Validation and the loss registries read the same names (field metadata); every declared name is registered."""
    from hindsearch.config import choices_of
    from hindsearch.hindsight import losses
    from hindsearch.hindsight.methods.hindsearch import HindSearchConfig
    from hindsearch.hindsight.methods.igsd import IGSDConfig

    assert losses.AGG_MODES == choices_of(HindSearchConfig, "aggregation") == choices_of(IGSDConfig, "aggregation")
    assert losses.GATES == choices_of(IGSDConfig, "gate")
    assert set(losses.AGGREGATIONS) == set(losses.AGG_MODES)
    assert set(losses.GATE_FNS) == set(losses.GATES)
    assert set(losses.DIVERGENCES) == set(choices_of(HindSearchConfig, "divergence"))
    for mode in losses.AGG_MODES:  # every declared value is one the code accepts
        losses.agg(torch.ones(2, 3), torch.ones(2, 3), mode)
    for kind in losses.GATES:
        losses.gate(torch.tensor([0.5]), kind)
    with pytest.raises(ValueError, match="not one of token-mean"):
        losses.agg(torch.ones(2, 3), torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match="divergence 'kl' is not one of clamped_sampled"):
        losses.divergence("kl")
    with pytest.raises(KeyError):
        choices_of(IGSDConfig, "lam")


def test_a_registered_divergence_is_used_by_the_term():
    """A divergence added with ``register_divergence`` is what HindSearchTerm.loss computes (the registry is
    the dispatch, not a list of if-branches)."""
    from hindsearch.hindsight import losses
    from hindsearch.hindsight.methods.hindsearch import HindSearchConfig, HindSearchTerm

    losses.register_divergence("clamped_sampled")(lambda x: 0.0 * x.lS + 7.0)  # replace, then restore
    try:
        term = HindSearchTerm(HindSearchConfig())
        logits = torch.randn(3, 11, requires_grad=True)
        idx = torch.tensor([[0, 0], [0, 1], [1, 2]])
        inputs = {"hind_mask": torch.ones(2, 4), "hind_lT": torch.zeros(2, 4)}
        L, _ = term.loss(logits, idx, torch.zeros(2, 4, dtype=torch.long), inputs)
        assert L.item() == pytest.approx(7.0)
    finally:
        losses.register_divergence("clamped_sampled")(losses._clamped_sampled)


def test_renamed_keys_are_read_with_a_deprecation_message(tmp_path, capsys):
    """``train.beta`` (KL) and ``igsd.beta`` (gate sharpness) shared a name: both still load, under the new keys."""
    toml = tmp_path / "old.toml"
    toml.write_text("[train]\nbeta = 0.02\n[igsd]\nbeta = 3.0\n")
    cfg = Config.load(toml, ["train.beta=0.03"])
    err = capsys.readouterr().err
    assert (cfg.train.kl_coef, cfg.igsd.gate_sharpness) == (0.03, 3.0)
    assert "train.beta is deprecated, read as train.kl_coef" in err and "igsd.beta is deprecated, read as igsd.gate_sharpness" in err
    saved = cfg.to_toml()
    assert "kl_coef = 0.03" in saved and "gate_sharpness = 3.0" in saved and "beta =" not in saved
