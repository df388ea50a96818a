"""The HindSearch judge behind an OpenAI-compatible endpoint (``hindsearch.judge_kind = openai``), against a real
server (tests/openai_server.py: uvicorn on 127.0.0.1, a tiny model built from a config, greedy transformers decode):
the same prompt, cleaning and redaction as the in-process judge; slow answers, 429/500s, wrong JSON, a refused
connection; the config's checks; the probe; two HindSearch steps through the real TRL trainer, with a fault, a
resume and a dead endpoint."""

from __future__ import annotations

import json
import shutil
import socket
import time
from types import SimpleNamespace

import pytest

from hindsearch.config import Config, ConfigError
from hindsearch.hindsight.registry import resolve_methods
from hindsearch.hindsight import judge as J
from hindsearch.hindsight.methods.hindsearch import make_judge
from hindsearch.hindsight.openai_judge import JudgeRejected, JudgeUnavailable, OpenAIJudge, parse_chat_answer
from hindsearch.models import tiny_random_model
from hindsearch.train.run import last_checkpoint, truncate_jsonl
from openai_server import ChatServer
from test_judge import _segments, make_traj
from test_trainer import OVERRIDES, make_trainer, tok, world  # noqa: F401  (module fixtures)


def judge_model(tok):  # noqa: F811
    """The server's tiny model: untied embeddings, so that greedy decode writes words, not one repeated token."""
    return tiny_random_model(tok, seed=0, num_hidden_layers=1, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def server(tok):  # noqa: F811
    s = ChatServer(judge_model(tok), tok)
    yield s
    s.stop()


@pytest.fixture
def srv(server):
    server.idle()  # a slow answer an earlier test gave up on has been sent
    server.faults.clear()
    return server


def dead_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}/v1"


def hcfg(url: str, *extra: str):
    return resolve_methods(Config.load(None, ['method="hindsearch"', 'hindsearch.judge_kind="openai"', f'hindsearch.judge_url="{url}"',
                              'hindsearch.judge_model="tiny-judge"', "hindsearch.critique_max_tokens=8",
                              "hindsearch.judge_concurrency=1", "hindsearch.judge_backoff_s=0.05", *extra])).hindsearch


@pytest.fixture(scope="module")
def trajs(tok, server):  # noqa: F811
    return [make_traj(tok, server.model, q, [gold], _segments(query, [title]))
            for q, gold, query, title in (("Where was Edwin Marlow born", "Kestrel Bay", "Edwin Marlow", '"Edwin Marlow"'),
                                          ("Who founded Port Ila", "Ada Venn", "Port Ila founder", '"Port Ila"'))]


def test_success_sends_the_judge_prompt_and_cleans_and_redacts_the_answer(srv, tok, trajs):  # noqa: F811
    cfg = hcfg(srv.url, "hindsearch.judge_concurrency=2")
    judge = make_judge(cfg, None, tok)
    assert isinstance(judge, OpenAIJudge) and judge.kind == "openai"
    n0, a0 = srv.requests, len(srv.answers)
    crits = judge.critique(trajs)
    assert srv.requests - n0 == judge.requests == 2 and judge.errors == 0
    sent = [b["messages"] for b in srv.bodies[-2:]]
    want = [J.build_judge_prompt(t, cfg.judge_template, True, cfg.judge_max_prompt_tokens, tok) for t in trajs]
    assert sorted(m[0]["content"] for m in sent) == sorted(want) and all(len(m) == 1 for m in sent)
    assert all(b["max_tokens"] == 8 and b["temperature"] == 0 and b["model"] == "tiny-judge" for b in srv.bodies[-2:])
    assert sorted(c.raw for c in crits) == sorted(srv.answers[a0:])  # the server's own greedy text
    for c, t in zip(crits, trajs):
        same = J.finish(c.raw, t.golden_answers, cfg.judge_template, True)
        assert (c.text, c.degenerate, c.error) == (same.text, same.degenerate, None) and c.prompt_tokens > 0
    # the same cleaning (first paragraph, two sentences) and redaction as the in-process judge
    srv.faults.extend(["say:Search for kestrel bay first. Then its founder. Then more.\n\nIgnored."])
    c = judge.critique(trajs[:1])[0]
    assert c.text == "Search for [ANSWER] first. Then its founder." and c.redactions == 1 and c.usable


def test_slow_answer_times_out_then_is_retried(srv, tok, trajs):  # noqa: F811
    judge = make_judge(hcfg(srv.url, "hindsearch.judge_timeout_s=0.5", "hindsearch.judge_retries=2"), None, tok)
    srv.faults.extend(["slow:1.5"])
    n0, t0 = srv.requests, time.monotonic()
    c = judge.critique(trajs[:1])[0]
    assert c.error is None and c.raw and srv.requests - n0 == 2 and judge.requests == 2
    assert time.monotonic() - t0 < 4
    srv.faults.extend(["slow:1"] * 3)  # slow on every try: that rollout's critique is an error, within bounds
    t0 = time.monotonic()
    c = judge.critique(trajs[:1])[0]
    assert c.error and "after 3 attempts" in c.error and "ReadTimeout" in c.error and not c.usable
    assert time.monotonic() - t0 < 4 and judge.errors == 1


def test_429_and_500_are_retried_then_the_rollout_is_an_error(srv, tok, trajs):  # noqa: F811
    judge = make_judge(hcfg(srv.url, "hindsearch.judge_retries=2"), None, tok)
    srv.faults.extend(["429", "500"])
    n0 = srv.requests
    c = judge.critique(trajs[:1])[0]
    assert c.error is None and srv.requests - n0 == 3
    srv.faults.extend(["500", "500", "500"])  # first rollout: 500 on every try; the second is answered
    a, b = judge.critique(trajs)
    assert a.error and "HTTP 500" in a.error and "injected 500" in a.error and a.text == ""
    assert b.error is None and b.raw and judge.errors == 1 and judge.requests == 3 + 3 + 1


def test_wrong_json_is_that_rollouts_error_and_not_retried(srv, tok, trajs):  # noqa: F811
    judge = make_judge(hcfg(srv.url), None, tok)
    for fault, why in (("badjson", "is not JSON"), ("nochoices", "has no choices[0]")):
        srv.faults.append(fault)
        n0 = srv.requests
        c = judge.critique(trajs[:1])[0]
        assert c.error and "malformed answer" in c.error and why in c.error and srv.requests - n0 == 1
    assert judge.errors == 2
    with pytest.raises(ValueError, match=r"message.content is not text"):
        parse_chat_answer(b'{"choices": [{"message": {"content": null}}]}')
    assert parse_chat_answer(b'{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 7}}') == ("ok", 7)


def test_connection_refused_stops_with_one_line_after_a_bounded_wait(tok, trajs):  # noqa: F811
    from hindsearch.cli import describe

    url = dead_url()
    judge = make_judge(hcfg(url, "hindsearch.judge_retries=2", "hindsearch.judge_concurrency=2"), None, tok)
    t0 = time.monotonic()
    with pytest.raises(JudgeUnavailable) as e:
        judge.critique(trajs * 3)
    assert time.monotonic() - t0 < 5 and judge.requests <= 6  # the queued requests are not sent
    line = describe(e.value)
    assert "\n" not in line and f"judge endpoint {url}/chat/completions unreachable after 3 attempts" in line
    assert "ConnectError" in line and "unexpected" not in line


def test_wrong_model_or_key_stops_the_run_and_the_key_comes_from_the_environment(srv, tok, trajs,  # noqa: F811
                                                                                   monkeypatch):
    with pytest.raises(JudgeRejected, match=r"HTTP 404.*does not exist"):
        make_judge(hcfg(srv.url, 'hindsearch.judge_model="other"'), None, tok).critique(trajs[:1])
    s = ChatServer(judge_model(tok), tok, key="sk-test-123")
    try:
        monkeypatch.setenv("JUDGE_KEY", "sk-wrong")
        with pytest.raises(JudgeRejected, match="HTTP 401"):
            make_judge(hcfg(s.url, 'hindsearch.judge_api_key_env="JUDGE_KEY"'), None, tok).critique(trajs[:1])
        monkeypatch.setenv("JUDGE_KEY", "sk-test-123")
        cfg = resolve_methods(Config.load(None, ['method="hindsearch"', 'hindsearch.judge_kind="openai"', f'hindsearch.judge_url="{s.url}"',
                                 'hindsearch.judge_model="tiny-judge"', 'hindsearch.judge_api_key_env="JUDGE_KEY"']))
        assert make_judge(cfg.hindsearch, None, tok).critique(trajs[:1])[0].error is None
        assert "sk-test-123" not in cfg.to_toml() and 'judge_api_key_env = "JUDGE_KEY"' in cfg.to_toml()
    finally:
        s.stop()


@pytest.mark.parametrize("override, needle", [
    ('hindsearch.judge_url="ftp://host/v1"', "hindsearch.judge_url = 'ftp://host/v1' must be an http:// or https://"),
    ('hindsearch.judge_url="localhost:8000"', "hindsearch.judge_url"),
    ("hindsearch.judge_concurrency=0", "hindsearch.judge_concurrency must be > 0"),
    ("hindsearch.judge_timeout_s=-1", "hindsearch.judge_timeout_s must be > 0"),
    ("hindsearch.judge_retries=-1", "hindsearch.judge_retries must be >= 0"),
    ("hindsearch.judge_backoff_s=0", "hindsearch.judge_backoff_s must be > 0"),
    ('hindsearch.judge_api_key_env="HINDSEARCH_NO_SUCH_KEY"', "the environment variable HINDSEARCH_NO_SUCH_KEY is not set"),
    ('hindsearch.judge_model=""', "hindsearch.judge_model must name the model the endpoint serves"),
])
def test_bad_openai_judge_options_fail_in_one_line_naming_the_key(override, needle, monkeypatch):
    monkeypatch.delenv("HINDSEARCH_NO_SUCH_KEY", raising=False)
    base = ['method="hindsearch"', 'hindsearch.judge_kind="openai"', 'hindsearch.judge_url="http://127.0.0.1:9/v1"',
            'hindsearch.judge_model="m"']
    with pytest.raises(ConfigError) as e:
        resolve_methods(Config.load(None, base + [override]))
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="hindsearch.judge_url = None must be an http"):
        resolve_methods(Config.load(None, ['method="hindsearch"', 'hindsearch.judge_kind="openai"', 'hindsearch.judge_model="m"']))
    resolve_methods(Config.load(None, base))  # the in-process judge's options are untouched: the defaults still load
    resolve_methods(Config.load(None, ['method="hindsearch"', "hindsearch.judge_concurrency=4"]))


def test_probe_uses_the_openai_judge(srv, tok, trajs):  # noqa: F811
    from hindsearch.study.probe import _probe_judges, hint_lines

    cfg = SimpleNamespace(hindsearch=hcfg(srv.url), model=None)
    judges = _probe_judges(SimpleNamespace(model=None, tokenizer=tok), cfg)
    assert {k: type(j) for k, j in judges.items()} == {"critique_gold": OpenAIJudge, "critique_nogold": OpenAIJudge}
    n0 = srv.requests
    srv.faults.extend(["say:Look up the birthplace record of the painter.", "say:Search the town records instead."])
    lines = hint_lines(trajs[:1], cfg, judges)
    assert srv.requests - n0 == 2
    assert "birthplace record" in lines["critique_gold"][0] and "town records" in lines["critique_nogold"][0]
    gold, nogold = (b["messages"][0]["content"] for b in srv.bodies[-2:])
    assert "Kestrel Bay" in gold and "Kestrel Bay" not in nogold


# ------------------------------------------------------------------ through the real TRL trainer
def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_two_hindsearch_steps_with_critiques_from_the_server_then_resume(world, tok, srv, tmp_path):  # noqa: F811
    """Two HindSearch steps (scripted rollouts: odd ones fail after a search) judged by the test server; the first
    request of step 1 gets a 500 on every try, so that rollout is an error recorded in samples.jsonl; a resume from
    checkpoint-1 asks the server for step 2's critiques only."""
    w, retriever = world
    cfg = resolve_methods(Config.load(None, OVERRIDES + [
        'method="hindsearch"', "train.kl_coef=0.0", 'hindsearch.judge_kind="openai"',
        f'hindsearch.judge_url="{srv.url}"', 'hindsearch.judge_model="tiny-judge"', "hindsearch.critique_max_tokens=12",
        "hindsearch.judge_concurrency=1", "hindsearch.judge_retries=1", "hindsearch.judge_backoff_s=0.05",
        "train.samples_per_step=64"]))  # every rollout in samples.jsonl (by default a share of each kind)
    run, records = tmp_path / "run", w.splits["train"][:4]
    srv.faults.extend(["500", "500"])
    n0, a0 = srv.requests, len(srv.answers)
    trainer, _ = make_trainer(cfg, tok, retriever, records, run)
    trainer.train()
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["hind/failed"] == r["hind/eligible"] == 2.0 and r["hind/judge_kind_oracle"] == 0.0
        assert r["hind/critiques"] + r["hind/degenerate"] + r["hind/judge_errors"] == r["hind/eligible"]
    assert [r["hind/judge_errors"] for r in rows] == [1.0, 0.0]
    assert [r["hind/judge_requests"] for r in rows] == [3.0, 2.0]  # 2 tries of the 500s + 1, then 2
    assert srv.requests - n0 == 5 and len(srv.answers) - a0 == 3
    judged = [s for s in _rows(run / "samples.jsonl") if s["reward"] == 0 and "hind" in s]
    assert {s["step"] for s in judged} == {1, 2}
    errors = [s["hind"] for s in judged if s["hind"]["judge_error"]]
    assert len(errors) == 1 and "HTTP 500" in errors[0]["judge_error"] and not errors[0]["critique_usable"]
    assert "distill_tokens" not in errors[0]  # no distillation for it
    ok = [s["hind"] for s in judged if not s["hind"]["judge_error"]]
    assert len(ok) == 3 and all(j["judge_kind"] == "openai" and j["critique_raw"] in srv.answers[a0:] for j in ok)
    # the server's critiques were distilled: 1 usable in step 1 (the other is the error), 2 in step 2
    assert [r["hind/critiques"] for r in rows] == [1.0, 2.0]
    assert all(r["hind/distill_tokens"] > 0 and r["hind/teacher_time"] > 0 for r in rows)
    assert all(j["critique_usable"] and j["distill_tokens"] and j["critique"] == J.clean_critique(j["critique_raw"])
               for j in ok)

    # resume: step 2 never finished -> checkpoint-1; the server is asked for step 2's critiques only
    shutil.rmtree(run / "checkpoints" / "checkpoint-2")
    truncate_jsonl(run / "metrics.jsonl", 1)
    truncate_jsonl(run / "samples.jsonl", 1)
    n1 = srv.requests
    trainer2, _ = make_trainer(cfg, tok, retriever, records, run, seed=1)
    trainer2.train(resume_from_checkpoint=str(last_checkpoint(run)))
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and srv.requests - n1 == 2 == rows[1]["hind/judge_requests"]


def test_a_dead_judge_endpoint_stops_training_in_one_line(world, tok, tmp_path):  # noqa: F811
    from hindsearch.cli import describe

    w, retriever = world
    url = dead_url()
    cfg = resolve_methods(Config.load(None, OVERRIDES + [
        'method="hindsearch"', "train.kl_coef=0.0", 'hindsearch.judge_kind="openai"', f'hindsearch.judge_url="{url}"',
        'hindsearch.judge_model="tiny-judge"', "hindsearch.judge_retries=2", "hindsearch.judge_backoff_s=0.1"]))
    run = tmp_path / "run"
    trainer, _ = make_trainer(cfg, tok, retriever, w.splits["train"][:4], run)
    t0 = time.monotonic()
    with pytest.raises(JudgeUnavailable) as e:
        trainer.train()
    assert time.monotonic() - t0 < 60
    assert f"judge endpoint {url}/chat/completions unreachable after 3 attempts" in describe(e.value)
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text()  # no step recorded
