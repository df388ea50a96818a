"""vLLM rollouts on CPU: colocate (``vllm.LLM``) and server (TRL's ``VLLMClient``) backends against fake engines.

The fakes return fixed (scripted) ids and fixed log-probs and apply vLLM's stop rules (``VLLMEmulator``):
the scheduler's length cap is checked before EOS, a stop string is found in the *decoded* text (so the
stopping token may carry characters after it) and the text is cut after the stop string while the ids are
not. The HF backend is the reference: a multi-turn rollout forced to the same ids must give the same
trajectory (ids, masks, turns, spans, stop reasons) with the fake's log-probs on generated tokens.
The trainer tests run TRL's real GRPO step with TRL's ``VLLMGeneration`` replaced by a fake that holds the
fake engine, so TRL's weight sync, log-prob recomputation and importance sampling really run.
"""

from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from hindsearch.agent import protocol
from hindsearch.core.sampling import SamplingParams
from hindsearch.agent.engine import RolloutEngine
from hindsearch.agent.hf_backend import HFBackend
from hindsearch.agent.vllm_backend import (
    VLLMBackend, VLLMServerBackend, budget_groups, classify_finish, pick_sampled, sampling_kwargs, stop_token_ids,
)
from hindsearch.config import Config, RolloutConfig
from hindsearch.records import QARecord
from hindsearch.train import rollout_adapter as ra
from test_rollout import Q1, Q2, ScriptHook, retriever, spans_of  # noqa: F401 - fixtures (tests dir on sys.path); tok, model: conftest

pytestmark = pytest.mark.usefixtures("one_thread")

Q3 = QARecord("q3", "Where does the Tesh flow", ["Amber Sea"])


def fixed_logp(k: int) -> float:
    """The fake engine's log-prob of its k-th new token in a turn."""
    return -(0.1 + 0.01 * k)


class VLLMEmulator:
    """vLLM's stop rules over a scripted id stream (``script(context) -> ids``; EOS after the script ends)."""

    def __init__(self, tok, script, logp=fixed_logp):
        self.tok, self.script, self.logp, self.eos = tok, script, logp, tok.eos_token_id

    def run(self, context, max_tokens, stop):
        stream, ids = self.script(list(context)), []
        finish, reason, text = None, None, ""
        for k in range(max_tokens):
            t = stream[k] if k < len(stream) else self.eos
            ids.append(t)
            if len(ids) >= max_tokens:  # vLLM v1's scheduler caps the length before it looks at EOS
                finish, reason = "length", None
            elif t == self.eos:
                finish, reason = "stop", None
            text = self.tok.decode(ids, skip_special_tokens=True)
            hit = next((s for s in stop if s in text), None)
            if hit is not None:  # the detokenizer's stop check: text cut after the stop, ids kept
                finish, reason, text = "stop", hit, text[: text.index(hit) + len(hit)]
            if finish:
                break
        return ids, [self.logp(k) for k in range(len(ids))], finish, reason, text


class FakeSamplingParams:
    def __init__(self, **kw):
        self.kw = kw


class FakeLLM:
    """``vllm.LLM.generate`` over the emulator; records every call's prompts and sampling params."""

    def __init__(self, emulator):
        self.em, self.calls, self.events = emulator, [], []

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append(([p["prompt_token_ids"] for p in prompts], [p.kw for p in params]))
        self.events.append("generate")
        outs = []
        for p, sp in zip(prompts, params):
            ids, lps, finish, reason, text = self.em.run(p["prompt_token_ids"], sp.kw["max_tokens"], sp.kw["stop"])
            lp = [{t: SimpleNamespace(logprob=v, rank=1)} for t, v in zip(ids, lps)]
            c = SimpleNamespace(token_ids=ids, logprobs=lp, finish_reason=finish, stop_reason=reason, text=text)
            outs.append(SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[c]))
        return outs

    def wake_up(self, tags=None):
        self.events.append(f"wake:{','.join(tags or [])}")

    def sleep(self, level=1):
        self.events.append(f"sleep:{level}")


class FakeClient:
    """TRL's ``VLLMClient.generate`` (its signature and reply) over the emulator; records every request."""

    def __init__(self, emulator):
        self.em, self.calls, self.events = emulator, [], []

    def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None):
        assert all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts), "token-id prompts"
        self.calls.append(dict(prompts=prompts, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                               logprobs=logprobs, generation_kwargs=dict(generation_kwargs or {})))
        self.events.append("generate")
        stop = (generation_kwargs or {}).get("stop", [])
        runs = [self.em.run(p, max_tokens, stop) for p in prompts]
        return {"prompt_ids": prompts, "completion_ids": [r[0] for r in runs],
                "logprobs": [[[v] for v in r[1]] for r in runs], "logprob_token_ids": [[[t] for t in r[0]] for r in runs]}

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}


def install_fake_vllm(monkeypatch):
    """A ``vllm`` module with ``SamplingParams`` (records its kwargs) for the colocate backend.

    TRL is imported first: it probes for vLLM at import time and must see that it is not installed."""
    import trl.trainer.grpo_trainer  # noqa: F401

    mod = types.ModuleType("vllm")
    mod.SamplingParams = FakeSamplingParams
    mod.LLM = None
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch)


# ------------------------------------------------------------------ request building
def test_sampling_kwargs_and_budget_groups():
    kw = sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9), 32, protocol.STOP_STRINGS, seed=5)
    assert kw == dict(n=1, max_tokens=32, stop=list(protocol.STOP_STRINGS), include_stop_str_in_output=True,
                      logprobs=0, temperature=0.7, top_p=0.9, seed=5)
    greedy = sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, greedy=True), 8, ["</search>"], seed=5)
    assert greedy["temperature"] == 0.0 and greedy["top_p"] == 1.0 and "seed" not in greedy
    assert sampling_kwargs(SamplingParams(temperature=0.0), 8, [])["temperature"] == 0.0
    assert budget_groups([32, 0, 5, 32, 5, 7]) == {32: [0, 3], 5: [2, 4], 7: [5]}


def test_colocate_requests(tok, fake_vllm):
    llm = FakeLLM(VLLMEmulator(tok, lambda ctx: tok("<search> a </search>", add_special_tokens=False)["input_ids"]))
    be = VLLMBackend(llm, {tok.eos_token_id})
    ctxs = [[5, 6, 7], [8, 9], [10]]
    g = torch.Generator().manual_seed(3)
    outs = be.generate(ctxs, [12, 0, 4], SamplingParams(temperature=0.8, top_p=0.95), protocol.STOP_STRINGS, g)
    (prompts, params), = llm.calls
    assert prompts == [[5, 6, 7], [10]]  # token-id prompts; the row with no budget is not sent
    assert [p["max_tokens"] for p in params] == [12, 4]  # per-row budgets
    for p in params:
        assert p["stop"] == list(protocol.STOP_STRINGS) and p["include_stop_str_in_output"] is True
        assert p["logprobs"] == 0 and p["temperature"] == 0.8 and p["top_p"] == 0.95 and p["n"] == 1
    seeds = [p["seed"] for p in params]
    assert len(set(seeds)) == 2
    assert outs[1].ids == [] and outs[1].finish == "length"
    assert outs[2].finish == "length" and len(outs[2].ids) == 4
    assert outs[0].finish == "stop" and tok.decode(outs[0].ids) == "<search> a </search>"
    assert outs[0].logprobs == [pytest.approx(fixed_logp(k)) for k in range(len(outs[0].ids))]
    # seeds come from the rollout generator: the same seed gives the same requests, the next turn new seeds
    be.generate(ctxs, [12, 0, 4], SamplingParams(temperature=0.8), protocol.STOP_STRINGS, g)
    be.generate(ctxs, [12, 0, 4], SamplingParams(temperature=0.8), protocol.STOP_STRINGS, torch.Generator().manual_seed(3))
    assert [p["seed"] for p in llm.calls[2][1]] == seeds and [p["seed"] for p in llm.calls[1][1]] != seeds
    # greedy: temperature 0 and no seed
    be.generate(ctxs, [3, 3, 3], SamplingParams(greedy=True), protocol.STOP_STRINGS, g)
    assert all(p["temperature"] == 0.0 and "seed" not in p for p in llm.calls[-1][1])
    with pytest.raises(ValueError, match="logits hooks"):
        be.generate(ctxs, [1, 1, 1], SamplingParams(), protocol.STOP_STRINGS, None, lambda r, i, lg: lg)
    assert be.stats["requests"] == 2 + 2 + 2 + 3 and be.stats["generated_tokens"] > 0


def test_server_requests_grouped_by_budget(tok):
    client = FakeClient(VLLMEmulator(tok, lambda ctx: tok("<answer> b </answer>", add_special_tokens=False)["input_ids"]))
    be = VLLMServerBackend(client, lambda ids: tok.decode(ids, skip_special_tokens=False), {tok.eos_token_id})
    ctxs = [[5], [6, 7], [8], [9]]
    outs = be.generate(ctxs, [16, 3, 16, 0], SamplingParams(temperature=0.6, top_p=0.8), protocol.STOP_STRINGS,
                       torch.Generator().manual_seed(0))
    by_budget = {c["max_tokens"]: c for c in client.calls}
    assert set(by_budget) == {16, 3} and len(client.calls) == 2  # one request per distinct max_tokens
    assert by_budget[16]["prompts"] == [[5], [8]] and by_budget[3]["prompts"] == [[6, 7]]
    for c in client.calls:
        assert c["generation_kwargs"] == {"stop": list(protocol.STOP_STRINGS), "include_stop_str_in_output": True}
        assert c["temperature"] == 0.6 and c["top_p"] == 0.8 and c["logprobs"] == 0 and c["n"] == 1
        assert "seed" not in c["generation_kwargs"]  # one seed per request would give a group identical samples
    assert [o.finish for o in outs] == ["stop", "length", "stop", "length"]
    assert outs[3].ids == [] and len(outs[1].ids) == 3
    assert tok.decode(outs[0].ids) == "<answer> b </answer>"
    assert outs[0].logprobs == [pytest.approx(fixed_logp(k)) for k in range(len(outs[0].ids))]


# ------------------------------------------------------------------ stop handling
def test_classify_finish_and_pick_sampled():
    eos = {2, 7}
    assert classify_finish([5, 2], eos, False, "length") == "eos"  # EOS as the last allowed token: vLLM says length
    assert classify_finish([5, 2], eos, False, "stop") == "eos"
    assert classify_finish([5, 7], eos, False, "stop") == "eos"  # a generation-config stop id (int stop_reason)
    assert classify_finish([5, 9], eos, False, "stop") == "eos"  # stopped on an id we were not told about
    assert classify_finish([5, 9], eos, True, "stop") == "stop"
    assert classify_finish([5, 9], eos, True, "length") == "stop"  # stop string in the last allowed token
    assert classify_finish([5, 9], eos, False, "length") == "length"
    with pytest.raises(RuntimeError, match="abort"):
        classify_finish([5], eos, False, "abort")
    assert pick_sampled([4, 5], [[-0.5, -1.0], [None]], [[9, 4], [5]])[0] == -1.0
    assert math.isnan(pick_sampled([4, 5], [[-0.5], [None]], [[4], [5]])[1])  # vLLM could not score it
    assert math.isnan(pick_sampled([4], [[-0.5]], [[3]])[0])  # sampled token absent
    with pytest.raises(RuntimeError, match="2 log-prob positions for 1 tokens"):
        pick_sampled([4], [[-0.5], [-1.0]], [[4], [5]])


def test_stop_inside_a_token_keeps_the_whole_token(tok, fake_vllm):
    dot = tok.convert_tokens_to_ids(">.")  # "</search" + ">." : the stop string ends inside the last token
    ids = tok("<search> Zorbin Quell </search", add_special_tokens=False)["input_ids"] + [dot, 11, 12]
    llm = FakeLLM(VLLMEmulator(tok, lambda ctx: ids))
    (o,) = VLLMBackend(llm, {tok.eos_token_id}).generate([[5]], [32], SamplingParams(), protocol.STOP_STRINGS)
    assert o.ids == ids[:-2] and o.finish == "stop" and tok.decode(o.ids).endswith("</search>.")
    # the server client reports no stop reason: found in the decoded ids
    client = FakeClient(VLLMEmulator(tok, lambda ctx: ids))
    (s,) = VLLMServerBackend(client, lambda x: tok.decode(x), {tok.eos_token_id}).generate(
        [[5]], [32], SamplingParams(), protocol.STOP_STRINGS)
    assert s.ids == o.ids and s.finish == "stop" and s.logprobs == o.logprobs


# ------------------------------------------------------------------ full multi-turn rollouts
def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def scripts_for(tok):
    dot = tok.convert_tokens_to_ids(">.")
    return [
        [enc(tok, "<search> Zorbin Quell birthplace </search") + [dot], enc(tok, "<answer> Maravel </answer>")],
        [enc(tok, "hmm no tags " * 12), enc(tok, "I give up.")],  # length -> invalid turn; then EOS
        [enc(tok, "<search> Glass Orchard </search>"), enc(tok, "<answer> Ilda Vorn </answer>") + [tok.eos_token_id]],
    ]


def id_hook(tok, scripts):
    """HF reference: ``test_rollout.ScriptHook`` forcing raw ids ``scripts[traj][turn]`` then EOS."""
    hook = ScriptHook(tok, [])
    hook.ids = scripts
    return hook


class ContextScript:
    """The fake engines' script: the record is found by its prompt ids, the turn by how often it was asked."""

    def __init__(self, prompts, scripts):
        self.prompts, self.scripts, self.seen = prompts, scripts, [0] * len(prompts)

    def __call__(self, ctx):
        r = next(i for i, p in enumerate(self.prompts) if ctx[: len(p)] == p)
        turn, self.seen[r] = self.seen[r], self.seen[r] + 1
        return self.scripts[r][turn] if turn < len(self.scripts[r]) else []


def rollout_with(backend_kind, model, tok, retriever, records, scripts, **cfg):
    kw = dict(max_turns=2, max_new_tokens_per_turn=24, max_total_tokens=1024, temperature=1.0)
    kw.update(cfg)
    rc = RolloutConfig(**kw)
    if backend_kind == "hf":
        eng = RolloutEngine(model, tok, retriever, rc, topk=2, retries=0, backend=HFBackend(model, tok),
                            logits_hook=id_hook(tok, scripts))
        return eng.rollout(records, seed=0), None
    eng = RolloutEngine(model, tok, retriever, rc, topk=2, retries=0, backend=HFBackend(model, tok))
    em = VLLMEmulator(tok, ContextScript([eng.prompt_ids(r.question) for r in records], scripts))
    eos = stop_token_ids(tok, model)
    fake = FakeLLM(em) if backend_kind == "colocate" else FakeClient(em)
    eng.backend = VLLMBackend(fake, eos) if backend_kind == "colocate" else VLLMServerBackend(
        fake, lambda ids: tok.decode(ids, skip_special_tokens=False), eos)
    return eng.rollout(records, seed=0), fake


def assert_same_bookkeeping(ref, got):
    for a, b in zip(ref, got, strict=True):
        assert b.completion_ids == a.completion_ids
        assert b.gen_mask == a.gen_mask and b.query_mask == a.query_mask
        assert [(t.action, t.content, t.gen_span, t.inject_span, t.query_span) for t in b.turns] == \
            [(t.action, t.content, t.gen_span, t.inject_span, t.query_span) for t in a.turns]
        assert (b.stop_reason, b.answer, b.em) == (a.stop_reason, a.answer, a.em)
        # vLLM's sampling log-probs on generated tokens, 0.0 on injected ones
        assert len(b.logprobs) == len(b.completion_ids)
        for s, e in spans_of(b.gen_mask, 1):
            assert b.logprobs[s:e] == pytest.approx([fixed_logp(k) for k in range(e - s)])
        assert all(b.logprobs[i] == 0.0 for s, e in spans_of(b.gen_mask, 0) for i in range(s, e))


@pytest.mark.parametrize("kind", ["colocate", "server"])
def test_multiturn_rollout_matches_the_hf_backend(kind, model, tok, retriever, fake_vllm):
    scripts = scripts_for(tok)
    ref, _ = rollout_with("hf", model, tok, retriever, [Q1, Q2, Q3], scripts)
    got, fake = rollout_with(kind, model, tok, retriever, [Q1, Q2, Q3], scripts)
    assert_same_bookkeeping(ref, got)
    t1, t2, t3 = got
    # stop inside a token: the whole '>.' token is kept, the action parsed, the search executed
    a, b = t1.turns[0].gen_span
    assert tok.decode(t1.completion_ids[a:b]).endswith("</search>.") and t1.turns[0].action == "search"
    assert t1.stop_reason == "answer" and t1.answer == "Maravel"
    # length: an invalid turn gets Search-R1's notice; then a tag-less turn ending in EOS
    assert [t.action for t in t2.turns] == ["invalid", "invalid"] and t2.stop_reason == "eos"
    assert t2.completion_ids[-1] == tok.eos_token_id
    # an answer followed by a scripted EOS: vLLM stops at '</answer>', the EOS is never sampled
    assert t3.completion_ids[-1] != tok.eos_token_id and t3.stop_reason == "answer"
    assert fake.calls, "the fake engine was not used"


@pytest.mark.parametrize("kind", ["colocate", "server"])
def test_total_budget_cuts_match_the_hf_backend(kind, model, tok, retriever, fake_vllm):
    search = enc(tok, "<search> Zorbin Quell </search>")
    probe = RolloutEngine(model, tok, retriever, RolloutConfig(), backend=HFBackend(model, tok))
    P = len(probe.prompt_ids(Q1.question))
    # 1) room for the search turn and 5 ids of its information block: the block is cut, the trajectory ends
    # 2) room for 4 ids only: the turn itself is cut by the total budget ('truncated')
    for room, scripts, n_budget in [(P + len(search) + 5, [[search, enc(tok, "<answer> x </answer>")]], len(search) + 5),
                                    (P + 4, [[enc(tok, "<think> a very long thought that goes on")]], 4)]:
        ref, _ = rollout_with("hf", model, tok, retriever, [Q1], scripts, max_total_tokens=room)
        got, fake = rollout_with(kind, model, tok, retriever, [Q1], scripts, max_total_tokens=room)
        assert_same_bookkeeping(ref, got)
        assert got[0].stop_reason == "length" and len(got[0].prompt_ids) + len(got[0].completion_ids) == room
        budgets = [p["max_tokens"] for _, ps in fake.calls for p in ps] if kind == "colocate" else \
            [c["max_tokens"] for c in fake.calls]
        assert budgets == [n_budget]  # the room left, not max_new_tokens_per_turn; no second turn
    assert got[0].turns[-1].action == "truncated"


def test_eos_as_the_last_allowed_token(model, tok, retriever, fake_vllm):
    """vLLM v1 reports 'length' when EOS is the budget's last token; the HF backend says 'eos' (reference)."""
    scripts = [[enc(tok, "I do not know")]]
    n = len(scripts[0][0]) + 1
    ref, _ = rollout_with("hf", model, tok, retriever, [Q1], scripts, max_new_tokens_per_turn=n)
    got, _ = rollout_with("colocate", model, tok, retriever, [Q1], scripts, max_new_tokens_per_turn=n)
    assert_same_bookkeeping(ref, got)
    assert got[0].stop_reason == "eos" and got[0].completion_ids[-1] == tok.eos_token_id


# ------------------------------------------------------------------ log-prob mismatch / IS math
def test_truncated_is_and_mismatch_on_known_tensors():
    nan = float("nan")
    train = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.2, -3.0, 0.0, 0.0]])
    samp = torch.tensor([[-1.5, -1.0, nan, -3.0], [-0.2, -4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    r = ra.truncated_is_ratio(train, samp, mask, cap=2.0)
    expect = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0, 1.0], [1.0, 2.0, 1.0, 1.0]])  # exp(1) capped at 2
    assert torch.allclose(r, expect)
    s = ra.mismatch_sums(train, samp, mask, cap=2.0)
    assert s.tolist() == pytest.approx([4, 0.5 + 1.0 + 0.0 + 1.0, 1.0, math.exp(0.5) + math.exp(-1) + 1 + 2,
                                        math.exp(-1), 2.0, 1, 1])
    m = ra.mismatch_metrics(s)
    assert m == pytest.approx({"logp_diff_mean": 2.5 / 4, "logp_diff_max": 1.0,
                               "is_ratio_mean": (math.exp(0.5) + math.exp(-1) + 3) / 4, "is_ratio_min": math.exp(-1),
                               "is_ratio_max": 2.0, "is_capped_frac": 0.25, "logp_nan_tokens": 1.0})
    # several processes: sums add, extremes combine; a process with no token does not disturb min/max
    empty = ra.mismatch_sums(train, samp, torch.zeros_like(mask), cap=2.0)
    both = ra.mismatch_metrics(torch.stack([s, empty, s]))
    assert both["logp_diff_mean"] == pytest.approx(m["logp_diff_mean"]) and both["is_ratio_min"] == m["is_ratio_min"]
    assert ra.mismatch_metrics(empty) == {"logp_nan_tokens": 0.0}
    # TRL's token_truncate formula, written out
    trl = torch.clamp(torch.exp(torch.nan_to_num((train - samp) * mask, nan=0.0)), max=2.0)
    assert torch.equal(r, trl)


def test_vllm_config_fields_are_checked():
    from hindsearch.config import ConfigError

    for bad, msg in [('rollout.vllm_mode="remote"', "rollout.vllm_mode"), ("rollout.vllm_is_cap=0.5", "vllm_is_cap"),
                     ("rollout.vllm_server_port=0", "vllm_server_port"), ("rollout.vllm_server_timeout=0", "timeout")]:
        with pytest.raises(ConfigError, match=msg):
            Config.load(None, [bad])
