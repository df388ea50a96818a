"""Presets and config validation: every shipped preset loads; bad values fail before any model loads,
naming the key and the allowed values; the `train` CLI finds presets by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hindsearch import cli
from hindsearch.config import Config, ConfigError
from hindsearch.hindsight.registry import resolve_methods
from hindsearch.cli.train import find_config
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
    assert names == {"tiny-cpu", "qwen2.5-3b-instruct", "qwen2.5-7b-instruct", "qwen2.5-3b-instruct-hindsearch-nogold"}
    for p in PRESETS:
        cfg = resolve_methods(Config.load(p))
        assert cfg.rollout.num_generations >= 2
    assert resolve_methods(Config.load(CONFIGS / "qwen2.5-3b-instruct-hindsearch-nogold.toml")).hindsearch.judge_sees_gold is False
    paper = resolve_methods(Config.load(CONFIGS / "qwen2.5-3b-instruct.toml"))
    assert (paper.rollout.num_generations, paper.train.lr, paper.train.kl_coef, paper.rollout.max_turns) == (5, 1e-6, 0.001, 4)
    assert paper.retrieval.topk == 3 and paper.rollout.backend == "vllm"
    assert (CONFIGS / "accelerate" / "zero3.yaml").exists() and (CONFIGS / "accelerate" / "fsdp.yaml").exists()
    micro = {p.stem: resolve_methods(Config.load(p)) for p in sorted((CONFIGS.parent / "recipes" / "micro").glob("*.toml"))}
    assert set(micro) == {"micro", "micro-mech", "micro-scarce"}  # micro-mech lays itself over micro, scarce over mech
    scarce = micro["micro-scarce"]
    assert (scarce.out, scarce.rollout.num_generations, scarce.data.world_test_questions, scarce.hindsearch.lam,
            scarce.hindsearch.divergence, scarce.warmup.lr) == ("runs/micro-scarce", 4, 600, 2.0, "reverse_kl", 1e-3)
    assert micro["micro-mech"].model.name == scarce.model.name != micro["micro"].model.name


# What the paper presets held before they were one base per model size (the values that differ from the defaults;
# six files, of which only the no-gold overlay remains), and the tiny CPU presets before tiny-cpu-hindsearch.toml and
# tiny-cpu-igsd.toml went: every old preset resolves to the same config from its base and --method (or overlay).
PAPER_3B = {
    "model.name": "Qwen/Qwen2.5-3B-Instruct", "model.dtype": "bfloat16", "model.device": "cuda",
    "model.attn_implementation": "flash_attention_2", "data.train": "FILL_ME/nq_hotpotqa_train/train.parquet",
    "data.dev": "FILL_ME/nq_hotpotqa_train/test.parquet", "retrieval.kind": "remote",
    "retrieval.url": "http://127.0.0.1:8000", "retrieval.timeout_s": 60.0, "rollout.backend": "vllm",
    "rollout.max_new_tokens_per_turn": 500, "rollout.max_total_tokens": 4096, "rollout.num_generations": 5,
    "warmup.enabled": False, "train.steps": 300, "train.questions_per_step": 64, "train.save_steps": 50,
    "train.gradient_checkpointing": True, "train.samples_per_step": 8, "train.eval_limit": 1000,
    "train.micro_batch_size": 4, "eval.batch_size": 64,
}
PAPER_7B = {**PAPER_3B, "model.name": "Qwen/Qwen2.5-7B-Instruct"}
TINY = {
    "out": "runs/tiny-cpu", "model.device": "cpu", "retrieval.topk": 2, "rollout.max_turns": 2,
    "rollout.max_new_tokens_per_turn": 40, "rollout.max_total_tokens": 640, "warmup.num_demos": 64,
    "warmup.epochs": 1, "warmup.lr": 0.0003, "warmup.batch_size": 4, "warmup.micro_batch_size": 1,
    "train.steps": 3, "train.questions_per_step": 2, "train.lr": 5e-06, "train.kl_coef": 0.0, "train.save_steps": 3,
    "train.gradient_checkpointing": True, "train.eval_limit": 16, "train.micro_batch_size": 1,
}
TINY_HIND = {"hindsearch.judge_model": "smollm2-135m", "hindsearch.critique_max_tokens": 32}
TINY_IGSD = {"igsd.max_positions_per_rollout": 2, "igsd.max_query_tokens": 16, "igsd.n_controls": 1}
OLD_PRESETS = {  # old name: (preset now, --method, the old file's values that differ from the defaults)
    "qwen2.5-3b-instruct-grpo": ("qwen2.5-3b-instruct", "grpo", {**PAPER_3B, "out": "runs/qwen2.5-3b-instruct-grpo"}),
    "qwen2.5-3b-instruct-hindsearch": ("qwen2.5-3b-instruct", "hindsearch", {
        **PAPER_3B, "method": "hindsearch", "out": "runs/qwen2.5-3b-instruct-hindsearch"}),
    "qwen2.5-3b-instruct-hindsearch-nogold": ("qwen2.5-3b-instruct-hindsearch-nogold", None, {
        **PAPER_3B, "method": "hindsearch", "out": "runs/qwen2.5-3b-instruct-hindsearch-nogold",
        "hindsearch.judge_sees_gold": False}),
    "qwen2.5-3b-instruct-igsd": ("qwen2.5-3b-instruct", "igsd", {
        **PAPER_3B, "method": "igsd", "out": "runs/qwen2.5-3b-instruct-igsd"}),
    "qwen2.5-7b-instruct-grpo": ("qwen2.5-7b-instruct", "grpo", {**PAPER_7B, "out": "runs/qwen2.5-7b-instruct-grpo"}),
    "qwen2.5-7b-instruct-igsd": ("qwen2.5-7b-instruct", "igsd", {
        **PAPER_7B, "method": "igsd", "out": "runs/qwen2.5-7b-instruct-igsd"}),
    "tiny-cpu": ("tiny-cpu", None, {**TINY, **TINY_HIND, **TINY_IGSD}),
    "tiny-cpu-hindsearch": ("tiny-cpu", "hindsearch", {
        **TINY, **TINY_HIND, "method": "hindsearch", "out": "runs/tiny-cpu-hindsearch"}),
    "tiny-cpu-igsd": ("tiny-cpu", "igsd", {**TINY, **TINY_IGSD, "method": "igsd", "out": "runs/tiny-cpu-igsd"}),
}
TINY_UNREAD = {"tiny-cpu-hindsearch": ("out", "igsd."), "tiny-cpu-igsd": ("out", "hindsearch.")}
"""What tiny-cpu --method hindsearch/igsd resolves differently from the old tiny-cpu-hindsearch/-igsd files: the run
folder (runs/tiny-cpu unless --out, as the README's command passes) and the other method's section, which the
method never reads (tiny-cpu holds its CPU-sized values)."""


def _non_default(cfg: Config) -> dict:
    from hindsearch.config import flat_keys

    base = flat_keys(resolve_methods(Config()).to_dict())
    return {k: v for k, v in flat_keys(cfg.to_dict()).items() if k not in base or base[k] != v}


@pytest.mark.parametrize("old", sorted(OLD_PRESETS))
def test_every_old_preset_resolves_to_the_same_config(old):
    """``hindsearch train --config NEW [--method M]`` (the CLI adds ``method="M"``) gives the config the old preset
    file held, field for field (the old files were checked against these values before they were removed)."""
    new, method, held = OLD_PRESETS[old]
    cfg = resolve_methods(Config.load(find_config(new), [f'method="{method}"'] if method else []))
    got = _non_default(cfg)
    unread = TINY_UNREAD.get(old, ())
    drop = [k for k in set(got) | set(held) if k in unread or k.startswith(tuple(u for u in unread if u.endswith(".")))]
    assert {k: v for k, v in got.items() if k not in drop} == {k: v for k, v in held.items() if k not in drop}
    if old == "tiny-cpu-hindsearch":  # the README's HindSearch command passes --out
        assert cfg.out == "runs/tiny-cpu" and cfg.method == "hindsearch"


def test_overlay_presets_and_the_method_in_out(tmp_path):
    """``base = "other.toml"`` lays a preset over another (relative to its folder; tables merged key by key; a chain
    of bases), ``{method}`` in ``out`` is the resolved method; a missing base and a cycle are named."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.toml").write_text('method = "igsd"\nout = "runs/a-{method}"\n[train]\nsteps = 7\nlr = 1e-4\n'
                                     '[igsd]\nlam = 0.5\n')
    (tmp_path / "sub" / "b.toml").write_text('base = "../a.toml"\n[train]\nsteps = 9\n')
    (tmp_path / "sub" / "c.toml").write_text('base = "b.toml"\nmethod = "hindsearch"\n[hindsearch]\nlam = 2.0\n')
    a = resolve_methods(Config.load(tmp_path / "a.toml"))
    assert (a.out, a.train.steps, a.train.lr) == ("runs/a-igsd", 7, 1e-4)
    b = resolve_methods(Config.load(tmp_path / "sub" / "b.toml", ['method="grpo"']))
    assert (b.out, b.method, b.train.steps, b.train.lr, b.igsd.lam) == ("runs/a-grpo", "grpo", 9, 1e-4, 0.5)
    c = resolve_methods(Config.load(tmp_path / "sub" / "c.toml"))
    assert (c.out, c.train.steps, c.igsd.lam, c.hindsearch.lam) == ("runs/a-hindsearch", 9, 0.5, 2.0)
    (tmp_path / "d.toml").write_text('base = "nope.toml"\n')
    with pytest.raises(ConfigError, match=r"d.toml: base = 'nope.toml': .*nope.toml not found"):
        resolve_methods(Config.load(tmp_path / "d.toml"))
    (tmp_path / "e.toml").write_text('base = "f.toml"\n')
    (tmp_path / "f.toml").write_text('base = "e.toml"\n')
    with pytest.raises(ConfigError, match="makes a cycle"):
        resolve_methods(Config.load(tmp_path / "e.toml"))
    (tmp_path / "g.toml").write_text('base = 3\n')
    with pytest.raises(ConfigError, match="base must be the file name of another preset"):
        resolve_methods(Config.load(tmp_path / "g.toml"))


def test_default_preset_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repo: found relative to the package checkout
    assert find_config(None).name == "tiny-cpu.toml"
    assert find_config("qwen2.5-7b-instruct").name == "qwen2.5-7b-instruct.toml"
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
        ("retrieval.kind=\"bm52\"", "retrieval.kind = 'bm52' is not allowed; choose one of bm25, dense, remote"),
        ("train.reward_funcs=[\"emm\"]", "train.reward_funcs = ['emm'] is not allowed; choose each from em, f1, format"),
        ("igsdd.lam=1", "unknown key 'igsdd' in [Config]"),
    ],
)
def test_bad_values_fail_before_any_model_loads(override, needle, no_models, capsys):
    rc = cli.main(["train", "--set", override])
    assert rc == 1
    err = capsys.readouterr().err
    assert needle in err, err


def test_missing_files_are_named_before_any_model_loads(no_models, capsys):
    rc = cli.main(["train", "--config", str(CONFIGS / "qwen2.5-3b-instruct.toml")])
    assert rc == 1
    assert "data.train = 'FILL_ME/nq_hotpotqa_train/train.parquet': file not found" in capsys.readouterr().err
    cfg = resolve_methods(Config.load(CONFIGS / "tiny-cpu.toml", ['retrieval.index_dir="/nonexistent/index"']))
    with pytest.raises(ConfigError, match="retrieval.index_dir"):
        preflight(cfg)


def test_resume_rejects_overrides_and_non_run_dirs(tmp_path, no_models, capsys):
    assert cli.main(["train", "--resume", str(tmp_path), "--set", "train.steps=3"]) == 1
    assert "--resume uses the run's saved config.toml" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(tmp_path)]) == 1
    assert "no config.toml there" in capsys.readouterr().err


def test_grpo_args_mapping():
    cfg = resolve_methods(Config.load(CONFIGS / "tiny-cpu.toml", ["train.steps=7", "train.kl_coef=0.01", 'train.loss_type="dapo"']))
    a = grpo_args(cfg, "/tmp/x")
    g = cfg.rollout.num_generations
    assert a.per_device_train_batch_size * a.gradient_accumulation_steps == cfg.train.questions_per_step * g
    assert (a.num_generations, a.max_steps, a.beta, a.loss_type) == (g, 7, 0.01, "dapo")
    assert a.learning_rate == cfg.train.lr and a.max_completion_length == cfg.rollout.max_total_tokens
    with pytest.raises(ConfigError, match="divisible by the number of processes"):
        grpo_args(resolve_methods(Config.load(None, ["train.questions_per_step=3", "rollout.num_generations=3"])), "/tmp/x", 2)


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
    from hindsearch.config import RolloutConfig
    from hindsearch.core.sampling import DRAWS

    assert DRAWS == choices_of(RolloutConfig, "sampler")  # rollout.sampler names a draw sample_tokens has
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


def test_a_former_key_name_is_an_unknown_key(tmp_path):
    """``train.beta`` and ``igsd.beta`` (the names before ``kl_coef`` and ``gate_sharpness``) are unknown keys like
    any other: one error naming the file, the key and the allowed keys."""
    (tmp_path / "old.toml").write_text("[train]\nbeta = 0.02\n")
    with pytest.raises(ConfigError, match="old.toml: unknown key train.beta; allowed: .*'kl_coef'"):
        Config.load(tmp_path / "old.toml")
    (tmp_path / "old.toml").write_text("[igsd]\nbeta = 3.0\n")
    with pytest.raises(ConfigError, match="old.toml: unknown key igsd.beta; allowed: .*'gate_sharpness'"):
        resolve_methods(Config.load(tmp_path / "old.toml"))


HEAVY = ("torch", "bm25s", "httpx", "transformers")
"""Libraries a config and a command's ``--help`` do without."""


def test_loading_a_config_and_train_help_import_no_model_library():
    """``Config.load`` (of a method's table too) and ``hindsearch train --help`` (which lists the registered
    methods) import neither torch nor a retriever or HTTP library."""
    import subprocess
    import sys

    code = ("import sys; from hindsearch.config import Config; Config.load(None, ['method=\"igsd\"', 'igsd.lam=0.5'])\n"
            "from hindsearch.cli import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "[--method {grpo,hindsearch,igsd,hindsearch+igsd}]" in out and out.strip().endswith("\n[]"), out


def test_registered_names_are_checked_where_their_registries_live():
    """``method``, ``retrieval.kind`` and ``train.reward_funcs`` load as written and are checked when the run is
    assembled, each with the config's one-line error naming the key and the registered names; the method tables
    are parsed by their registered dataclasses then."""
    from hindsearch.retrieval.factory import check_kind
    from hindsearch.train.reward_funcs import reward_funcs_of

    cfg = Config.load(None, ['method="sft"', 'retrieval.kind="bm52"', 'train.reward_funcs=["em", "emm"]',
                             "igsd.lam=0.5"])
    with pytest.raises(ConfigError, match=r"^method = 'sft' is not allowed; choose one of grpo, hindsearch, igsd, "
                                          r"hindsearch\+igsd$"):
        resolve_methods(cfg)
    with pytest.raises(ConfigError, match="^retrieval.kind = 'bm52' is not allowed; choose one of bm25, dense, remote$"):
        check_kind(cfg.retrieval)
    with pytest.raises(ConfigError, match=r"^train.reward_funcs = \['em', 'emm'\] is not allowed; choose each from "
                                          r"em, f1, format$"):
        reward_funcs_of(cfg.train)
    cfg.method = "igsd"
    assert resolve_methods(cfg).igsd.lam == 0.5 and list(cfg.sections)[:2] == ["hindsearch", "igsd"]
    with pytest.raises(ConfigError, match=r"^<dict>: unknown key 'igsdd' in \[Config\]; allowed: .*'igsd'"):
        resolve_methods(Config.from_dict({"igsdd": {"lam": 1.0}}))


@pytest.mark.parametrize("override, needle", [
    ('method="sft"', "method = 'sft' is not allowed; choose one of grpo, hindsearch, igsd, hindsearch+igsd"),
    ('retrieval.kind="bm52"', "retrieval.kind = 'bm52' is not allowed; choose one of bm25, dense, remote"),
    ('train.reward_funcs=["emm"]', "train.reward_funcs = ['emm'] is not allowed; choose each from em, f1, format"),
    ("igsd.gate_sharpness=0", "igsd.gate_sharpness must be > 0"),
])
def test_eval_refuses_a_bad_name_before_anything_is_written_or_loaded(override, needle, no_models, tmp_path, capsys):
    """``hindsearch eval`` checks the registered names and the method tables right after loading the config, as
    ``train`` does: one line, no folder written, no world built, no model loaded."""
    assert cli.main(["eval", "--out", str(tmp_path / "o"), "--set", override,
                     "--set", f'data.world_dir="{(tmp_path / "w").as_posix()}"']) == 1
    assert needle in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "o").exists() and not (tmp_path / "w").exists()
