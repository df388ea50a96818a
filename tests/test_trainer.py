"""GRPO end to end through the real TRL trainer: tiny random model, real rollouts, real BM25 over a small world.

The tiny random model never answers correctly by itself, so GRPO would see only zero rewards; the
engine's ``logits_hook`` scripts the *sampled tokens* of some rollouts (even rollouts search and answer
the gold, odd ones answer wrongly). Everything else is real: the rollout engine, retrieval, TRL's
rewards, advantages, loss, optimizer, checkpointing and resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hindsearch.agent.engine import RolloutEngine
from hindsearch.agent.hf_backend import HFBackend
from hindsearch.config import Config
from hindsearch.data.world import generate_world
from recipes.micro.build import train_tokenizer
from hindsearch.models import tiny_random_model
from hindsearch.retrieval.factory import build_index, load_index
from hindsearch.train import rollout_adapter as ra
from hindsearch.train.reward_funcs import em_reward
from hindsearch.train.run import build_trainer, ensure_on_disk, last_checkpoint, truncate_jsonl

OVERRIDES = [
    'model.name="tiny-random"', 'model.device="cpu"', "train.steps=2", "train.questions_per_step=2",
    "rollout.num_generations=2", "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=24",
    "rollout.max_total_tokens=1024", "train.lr=0.01", "train.save_steps=1", "train.kl_coef=0.04",
    "warmup.enabled=false", "train.samples_per_step=2",
]


class ScriptedEngine(RolloutEngine):
    """The real engine with the model's sampled tokens scripted: rollout ``i`` of a call searches the
    question and answers the gold when ``i`` is even, searches ``weather`` and answers ``nobody`` when odd."""

    def __init__(self, model, tok, retriever, cfg):
        super().__init__(model, tok, retriever, cfg, topk=2, backend=HFBackend(model, tok), logits_hook=self._force)
        self._scripts: list[list[list[int]]] = []

    def rollout(self, records, num_generations=1, **kw):
        enc = lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self._scripts = []
        for r in (r for r in records for _ in range(num_generations)):
            if len(self._scripts) % 2 == 0:
                turns = [f"<search> {r.question} </search>", f"<answer> {r.golden_answers[0]} </answer>"]
            else:
                turns = ["<search> weather </search>", "<answer> nobody </answer>"]
            self._scripts.append([enc(t) for t in turns])
        return super().rollout(records, num_generations, **kw)

    def _force(self, rows, new_ids, logits):
        out = torch.full_like(logits, float("-inf"))
        for j, (row, ids) in enumerate(zip(rows, new_ids)):
            traj, turn = row[0], row[1]  # (trajectory index, turn index, ...)
            script = self._scripts[traj][turn] if turn < len(self._scripts[traj]) else []
            out[j, script[len(ids)] if len(ids) < len(script) else self.tokenizer.eos_token_id] = 0.0
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = generate_world(seed=0, n_entities=60)
    d = tmp_path_factory.mktemp("world")
    build_index(w.passages, d / "bm25", kind="bm25", show_progress=False)
    return w, load_index(d / "bm25")


@pytest.fixture(scope="module")
def tok(world):
    """A small byte-level BPE trained on the world (fast steps: 1k vocabulary instead of 49k)."""
    w, _ = world
    texts = [p.contents for p in w.passages] + [r.question for s in w.splits.values() for r in s]
    return train_tokenizer(texts, vocab_size=1024)


def make_trainer(cfg, tok, retriever, records, run_dir, seed=0):
    model = tiny_random_model(tok, seed=seed, num_hidden_layers=1)
    ensure_on_disk(model, tok, run_dir / "init")
    model.train()
    engine = ScriptedEngine(model, tok, retriever, cfg.rollout)
    return build_trainer(cfg, model, tok, engine, records, run_dir), model


def test_two_grpo_steps_then_resume(world, tok, tmp_path):
    w, retriever = world
    records = w.splits["train"][:6]
    cfg = Config.load(None, OVERRIDES)
    run = tmp_path / "run"
    trainer, model = make_trainer(cfg, tok, retriever, records, run)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()

    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(torch.isfinite(torch.tensor(r[k])) for k in ("loss", "loss/total", "grad_norm"))
        assert r["rollout/reward_mean"] == pytest.approx(0.5)  # even rollouts answer the gold
        assert r["rollout/searches_per_rollout"] == pytest.approx(1.0)
        assert r["rollout/frac_zero_std_groups"] == 0.0
        assert r["grad_norm"] > 0
        for k in ("time/rollout", "time/reward", "time/aux_prepare", "time/update", "kl"):
            assert k in r
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), "parameters did not change"
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2} and all("completion" in s for s in samples)
    by_id = {r.id: r for r in records}
    assert all(s["evidence"] == list(by_id[s["qid"]].evidence) for s in samples)  # self-contained for the report
    assert last_checkpoint(run).name == "checkpoint-2"

    # resume: pretend step 2 never finished -> drop its checkpoint and log rows, continue from checkpoint-1
    import shutil

    shutil.rmtree(run / "checkpoints" / "checkpoint-2")
    assert truncate_jsonl(run / "metrics.jsonl", 1) == 1
    truncate_jsonl(run / "samples.jsonl", 1)
    trainer2, model2 = make_trainer(cfg, tok, retriever, records, run, seed=1)
    trainer2.train(resume_from_checkpoint=str(last_checkpoint(run)))
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2], steps  # step 1 not repeated, step 2 redone once
    assert trainer2.state.global_step == 2
    # the resumed run started from checkpoint-1's weights, not from its own (different) random init
    from safetensors.torch import load_file

    w1 = load_file(str(run / "checkpoints" / "checkpoint-1" / "model.safetensors"))
    fresh = tiny_random_model(tok, seed=1, num_hidden_layers=1).state_dict()
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(w1[name], fresh[name])


def test_rollout_adapter_shapes(world, tok):
    w, retriever = world
    cfg = Config.load(None, OVERRIDES)
    model = tiny_random_model(tok, num_hidden_layers=1)
    eng = ScriptedEngine(model, tok, retriever, cfg.rollout)
    recs = w.splits["train"][:2]
    prompts = [ra.record_key(r) for r in recs for _ in range(2)]
    trajs = eng.rollout(ra.records_for_prompts(prompts, {ra.record_key(r): r for r in recs}), seed=0)
    out = ra.rollout_output(trajs, filler_id=tok.pad_token_id, decode=lambda ids: tok.decode(ids))
    assert [t.qid for t in trajs] == [r.id for r in recs for _ in range(2)]
    for ids, mask, lps, t in zip(out["completion_ids"], out["env_mask"], out["logprobs"], trajs):
        assert len(ids) == len(mask) == len(lps) and mask == t.gen_mask
    golds = [r.golden_answers for r in recs for _ in range(2)]
    completions = tok.batch_decode(out["completion_ids"])
    computed = em_reward(completions, golden_answers=golds, model_text=out["model_text"])  # without the column
    columns = {k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
    rewards = em_reward(completions, golden_answers=golds, **columns)  # as TRL calls it: EM read from the rollouts
    assert rewards == computed == out["em"] == [t.em for t in trajs] == [1.0, 0.0, 1.0, 0.0]
    assert 0 in out["env_mask"][0]  # the information block is masked
    with pytest.raises(KeyError, match="nope"):
        ra.records_for_prompts(["nope"], {})


def test_one_context_and_one_engine_for_the_whole_run(world, tok, tmp_path, monkeypatch):
    """The terms get the run's one ``AuxContext`` every step (only its ``step`` changes; no per-term copy), and the
    trainer never re-points the rollout engine at the policy during training."""
    from hindsearch.hindsight.methods.igsd import IGSDTerm

    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ['method="igsd"', "train.kl_coef=0.0", "igsd.max_positions_per_rollout=1",
                                         "igsd.max_query_tokens=2", "igsd.n_controls=1"])
    trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:4], tmp_path / "run")
    seen, sets = [], []
    prepare = IGSDTerm.prepare
    monkeypatch.setattr(IGSDTerm, "prepare", lambda self, trajs, T, ctx: seen.append((ctx, ctx.step)) or
                        prepare(self, trajs, T, ctx))
    engine = trainer.engine
    monkeypatch.setattr(type(engine), "__setattr__",
                        lambda self, k, v: sets.append(k) or object.__setattr__(self, k, v))
    trainer.train()
    assert [step for _, step in seen] == [0, 1] and all(ctx is trainer.aux_ctx for ctx, _ in seen)
    assert trainer.aux_ctx.policy is model and trainer.aux_ctx.complete is engine and engine.model is model
    assert "model" not in sets and "backend" not in sets


def test_em_is_computed_once_per_rollout(monkeypatch):
    """The ``em`` reward reads the rollouts' own ``em`` column (the engine's exact match) instead of extracting and
    matching the answer a second time; without the column it computes it."""
    from hindsearch.train import reward_funcs as rf

    def again(*_a, **_k):
        raise AssertionError("EM computed a second time")

    monkeypatch.setattr(rf, "exact_match", again)
    monkeypatch.setattr(rf, "extract_answer", again)
    assert rf.em_reward(["a", "b"], golden_answers=[["x"], ["y"]], model_text=["", ""], em=[1.0, 0.0]) == [1.0, 0.0]
    with pytest.raises(AssertionError, match="second time"):
        rf.em_reward(["a"], golden_answers=[["x"]], model_text=["<answer> x </answer>"])


@pytest.mark.parametrize("method", ["hindsearch", "igsd"])
def test_two_steps_with_hindsight_terms(method, world, tok, tmp_path):
    """Two steps with the real HindSearch (oracle judge) / IGSD terms through the trainer: their metrics are
    logged every step, the loss is finite."""
    w, retriever = world
    cfg = Config.load(None, OVERRIDES + [f'method="{method}"', "train.steps=2", "train.kl_coef=0.0",
                                         'hindsearch.judge_kind="oracle"', "igsd.max_positions_per_rollout=2",
                                         "igsd.max_query_tokens=4", "igsd.n_controls=1"])
    run = tmp_path / "run"
    trainer, _ = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    trainer.train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    row = rows[0]
    name = {"hindsearch": "hind", "igsd": "igsd"}[method]
    assert all(f"{name}/loss" in r for r in rows)
    assert any(k.startswith(f"{name}/") for k in row), sorted(row)
    assert row[f"{name}/loss"] == row[f"{name}/loss"] and row["time/aux_prepare"] > 0
    assert torch.isfinite(torch.tensor(row["loss"]))
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert any(name in s for s in samples if s["reward"] == 0), "failed rollouts carry no aux sample"


def test_ema_teachers_follow_the_policy_bit_for_bit(world, tok, tmp_path):
    """Two steps of hindsearch+igsd with both teachers ``ema`` (two decays, two copies): after each optimizer step
    each EMA copy is exactly ``ema.lerp_(policy, 1 - decay)`` of the policy at that step's end, bit for bit (the
    update ``train.callbacks.EMATeachers`` makes, as the hand-written one before it); the terms read the copies
    from the run's one context."""
    from transformers import TrainerCallback

    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ['method="hindsearch+igsd"', 'hindsearch.teacher="ema"', 'igsd.teacher="ema"',
                                         'hindsearch.judge_kind="oracle"', "hindsearch.ema_decay=0.5",
                                         "train.kl_coef=0.0"])
    trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:6], tmp_path / "run")
    emas = trainer.aux_ctx.emas
    assert sorted(emas) == [0.5, 0.99] and all(e is not model for e in emas.values())
    expected = {d: [p.detach().clone() for p in e.parameters()] for d, e in emas.items()}

    class Follow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # the policy as the EMA update saw it
            for d, ps in expected.items():
                for e, p in zip(ps, model.parameters()):
                    e.lerp_(p.detach(), 1.0 - d)

    trainer.add_callback(Follow())
    trainer.train()
    for d, ema in emas.items():
        got = list(ema.parameters())
        assert all(torch.equal(a, b) for a, b in zip(got, expected[d])), d
        assert not all(torch.equal(a, b) for a, b in zip(got, model.parameters()))


@pytest.mark.slow
def test_run_train_end_to_end(tmp_path, monkeypatch):
    """The whole main job on a tiny world: world + index built, base eval, 1 GRPO step, eval, table, resume."""
    from hindsearch.train.run import run_train

    monkeypatch.setenv("HINDSEARCH_CACHE", str(tmp_path / "cache"))
    overrides = [o for o in OVERRIDES if not o.startswith(("train.steps", "train.save_steps"))]
    cfg = Config.load(None, overrides + [f'data.world_dir="{tmp_path / "world"}"', "data.world_entities=60",
                                         "train.steps=1", "train.save_steps=1", "train.eval_limit=2",
                                         f'out="{tmp_path / "run"}"'])
    lines: list[str] = []
    summary = run_train(cfg, log=lines.append)
    run = Path(summary["run_dir"])
    assert set(summary["dev"]) == {"base", "rl"} and summary["dev"]["rl"]["n"] == 2
    for f in ("config.toml", "metrics.jsonl", "samples.jsonl", "summary.json"):
        assert (run / f).exists(), f
    assert (run / "checkpoints" / "checkpoint-1").is_dir() and (run / "final").is_dir()
    assert any("after RL" in x for x in lines)
    summary2 = run_train(resume=run, log=lines.append)  # already finished: no step is repeated
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert summary2["dev"]["rl"]["em"] == summary["dev"]["rl"]["em"]


def test_two_hindsearch_steps_with_the_lm_judge(world, tok, tmp_path):
    """Two steps of --method hindsearch with the default LM judge (the frozen initial policy) writing real
    critiques by greedy generation; every failed rollout with a search is judged, and each critique is
    either used for distillation or counted as a fallback."""
    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ['method="hindsearch"', "train.kl_coef=0.0", 'hindsearch.judge_kind="lm"',
                                         "hindsearch.critique_max_tokens=12"])
    run = tmp_path / "run"
    trainer, _ = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    trainer.train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["hind/failed"] == 2.0 and r["hind/eligible"] == 2.0  # odd rollouts answer wrongly, after a search
        assert r["hind/judge_kind_oracle"] == 0.0 and r["hind/judge_time"] > 0
        assert r["hind/critiques"] + r["hind/degenerate"] + r["hind/judge_errors"] == r["hind/eligible"]
        assert torch.isfinite(torch.tensor([r["loss"], r["hind/loss"]])).all()
        if r["hind/critiques"] > 0:
            assert r["hind/teacher_time"] > 0 and r["hind/distill_tokens"] > 0
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    judged = [s["hind"] for s in samples if s["reward"] == 0 and "hind" in s]
    assert judged and all(j["judge_kind"] == "lm" and j["critique_raw"] for j in judged)
    assert all(j["critique_usable"] == ("distill_tokens" in j) for j in judged)


# ------------------------------------------------------------------ TRL trainer with fake vLLM engines
# vLLM rollouts through TRL's real GRPO step: TRL's VLLMGeneration replaced by a fake holding a fake engine
# (test_vllm_backend), so TRL's weight sync, log-prob recomputation and importance sampling really run.
import copy  # noqa: E402
import math  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from test_rollout import spans_of  # noqa: E402
from test_vllm_backend import FakeClient, FakeLLM, VLLMEmulator, install_fake_vllm  # noqa: E402


def trainer_script(tok_, records):
    """Even rollouts of a turn-0 call search the question and answer the gold; odd ones search 'weather'."""
    by_q = {r.question: r for r in records}

    def script_batch(contexts):
        outs = []
        for j, ctx in enumerate(contexts):
            text = tok_.decode(ctx)
            rec = next(r for q, r in by_q.items() if q in text)
            if not text.rstrip().endswith("</information>"):  # turn 0 (the prompt itself names the tags)
                q = rec.question if j % 2 == 0 else "weather"
                outs.append(tok_(f"<search> {q} </search>", add_special_tokens=False)["input_ids"])
            elif "<search> weather </search>" in text:
                outs.append(tok_("<answer> nobody </answer>", add_special_tokens=False)["input_ids"])
            else:
                outs.append(tok_(f"<answer> {rec.golden_answers[0]} </answer>", add_special_tokens=False)["input_ids"])
        return outs

    return script_batch


def batch_logp(k):
    """Fixed sampler log-probs: the first token of a turn far below the model's (its ratio hits the cap)."""
    return -20.0 if k == 0 else -0.25


class BatchEmulator(VLLMEmulator):
    """The emulator with a script that sees the whole batch (row parity decides the turn-0 query)."""

    def __init__(self, tok_, script_batch):
        super().__init__(tok_, None, logp=batch_logp)
        self.script_batch, self._pending = script_batch, []

    def batch(self, contexts):
        self._pending = list(self.script_batch(contexts))

    def run(self, context, max_tokens, stop):
        s = self._pending.pop(0)
        self.script = lambda ctx: s
        return super().run(context, max_tokens, stop)


class BatchLLM(FakeLLM):
    def generate(self, prompts, params, use_tqdm=True):
        self.em.batch([p["prompt_token_ids"] for p in prompts])
        return super().generate(prompts, params, use_tqdm)


class BatchClient(FakeClient):
    def generate(self, prompts, **kw):
        self.em.batch(prompts)
        return super().generate(prompts, **kw)


def fake_vllm_generation(kind, em, events, sleep=False):
    class FakeVLLMGeneration:
        """Stands in for TRL's ``VLLMGeneration``: holds the fake engine, records weight syncs."""

        def __init__(self, **kw):
            self.mode, self.enable_sleep_mode, self.kw = kw["mode"], sleep, kw
            self._llm_weights_sleeping = sleep
            eng = (BatchLLM if kind == "colocate" else BatchClient)(em)
            eng.events = events
            if kind == "colocate":
                self.llm = eng
            else:
                self.vllm_client = eng
            self.syncs = 0

        def sync_weights(self):
            self.syncs += 1
            events.append("sync")
            self._llm_weights_sleeping = False

    return FakeVLLMGeneration


@pytest.mark.parametrize("kind", ["colocate", "server", "colocate-sleep"])
def test_trainer_vllm_rollouts_is_correction_and_metrics(kind, world, tok, tmp_path, monkeypatch):
    install_fake_vllm(monkeypatch)
    import trl.trainer.grpo_trainer as gt

    w, retriever = world
    records = w.splits["train"][:4]
    mode = kind.split("-")[0]
    cfg = Config.load(None, OVERRIDES + ['rollout.backend="vllm"', f'rollout.vllm_mode="{mode}"',
                                         "rollout.vllm_is_cap=2.0"])
    events: list[str] = []
    em = BatchEmulator(tok, trainer_script(tok, records))
    monkeypatch.setattr(gt, "VLLMGeneration", fake_vllm_generation(mode, em, events, sleep=kind.endswith("sleep")))
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    run = tmp_path / "run"
    ensure_on_disk(model, tok, run / "init")
    model.train()
    init = copy.deepcopy(model).eval()
    engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=2, backend=HFBackend(model, tok))
    trainer = build_trainer(cfg, model, tok, engine, records, run)
    assert trainer.args.vllm_importance_sampling_mode == "token_truncate"
    assert trainer.args.vllm_importance_sampling_clip_max == 2.0 and trainer.args.vllm_mode == mode
    assert trainer.args.vllm_max_model_length == cfg.rollout.max_total_tokens
    assert trainer.vllm_generation.kw["server_port"] == cfg.rollout.vllm_server_port
    steps: list[list] = []
    inner = trainer.rollout_func

    def capture(prompts, tr):
        out = inner(prompts, tr)
        steps.append(list(trainer._last_trajs))
        return out

    trainer.rollout_func = capture
    trainer.train()

    assert len(steps) == 2
    assert type(trainer.engine.backend).__name__ == ("VLLMBackend" if mode == "colocate" else "VLLMServerBackend")
    # weights are synced once per step, before that step's first generation
    gens = [e for e in events if e in ("sync", "generate")]
    firsts = [i for i, e in enumerate(gens) if e == "generate" and (i == 0 or gens[i - 1] == "sync")]
    assert gens.count("sync") == 2 and len(firsts) == 2 and gens[0] == "sync"
    if kind.endswith("sleep"):  # woken before the rollout, back to sleep (level 2) after the aux prepare
        cycle = [e for e in events if e != "generate"]
        assert cycle == ["sync", "wake:kv_cache", "sleep:2"] * 2
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/reward_mean"] == pytest.approx(0.5) and r["rollout/searches_per_rollout"] == 1.0
        # TRL's own mismatch keys and ours agree (one process)
        assert r["vllm/logp_diff_mean"] == pytest.approx(r["sampling/sampling_logp_difference/mean"], rel=1e-5)
        assert r["vllm/logp_diff_max"] == pytest.approx(r["sampling/sampling_logp_difference/max"], rel=1e-5)
        assert r["vllm/is_ratio_mean"] == pytest.approx(r["sampling/importance_sampling_ratio/mean"], rel=1e-5)
        assert r["vllm/is_ratio_max"] == pytest.approx(2.0)  # -20 sampler log-probs: capped
        assert r["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0)
        assert 0 < r["vllm/is_capped_frac"] < 1 and r["vllm/logp_nan_tokens"] == 0
        assert r["vllm/generated_tokens"] == sum(sum(t.gen_mask) for t in steps[r["step"] - 1])
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
    # independent check of step 1: the initial model's log-probs of the generated tokens vs the fixed ones
    diffs = []
    with torch.no_grad():
        for t in steps[0]:
            ids = torch.tensor([t.prompt_ids + t.completion_ids])
            lp = init(input_ids=ids).logits[0].float().log_softmax(-1)
            P = len(t.prompt_ids)
            for s, e in spans_of(t.gen_mask, 1):
                for k in range(s, e):
                    diffs.append(abs(float(lp[P + k - 1, t.completion_ids[k]]) - t.logprobs[k]))
                assert t.logprobs[s:e] == [batch_logp(k) for k in range(e - s)]
    assert rows[0]["vllm/logp_diff_mean"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-4)
    assert rows[0]["vllm/logp_diff_max"] == pytest.approx(max(diffs), rel=1e-4)


def test_colocate_tensor_parallel_is_refused(world, tok, tmp_path, monkeypatch):
    install_fake_vllm(monkeypatch)
    import trl.trainer.grpo_trainer as gt

    w, retriever = world
    records = w.splits["train"][:2]
    cfg = Config.load(None, OVERRIDES + ['rollout.backend="vllm"', "train.trl.vllm_tensor_parallel_size=2"])
    monkeypatch.setattr(gt, "VLLMGeneration", fake_vllm_generation("colocate", None, []))
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    ensure_on_disk(model, tok, tmp_path / "init")
    engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=2, backend=HFBackend(model, tok))
    with pytest.raises(ValueError, match="tensor parallel size 1"):
        build_trainer(cfg, model, tok, engine, records, tmp_path / "run")


def test_server_mode_client_on_every_process(monkeypatch, tok):
    """TRL builds its VLLMClient on the main process only; the other processes get their own for generation."""
    import trl.generation.vllm_client as vc

    from hindsearch.train.trainer import HindsearchGRPOTrainer

    made = []
    monkeypatch.setattr(vc, "VLLMClient", lambda **kw: made.append(kw) or SimpleNamespace(kw=kw))
    args = SimpleNamespace(vllm_server_base_url=None, vllm_server_host="10.0.0.5", vllm_server_port=8001,
                           vllm_group_port=51216, vllm_server_timeout=12.0)
    me = SimpleNamespace(_vllm_attached=False, vllm_generation=SimpleNamespace(), processing_class=tok,
                         accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=None, vllm_mode="server",
                         engine=SimpleNamespace(backend=None), args=args)
    HindsearchGRPOTrainer._attach_vllm(me)
    assert made == [dict(base_url="http://10.0.0.5:8001", group_port=51216, connection_timeout=12.0)]
    assert type(me.engine.backend).__name__ == "VLLMServerBackend" and me.engine.backend.client.kw == made[0]
    assert me.engine.backend.eos_ids == {tok.eos_token_id}
    HindsearchGRPOTrainer._attach_vllm(me)  # once
    assert len(made) == 1


class HFSamplerLLM:
    """A 'vLLM' that samples with the training model itself (the HF backend), so its log-probs are the trainer's."""

    def __init__(self, model, tok):
        self.hf, self.tok, self.calls = HFBackend(model, tok), tok, 0

    def generate(self, prompts, params, use_tqdm=True):
        from hindsearch.core.sampling import SamplingParams

        self.calls += 1
        outs = []
        for p, sp in zip(prompts, params):
            kw = sp.kw
            g = torch.Generator().manual_seed(kw["seed"])
            (o,) = self.hf.generate([p["prompt_token_ids"]], [kw["max_tokens"]],
                                    SamplingParams(kw["temperature"], kw["top_p"]), kw["stop"], g)
            text = self.tok.decode(o.ids)
            stop = next((s for s in kw["stop"] if s in text), None)
            finish, reason = {"stop": ("stop", stop), "eos": ("stop", None), "length": ("length", None)}[o.finish]
            lp = [{t: SimpleNamespace(logprob=v, rank=1)} for t, v in zip(o.ids, o.logprobs)]
            c = SimpleNamespace(token_ids=o.ids, logprobs=lp, finish_reason=finish, stop_reason=reason, text=text)
            outs.append(SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[c]))
        return outs


def test_trainer_vllm_sampler_with_the_trainers_distribution_gives_unit_ratios(world, tok, tmp_path, monkeypatch):
    """When the sampler's distribution is the trainer's, the logged mismatch is ~0 and every IS ratio ~1."""
    install_fake_vllm(monkeypatch)
    import trl.trainer.grpo_trainer as gt

    w, retriever = world
    records = w.splits["train"][:4]
    cfg = Config.load(None, OVERRIDES + ['rollout.backend="vllm"', "rollout.temperature=0.7"])
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    run = tmp_path / "run"
    ensure_on_disk(model, tok, run / "init")
    model.train()
    sampler = HFSamplerLLM(model, tok)

    class Gen:
        def __init__(self, **kw):
            self.mode, self.enable_sleep_mode, self.llm = kw["mode"], False, sampler

        def sync_weights(self):
            pass

    monkeypatch.setattr(gt, "VLLMGeneration", Gen)
    engine = RolloutEngine(model, tok, retriever, cfg.rollout, topk=2, backend=HFBackend(model, tok))
    trainer = build_trainer(cfg, model, tok, engine, records, run)
    trainer.train()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sampler.calls >= 2 and [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["vllm/generated_tokens"] > 0
        assert r["vllm/logp_diff_max"] < 1e-4, r["vllm/logp_diff_max"]
        assert abs(r["vllm/is_ratio_min"] - 1) < 1e-4 and abs(r["vllm/is_ratio_max"] - 1) < 1e-4
        assert r["vllm/is_capped_frac"] == 0


def test_update_shares_runs_every_backward_even_when_grpo_has_no_gradient():
    """Ranks must run the same backwards (sharded LM head): the term norms are taken before the zero check."""
    from hindsearch.train.aux_loss import update_shares

    h = torch.randn(2, 3, 4, requires_grad=True)
    calls = []
    h.register_hook(lambda g: calls.append(1))
    grpo = (h * 0.0).sum()  # requires grad, zero gradient: every group had equal rewards
    term = (h ** 2).sum()
    assert update_shares(grpo, [("hind", term)], [h]) == {}
    assert len(calls) == 2  # the GRPO backward and the term's: not skipped on this rank
    shares = update_shares(h.sum(), [("hind", 2 * h.sum())], [h])
    assert shares == {"hind": pytest.approx(2.0)}



def test_metric_reduction_over_processes():
    """One process passes its metrics through unchanged; the trainer sums a term metric over processes exactly when
    its term declares ``sum`` (tests/test_terms.py; the 2-process check is tests/test_multiprocess.py:
    hind/failed = 1 + 0)."""
    from types import SimpleNamespace

    from hindsearch.hindsight.methods.hindsearch import HindSearchTerm
    from hindsearch.hindsight.methods.igsd import IGSDTerm
    from hindsearch.train.callbacks import gather_metrics
    from hindsearch.train.trainer import HindsearchGRPOTrainer

    m = {"hind/failed": 2.0, "hind/failed_frac": 0.5}
    assert gather_metrics(m, SimpleNamespace(num_processes=1), lambda _k: True) == m
    fake = SimpleNamespace(terms=[HindSearchTerm, IGSDTerm])
    summed = [k for k in ("hind/failed", "hind/critiques", "hind/judge_time", "igsd/time_proposal",
                          "igsd/positions_selected") if HindsearchGRPOTrainer._summed(fake, k)]
    averaged = [k for k in ("hind/failed_frac", "hind/critique_minus_neutral", "hind/judge_kind_oracle",
                            "igsd/mean_gate", "hind/loss", "hind/grad_share", "igsd/L_igsd")
                if not HindsearchGRPOTrainer._summed(fake, k)]
    assert len(summed) == 5 and len(averaged) == 7


@pytest.mark.parametrize("method", ["hindsearch", "igsd"])
def test_micro_batches_do_not_change_the_hindsight_weight(method, world, tok, tmp_path):
    """One SGD step with micro-batches of one rollout equals one step on the whole batch: each micro-batch's term
    loss is weighted by its share of the step's positions (a token-mean over 2 failed rollouts must not be
    diluted by the micro-batches of the 2 successful ones)."""
    w, retriever = world
    base = OVERRIDES + [f'method="{method}"', "train.steps=1", "train.kl_coef=0.0", 'hindsearch.judge_kind="oracle"',
                        "hindsearch.lam=5.0", "igsd.lam=50.0", "igsd.max_positions_per_rollout=2",
                        "igsd.max_query_tokens=4", "igsd.n_controls=1", "train.lr=0.5", 'train.trl.optim="sgd"',
                        "train.grad_share_steps=0",
                        # the tiny model's proposals are random tokens: verify and weigh them all (the weighting is
                        # what is tested, not the proposal filter or the gate)
                        'igsd.proposals="any"', 'igsd.gate="none"', 'igsd.hindsight="answer"']
    deltas = {}
    for mb in ("none", "1"):
        extra = [] if mb == "none" else [f"train.micro_batch_size={mb}"]
        cfg = Config.load(None, base + extra)
        trainer, model = make_trainer(cfg, tok, retriever, w.splits["train"][:2], tmp_path / f"mb-{mb}")
        before = [p.detach().clone() for p in model.parameters()]
        trainer.train()
        deltas[mb] = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
        rows = [json.loads(x) for x in (tmp_path / f"mb-{mb}" / "metrics.jsonl").read_text().splitlines()]
        name = "hind" if method == "hindsearch" else "igsd"
        assert rows[0][f"{name}/loss"] != 0.0, rows[0]  # the term really contributed
    full, micro = deltas["none"], deltas["1"]
    assert full.norm() > 0
    assert (micro - full).norm() / full.norm() < 1e-4, float((micro - full).norm() / full.norm())


class NoSearchEngine(ScriptedEngine):
    """Rollouts that never search: even ones answer the gold at once, odd ones answer ``nobody``. GRPO has a
    gradient (rewards 1 / 0 in every group) and HindSearch has failed rollouts but none eligible (no query token)."""

    def rollout(self, records, num_generations=1, **kw):
        enc = lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        rows = [r for r in records for _ in range(num_generations)]
        self._scripts = [[enc(f"<answer> {r.golden_answers[0] if i % 2 == 0 else 'nobody'} </answer>")]
                         for i, r in enumerate(rows)]
        return RolloutEngine.rollout(self, records, num_generations, **kw)


@pytest.mark.parametrize("method", ["hindsearch", "igsd"])
def test_a_step_with_nothing_to_distil_is_grpos_step(method, world, tok, tmp_path, monkeypatch):
    """With no eligible rollout (one process), a hindsight step does GRPO's work and nothing more: no judge or
    teacher forward, no LM head over the captured hidden states, no gradient-share backwards (GRPO has a gradient,
    the term has no position: its share is 0 without computing it); its metrics are still logged (exact zeros) and
    the weights after the step are GRPO's, bit for bit. Before, each micro-batch ran the LM head on zero positions
    and a gradient-share step two extra backwards through it."""
    import hindsearch.train.trainer as trainer_mod

    w, retriever = world
    records = w.splits["train"][:2]
    shares = []
    real_shares = trainer_mod.update_shares
    monkeypatch.setattr(trainer_mod, "update_shares", lambda *a: shares.append(1) or real_shares(*a))
    weights, counts = {}, {}
    for m in ("grpo", method):
        cfg = Config.load(None, OVERRIDES + [f'method="{m}"', "train.steps=1", "train.kl_coef=0.0",
                                             'hindsearch.judge_kind="lm"', "igsd.max_positions_per_rollout=2",
                                             "igsd.max_query_tokens=4", "igsd.n_controls=1", "train.micro_batch_size=1"])
        model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
        ensure_on_disk(model, tok, tmp_path / m / "init")
        model.train()
        engine = NoSearchEngine(model, tok, retriever, cfg.rollout)
        trainer = build_trainer(cfg, model, tok, engine, records, tmp_path / m)
        n = {"lm_head": 0, "frozen": 0}
        model.get_output_embeddings().register_forward_hook(lambda *_: n.__setitem__("lm_head", n["lm_head"] + 1))
        if trainer.aux_ctx is not None:  # the LM judge and the frozen teacher (IGSD's proposer too)
            trainer.aux_ctx.frozen.register_forward_hook(lambda *_: n.__setitem__("frozen", n["frozen"] + 1))
        trainer.train()
        weights[m] = [p.detach().clone() for p in model.parameters()]
        counts[m] = n
        rows = [json.loads(x) for x in (tmp_path / m / "metrics.jsonl").read_text().splitlines()]
    row = rows[0]
    name = {"hindsearch": "hind", "igsd": "igsd"}[method]
    assert row["rollout/reward_mean"] == pytest.approx(0.5) and row["grad_norm"] > 0  # GRPO has work
    assert row[f"{name}/loss"] == 0.0 and row[f"{name}/grad_share"] == 0.0  # logged as before, computed for free
    if method == "hindsearch":
        assert row["hind/failed"] == 2.0 and row["hind/eligible"] == 0.0 and row["hind/distill_tokens"] == 0.0
        assert row["hind/tokens"] == 0.0 and "hind/mean_lT_minus_lS" in row
    assert counts[method]["frozen"] == 0 and counts[method] == counts["grpo"], counts  # lm_head: the rollouts' only
    assert shares == []
    assert all(torch.equal(a, b) for a, b in zip(weights["grpo"], weights[method]))


def test_with_several_processes_the_lm_head_still_runs_on_every_micro_batch(world, tok, tmp_path, monkeypatch):
    """The shortcut is for one process only: under ``lockstep.active()`` (emulated here, the collectives answered by
    this rank alone) every micro-batch applies the LM head even with nothing to distil (a sharded head's gather
    must pair up on every rank), and the gradient-share backwards are skipped when no rank has a position."""
    import hindsearch.train.trainer as trainer_mod
    from hindsearch.core import lockstep as sync

    monkeypatch.setattr(sync, "active", lambda: True)
    monkeypatch.setattr(sync, "any_rank", lambda flag: flag)
    shares = []
    real_shares = trainer_mod.update_shares
    monkeypatch.setattr(trainer_mod, "update_shares", lambda *a: shares.append(1) or real_shares(*a))
    w, retriever = world
    cfg = Config.load(None, OVERRIDES + ['method="hindsearch"', "train.steps=1", "train.kl_coef=0.0",
                                         'hindsearch.judge_kind="oracle"', "train.micro_batch_size=1"])
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    ensure_on_disk(model, tok, tmp_path / "init")
    model.train()
    trainer = build_trainer(cfg, model, tok, NoSearchEngine(model, tok, retriever, cfg.rollout), w.splits["train"][:2], tmp_path)
    losses, empty_heads = [], []
    trainer.compute_loss = (lambda f: lambda *a, **k: losses.append(1) or f(*a, **k))(trainer.compute_loss)
    model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _o: empty_heads.append(1) if args[0].numel() == 0 else None)
    trainer.train()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["hind/eligible"] == 0.0 and row["hind/grad_share"] == 0.0 and shares == []
    assert len(losses) == 4 and len(empty_heads) == 4  # 4 micro-batches of one rollout, the head on 0 positions
