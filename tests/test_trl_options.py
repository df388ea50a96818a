"""``[train.trl]`` (raw GRPOConfig fields passed through) and ``[model.lora]`` (peft LoRA adapters in RL).

The trainer runs use the real TRL trainer on a tiny random model with the scripted rollouts of
``test_trainer`` (even rollouts answer the gold, odd ones fail), so GRPO sees non-zero advantages.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from hindsearch.config import Config, ConfigError
from hindsearch.hindsight.registry import resolve_methods
from hindsearch.train.grpo_config import GRPO_DEFAULTS, grpo_args
from test_trainer import OVERRIDES, make_trainer, tok, world  # noqa: F401 - fixtures

import peft  # noqa: E402 - the dev extra installs it; a missing peft fails here instead of skipping


# ---------------------------------------------------------------- [train.trl]
def test_defaults_report_nothing_and_keep_a_constant_lr(tmp_path):
    args = grpo_args(Config.load(None, OVERRIDES), tmp_path)
    assert args.report_to in ([], "none", ["none"])
    assert args.lr_scheduler_type == "constant"
    assert args.save_total_limit == GRPO_DEFAULTS["save_total_limit"] == 2
    assert args.learning_rate == 0.01 and args.max_steps == 2


def test_trl_table_passes_through_and_our_keys_win(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[train]\nlr = 3e-6\n\n[train.trl]\nlr_scheduler_type = "cosine"\nwarmup_steps = 3\nweight_decay = 0.1\n'
        'max_grad_norm = 0.5\nsave_total_limit = 5\nhub_model_id = "me/agent"\nlearning_rate = 1.0\n'
        'report_to = ["tensorboard"]\n'
    )
    cfg = Config.load(toml, ['train.trl.adam_beta2=0.95'])  # --set adds a key, keeps the preset's others
    assert cfg.train.trl["adam_beta2"] == 0.95 and cfg.train.trl["weight_decay"] == 0.1
    with pytest.warns(UserWarning, match=r"train.trl.learning_rate = 1.0 is ignored: train.lr sets learning_rate"):
        args = grpo_args(cfg, tmp_path / "out")
    assert args.lr_scheduler_type == "cosine"
    assert (args.warmup_steps, args.weight_decay, args.max_grad_norm) == (3, 0.1, 0.5)
    assert (args.save_total_limit, args.hub_model_id, args.adam_beta2) == (5, "me/agent", 0.95)
    assert args.report_to == ["tensorboard"]
    assert args.learning_rate == 3e-6  # train.lr wins over train.trl.learning_rate
    # the resolved config (config.toml of a run) keeps the table
    cfg.save(tmp_path / "resolved.toml")
    assert Config.load(tmp_path / "resolved.toml").train.trl == cfg.train.trl


def test_same_value_as_ours_does_not_warn(tmp_path):
    cfg = Config.load(None, OVERRIDES + ["train.trl.learning_rate=0.01"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grpo_args(cfg, tmp_path)
    assert not [w for w in caught if "train.trl" in str(w.message)]


@pytest.mark.parametrize("key", ["learning_rat", "report_too", "lora_r"])
def test_unknown_grpo_field_is_a_config_error_naming_the_key(key):
    with pytest.raises(ConfigError, match=rf"train\.trl\.{key} is not a field of TRL's GRPOConfig"):
        Config.load(None, [f"train.trl.{key}=1"])


def test_unknown_key_hint_and_missing_reporter(monkeypatch):
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        Config.load(None, ["train.trl.learning_rat=1"])
    import transformers.integrations as ti

    monkeypatch.setattr(ti, "get_available_reporting_integrations", lambda: [])
    with pytest.raises(ConfigError, match="'wandb' needs the wandb package"):
        Config.load(None, ['train.trl.report_to="wandb"'])


def test_tensorboard_run_writes_events(world, tok, tmp_path):  # noqa: F811
    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ['train.trl.report_to=["tensorboard"]', 'train.trl.lr_scheduler_type="linear"',
                                         "train.trl.warmup_steps=1", "train.save_steps=10"])
    run = tmp_path / "run"
    trainer, _ = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    trainer.train()
    events = list((run / "tb").glob("events.out.tfevents.*"))  # at the documented path, RUN/tb/
    assert events and events[0].stat().st_size > 0
    assert not list((run / "checkpoints").rglob("events.out.tfevents.*"))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # one warm-up step: the LR of step 1 is 0, then the peak (our default, a constant schedule, logs 0.01 twice)
    assert [r["learning_rate"] for r in rows] == pytest.approx([0.0, 0.01])


# ---------------------------------------------------------------- [model.lora]
def test_lora_config_validation():
    cfg = Config.load(None, ["model.lora.r=8", "model.lora.alpha=16", 'model.lora.target_modules=["q_proj", "v_proj"]'])
    assert cfg.model.lora.r == 8 and cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match="model.lora.dropout"):
        Config.load(None, ["model.lora.r=8", "model.lora.dropout=1.5"])
    with pytest.raises(ConfigError, match="unknown key model.lora.rank"):
        Config.load(None, ["model.lora.rank=8"])
    with pytest.raises(ConfigError, match="hindsearch.teacher = 'ema' is not supported with model.lora"):
        resolve_methods(Config.load(None, ["model.lora.r=8", 'method="hindsearch"', 'hindsearch.teacher="ema"']))


def _lora_overrides(*extra):
    return OVERRIDES + ["model.lora.r=4", "model.lora.alpha=8", "train.save_steps=1", *extra]


def test_two_grpo_steps_train_only_the_adapter(world, tok, tmp_path):  # noqa: F811
    w, retriever = world
    cfg = Config.load(None, _lora_overrides())
    run = tmp_path / "run"
    trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert isinstance(policy, peft.PeftModel) and trainer.ref_model is None  # reference = adapter disabled
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.train()

    after = dict(policy.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed, "no parameter changed"
    assert changed <= trainable, sorted(changed - trainable)  # only adapter weights moved
    assert any(".lora_B." in n for n in changed)  # B starts at zero: it must have learned something
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == adapter-disabled base
    assert rows[1]["kl"] > 0  # the adapter moved the policy away from the base

    # saving writes the adapter, not the model
    trainer.save_model(str(run / "final"))
    ckpt = run / "checkpoints" / "checkpoint-2"
    for d in (run / "final", ckpt):
        assert (d / "adapter_model.safetensors").exists() and (d / "adapter_config.json").exists(), d
        assert not (d / "model.safetensors").exists(), d
    adapter_cfg = json.loads((run / "final" / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["lora_alpha"] == 8
    # the adapter names its base, so the run's final/ loads as a model (resume, `hindsearch eval --model`)
    assert adapter_cfg["base_model_name_or_path"] == str((run / "init").resolve())
    from hindsearch.config import ModelConfig
    from hindsearch.models import load_policy

    reloaded, _ = load_policy(ModelConfig(name=str(run / "final"), device="cpu"))
    ids = torch.tensor([tok("Who founded the city?")["input_ids"]])
    policy.eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)

    # resume from the adapter checkpoint of step 1: step 2 is redone once, from checkpoint-1's adapter
    import shutil

    from safetensors.torch import load_file

    from hindsearch.train.run import last_checkpoint, truncate_jsonl

    shutil.rmtree(ckpt)
    truncate_jsonl(run / "metrics.jsonl", 1)
    trainer2, _ = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run, seed=0)
    saved = load_file(str(run / "checkpoints" / "checkpoint-1" / "adapter_model.safetensors"))
    trainer2._load_from_checkpoint(str(last_checkpoint(run)))
    loaded = {n: p for n, p in trainer2.accelerator.unwrap_model(trainer2.model).named_parameters() if "lora_" in n}
    assert len(saved) == len(loaded) and any(torch.count_nonzero(v) for k, v in saved.items() if "lora_B" in k)
    assert all(any(torch.equal(v, p) for p in loaded.values()) for v in saved.values())
    trainer2.train(resume_from_checkpoint=str(last_checkpoint(run)))
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # the run folder is relocatable: moved elsewhere (the original gone), its final/ still loads and evaluates
    from hindsearch.agent.engine import RolloutEngine
    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.eval import evaluate

    trainer2.save_model(str(run / "final"))
    final_logits = load_policy(ModelConfig(name=str(run / "final"), device="cpu"))[0](input_ids=ids).logits
    moved = tmp_path / "elsewhere" / "run-copy"
    shutil.move(str(run), str(moved))
    assert json.loads((moved / "final" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        str((run / "init").resolve())  # the recorded base is gone
    m2, t2 = load_policy(ModelConfig(name=str(moved / "final"), device="cpu"))
    with torch.no_grad():
        assert torch.allclose(m2(input_ids=ids).logits, final_logits, atol=1e-5)
    eng = RolloutEngine(m2, t2, retriever, cfg.rollout, topk=2, backend=HFBackend(m2, t2))
    res = evaluate(eng, {"world": w.splits["dev"][:2]}, out_dir=tmp_path / "eval-moved", progress=False)
    assert res["benchmarks"]["world"]["n"] == 2
    (moved / "init").rename(moved / "init-gone")  # no base anywhere: a one-line error naming both
    with pytest.raises(FileNotFoundError, match="does not exist and no init/ folder encloses"):
        load_policy(ModelConfig(name=str(moved / "final"), device="cpu"))


def test_lora_with_the_frozen_lm_judge_and_teacher(world, tok, tmp_path):  # noqa: F811
    """HindSearch with LoRA and a KL term (TRL then keeps no reference copy): the judge and the frozen teacher
    are a copy of the initial policy, without adapter, and stay unchanged while the adapter trains."""
    w, retriever = world
    cfg = Config.load(None, _lora_overrides('method="hindsearch"', 'hindsearch.judge_kind="lm"',
                                            "hindsearch.critique_max_tokens=8", "train.save_steps=10"))
    run = tmp_path / "run"
    trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    frozen = trainer.aux_ctx.frozen
    assert frozen is not None and frozen is not trainer.model
    assert not any("lora_" in n for n, _ in frozen.named_parameters())
    init = {n: p.detach().clone() for n, p in frozen.named_parameters()}
    trainer.train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["hind/eligible"] == 2.0 and r["hind/judge_time"] > 0
        assert r["hind/critiques"] + r["hind/degenerate"] + r["hind/judge_errors"] == r["hind/eligible"]
        assert torch.isfinite(torch.tensor([r["loss"], r["hind/loss"], r["kl"]])).all()
    assert all(torch.equal(init[n], p) for n, p in frozen.named_parameters())
    # the frozen copy is the adapter-disabled policy
    policy = trainer.accelerator.unwrap_model(trainer.model).eval()
    ids = torch.tensor([tok("Who founded the city?")["input_ids"]])
    with torch.no_grad(), policy.disable_adapter():
        base_logits = policy(input_ids=ids).logits
    with torch.no_grad():
        assert torch.allclose(frozen(input_ids=ids).logits, base_logits, atol=1e-5)
        assert not torch.allclose(policy(input_ids=ids).logits, base_logits, atol=1e-5)


# ---------------------------------------------------------------- layer-wise activation checkpointing
def test_checkpoint_every_n_layers_reaches_grpo_config_and_keeps_trl_kwargs(tmp_path):
    on = ["train.gradient_checkpointing=true", "train.checkpoint_every_n_layers=2"]
    args = grpo_args(Config.load(None, OVERRIDES + on), tmp_path)
    assert args.gradient_checkpointing and args.gradient_checkpointing_kwargs == {"every_n_layers": 2}
    # a [train.trl] dict keeps its other entries; a different every_n_layers there is overridden, with a warning
    cfg = Config.load(None, OVERRIDES + on + ['train.trl.gradient_checkpointing_kwargs={"use_reentrant" = false, '
                                             '"every_n_layers" = 3}'])
    with pytest.warns(UserWarning, match=r"every_n_layers = 3 is ignored: train.checkpoint_every_n_layers"):
        args = grpo_args(cfg, tmp_path)
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False, "every_n_layers": 2}
    # N = 1 (the default) and checkpointing off leave TRL's kwargs as they were
    assert grpo_args(Config.load(None, OVERRIDES + ["train.gradient_checkpointing=true"]),
                     tmp_path).gradient_checkpointing_kwargs in (None, {})
    with pytest.raises(ConfigError, match="train.checkpoint_every_n_layers"):
        Config.load(None, OVERRIDES + ["train.checkpoint_every_n_layers=0"]).validate()


@pytest.mark.parametrize("method", ["grpo", "hindsearch+igsd"])
def test_every_second_layer_checkpointed_through_trl_steps_with_unchanged_weights(method, world, tok,  # noqa: F811
                                                                                 tmp_path):
    """Two real GRPO steps with every 2nd of 4 layers checkpointed: TRL disables and re-enables checkpointing around
    its no-grad forwards with ``args.gradient_checkpointing_kwargs`` (which held ``every_n_layers`` and made torch's
    checkpoint raise); the same layers stay checkpointed, and the weights equal a run without checkpointing (a
    checkpointed layer is recomputed exactly), with and without the hindsight terms (whose hidden-state capture sits
    outside the checkpointed layers)."""
    from hindsearch.models import tiny_random_model
    from hindsearch.train.run import build_trainer, ensure_on_disk
    from test_trainer import ScriptedEngine

    w, retriever = world
    weights = {}
    for name, extra in (("plain", []), ("every2", ["train.gradient_checkpointing=true",
                                                    "train.checkpoint_every_n_layers=2"])):
        cfg = Config.load(None, OVERRIDES + [f'method="{method}"', "train.kl_coef=0.0", 'hindsearch.judge_kind="oracle"',
                                             "igsd.max_positions_per_rollout=1", "igsd.max_query_tokens=4",
                                             "igsd.n_controls=1"] + extra)
        run = tmp_path / name
        model = tiny_random_model(tok, seed=0, num_hidden_layers=4)
        ensure_on_disk(model, tok, run / "init")
        model.train()
        trainer = build_trainer(cfg, model, tok, ScriptedEngine(model, tok, retriever, cfg.rollout), w.splits["train"][:4], run)
        trainer.train()
        flags = [bool(getattr(layer, "gradient_checkpointing", False)) for layer in model.model.layers]
        assert flags == ([False] * 4 if name == "plain" else [True, False, True, False]), (name, flags)
        weights[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    for n, p in weights["plain"].items():
        assert torch.allclose(p, weights["every2"][n], atol=1e-6), n
