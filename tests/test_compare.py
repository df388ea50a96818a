"""``hindsearch compare``: method aliases, aggregation, the results table, resume states, and a tiny end-to-end compare.

The end-to-end test is real: a micro model (tiny spec) built on a small generated world, the shared
warm-up (a few demos), ``run_train`` through TRL for one step per (method, seed), greedy test evaluation,
``results.md`` + ``curves.png``, then a rerun that skips the finished runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hindsearch.study.compare import (METHOD_ALIASES, parse_methods, parse_seeds, run_compare, run_overrides,
                                      run_state)
from hindsearch.study.results import (aggregate, eval_numbers, mean_spread, median_step_time,
                                      results_markdown, write_outputs)
from hindsearch.config import Config
from hindsearch.hindsight.registry import resolve_methods


def test_parse_methods_and_seeds():
    assert parse_methods("grpo, hindsearch-nogold") == ["grpo", "hindsearch-nogold"]
    with pytest.raises(ValueError, match="unknown method 'ppo'"):
        parse_methods("grpo,ppo")
    with pytest.raises(ValueError, match="twice"):
        parse_methods("grpo,grpo")
    assert parse_seeds("0,1") == [0, 1]
    with pytest.raises(ValueError, match="integers"):
        parse_seeds("a")


def test_method_aliases_make_valid_configs(tmp_path):
    for m in METHOD_ALIASES:
        cfg = resolve_methods(Config.load(None, run_overrides(m, 3, tmp_path / m, "some/init", ["train.steps=2"])))
        assert cfg.train.seed == 3 and cfg.out == (tmp_path / m).as_posix() and cfg.train.steps == 2
        assert cfg.model.name == "some/init" and cfg.warmup.enabled is False
    nogold = resolve_methods(Config.load(None, run_overrides("hindsearch-nogold", 0, tmp_path, None, [])))
    gold = resolve_methods(Config.load(None, run_overrides("hindsearch", 0, tmp_path, None, [])))
    assert nogold.method == gold.method == "hindsearch"
    assert nogold.hindsearch.judge_sees_gold is False and gold.hindsearch.judge_sees_gold is True
    for alias, teacher in (("hindsearch", "frozen"), ("hindsearch-live", "live"), ("hindsearch-ema", "ema")):
        cfg = resolve_methods(Config.load(None, run_overrides(alias, 0, tmp_path, None, [])))
        assert (cfg.method, cfg.hindsearch.teacher, cfg.hindsearch.judge_sees_gold) == ("hindsearch", teacher, True)
    shuffled = resolve_methods(Config.load(None, run_overrides("hindsearch-onesided-shuffled", 0, tmp_path, None, [])))
    assert (shuffled.hindsearch.critique_source, shuffled.hindsearch.divergence) == ("shuffled", "one_sided")
    for alias, sees_gold, on in (("hindsearch-onesided", True, "query"), ("hindsearch-onesided-nogold", False, "query"),
                                 ("hindsearch-onesided-shuffled", True, "query"),
                                 ("hindsearch-onesided-answer", True, "answer_decision"),
                                 ("hindsearch-onesided-answer-nogold", False, "answer_decision")):
        cfg = resolve_methods(Config.load(None, run_overrides(alias, 0, tmp_path, None, [])))
        assert (cfg.method, cfg.hindsearch.divergence, cfg.hindsearch.judge_sees_gold) == ("hindsearch", "one_sided", sees_gold)
        assert cfg.hindsearch.distill_on == on


def fake_result(method, seed, world, nq=None, step_s=1.0):
    b = {"world": {"em": world, "em_1hop": world + 0.1, "em_2hop": world - 0.1, "n": 10}}
    if nq is not None:
        b["nq"] = {"em": nq, "n": 5}
    return {"method": method, "seed": seed, "benchmarks": b, "step_s": step_s}


def test_aggregate_and_table():
    res = [fake_result("grpo", 0, 0.2, 0.1, 2.0), fake_result("grpo", 1, 0.4, 0.3, 4.0),
           fake_result("igsd", 0, 0.5, 0.0, 9.0)]
    res[0]["zero_adv"], res[1]["zero_adv"] = 0.5, 0.7  # igsd's run predates the column: "-"
    res[2]["benchmarks"]["world"]["multi_1hop"] = 0.25  # and the grpo runs predate the over-search column
    agg = aggregate(res, ["grpo", "igsd"])
    m, s, n = agg["grpo"]["world EM"]
    assert (m, n) == (pytest.approx(0.3), 2) and s == pytest.approx(mean_spread([0.2, 0.4])[1])
    assert agg["grpo"]["mini avg"][0] == pytest.approx(0.2) and agg["igsd"]["world EM"][2] == 1
    md = results_markdown(agg, ["world", "nq"], "t")
    lines = md.splitlines()
    assert lines[2].split("|")[1:-1][:4] == [" method ", " seeds ", " world EM ", " world 1-hop "]
    grpo = [c.strip() for c in lines[4].split("|")[1:-1]]
    assert grpo[:3] == ["grpo", "2", "30.0 ± 14.1"] and grpo[-3:] == ["60%", "3.0", "1.00x"]
    igsd = [c.strip() for c in lines[5].split("|")[1:-1]]
    assert igsd[2] == "50.0" and igsd[-3:] == ["-", "9.0", "3.00x"]  # one seed: no spread printed
    over = [c.strip() for c in lines[2].split("|")[1:-1]].index("1-hop searched 2+")
    assert (grpo[over], igsd[over]) == ("-", "25.0")


def test_eval_numbers_and_step_time(tmp_path):
    res = {"benchmarks": {"world": {"em": 0.5, "em_by_hops": {"1": 0.75, "2": 0.25}, "n": 8}}}
    assert eval_numbers(res, ["world"])["world"] == {"em": 0.5, "em_1hop": 0.75, "em_2hop": 0.25, "n": 8,
                                                     "searches": None, "validity": None, "multi_1hop": None}
    res["benchmarks"]["world"]["multi_search_by_hops"] = {"1": 0.125, "2": 0.5}
    assert eval_numbers(res, ["world"])["world"]["multi_1hop"] == 0.125
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "time/step": t}) + "\n" for i, t in
                                                    enumerate([3.0, 1.0, 2.0])))
    assert median_step_time(tmp_path) == 2.0
    from hindsearch.study.results import ZERO_ADV_KEY, zero_advantage_share

    assert zero_advantage_share(tmp_path) is None  # not logged
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, ZERO_ADV_KEY: v}) + "\n" for i, v in
                                                    enumerate([1.0, 0.5, 0.0, 0.5])))
    assert zero_advantage_share(tmp_path) == pytest.approx(0.5)


def test_run_states(tmp_path):
    assert run_state(tmp_path / "x") == "new"
    (tmp_path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    assert run_state(tmp_path) == "partial"
    (tmp_path / "final").mkdir()
    (tmp_path / "summary.json").write_text("{}")
    assert run_state(tmp_path) == "trained"
    (tmp_path / "done.json").write_text("{}")
    assert run_state(tmp_path) == "done"


def test_write_outputs_from_constructed_runs(tmp_path):
    for m, s, em in (("grpo", 0, 0.2), ("hindsearch", 0, 0.4)):
        d = tmp_path / f"{m}-s{s}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps(fake_result(m, s, em)))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "rollout/reward_mean": em * i / 5,
                                                             "time/step": 1.0}) + "\n" for i in range(5)))
        (d / "summary.json").write_text(json.dumps({"dev": {"base": {"em": 0.1}, "rl": {"em": em}}}))
    md = write_outputs(tmp_path, ["grpo", "hindsearch"], [0])
    assert "| hindsearch | 1 | 40.0 |" in md and (tmp_path / "results.md").read_text() == md
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_dev_curve_joins_base_periodic_and_final_evals(tmp_path):
    from hindsearch.study.results import dev_curve

    assert dev_curve(tmp_path) == []
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 30, "dev": {"base": {"em": 0.1}, "rl": {"em": 0.3}}}))
    (tmp_path / "dev_curve.jsonl").write_text(json.dumps({"step": 10, "em": 0.2}) + "\n" + json.dumps({"step": 20, "em": None}) + "\n")
    assert dev_curve(tmp_path) == [(0, 0.1), (10, 0.2), (30, 0.3)]


@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory):
    """A preset on a 60-entity world with a tiny micro model (built here) and a tiny warm-up."""
    from hindsearch.data.world import ensure_world
    from recipes.micro.build import MicroSpec, ensure_micro

    d = tmp_path_factory.mktemp("cmp")
    world = ensure_world(d / "world", seed=0, n_entities=60)
    spec = MicroSpec(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     pretrain_steps=0)
    model = ensure_micro(world, d / "micro", spec=spec)
    cfg = f"""
method = "grpo"
[model]
name = "{model.as_posix()}"
device = "cpu"
[data]
world_dir = "{world.as_posix()}"
world_entities = 60
[retrieval]
topk = 2
[rollout]
max_turns = 1
max_new_tokens_per_turn = 12
max_total_tokens = 400
num_generations = 2
[warmup]
num_demos = 4
epochs = 1
batch_size = 4
[train]
steps = 2
questions_per_step = 2
save_steps = 1
eval_limit = 4
eval_steps = 1
[hindsearch]
judge_kind = "oracle"
[eval]
batch_size = 8
"""
    (d / "preset.toml").write_text(cfg)
    return d


def test_tiny_compare_end_to_end_and_skip(tiny_preset, monkeypatch):
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    out = tiny_preset / "out"
    logs: list[str] = []
    md = run_compare(str(tiny_preset / "preset.toml"), ["grpo", "hindsearch-nogold"], [0], out, test_limit=4,
                     log=logs.append)
    init = json.loads((out / "init.json").read_text())["init_model"]
    assert Path(init, "warmup.json").exists()  # one shared warmed-up checkpoint
    for m in ("grpo", "hindsearch-nogold"):
        rd = out / f"{m}-s0"
        assert (rd / "done.json").exists()
        res = json.loads((rd / "results.json").read_text())
        assert res["benchmarks"]["world"]["n"] == 4 and res["step_s"] > 0
        cfg = resolve_methods(Config.load(rd / "config.toml"))
        assert cfg.model.name == init and cfg.warmup.enabled is False
        curve = [json.loads(x) for x in (rd / "dev_curve.jsonl").read_text().splitlines()]
        assert [c["step"] for c in curve] == [1] and curve[0]["n"] == 4  # step 2 is the final 'rl' evaluation
    assert resolve_methods(Config.load(out / "hindsearch-nogold-s0" / "config.toml")).hindsearch.judge_sees_gold is False
    assert "| grpo | 1 |" in md and "| hindsearch-nogold | 1 |" in md and "1.00x" in md
    assert (out / "curves.png").exists()
    # rerun: everything is finished -> skipped, nothing retrained
    stamp = (out / "grpo-s0" / "results.json").stat().st_mtime_ns
    logs.clear()
    run_compare(str(tiny_preset / "preset.toml"), ["grpo", "hindsearch-nogold"], [0], out, test_limit=4,
                log=logs.append)
    assert sum("skipped" in x for x in logs) == 2
    assert (out / "grpo-s0" / "results.json").stat().st_mtime_ns == stamp
    # a trained-but-not-evaluated run is only evaluated
    (out / "grpo-s0" / "done.json").unlink()
    assert run_state(out / "grpo-s0") == "trained"
    logs.clear()
    run_compare(str(tiny_preset / "preset.toml"), ["grpo"], [0], out, test_limit=4, log=logs.append)
    assert not any("training" in x for x in logs) and (out / "grpo-s0" / "done.json").exists()


def _sleep_or_fail(seconds: float, fail: bool, threads: int | None = None) -> None:
    """A parallel run for ``_run_parallel``: sleeps, then raises when told to."""
    import time

    time.sleep(seconds)
    if fail:
        raise RuntimeError("this run broke")


def test_parallel_runs_report_each_failure_and_keep_the_others(capsys):
    """``--jobs``: a run that raises is reported by name with its traceback; the others finish and each finished run
    updates the results (``finished``)."""
    from hindsearch.study.compare import _run_parallel

    logs: list[str] = []
    finished: list[int] = []
    failed = _run_parallel(_sleep_or_fail, [((0.1, True), "bad-s0"), ((0.1, False), "good-s0"), ((0.1, False), "good-s1")],
                           2, lambda: finished.append(1), logs.append)
    assert failed == ["bad-s0"] and len(finished) == 2
    assert any(x.startswith("bad-s0: failed (RuntimeError: this run broke)") for x in logs)
    assert sum(x.endswith(": done") for x in logs) == 2 and sum("started" in x for x in logs) == 3
    assert "this run broke" in capsys.readouterr().err


def _sleep_or_die(seconds: float, die: bool, threads: int | None = None) -> None:
    """A parallel run for ``_run_parallel`` that the system kills (as an out-of-memory kill would) when told to."""
    import os
    import signal
    import time

    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)


def test_a_run_killed_from_outside_fails_alone():
    """A worker killed mid-run costs its own run only: the run beside it and the runs queued after it finish."""
    from hindsearch.study.compare import _run_parallel

    logs: list[str] = []
    finished: list[int] = []
    failed = _run_parallel(_sleep_or_die, [((1.0, False), "slow-s0"), ((0.0, True), "killed-s0"),
                                           ((0.1, False), "next-s0")], 2, lambda: finished.append(1), logs.append)
    assert failed == ["killed-s0"] and len(finished) == 2, logs
    assert any(x.startswith("killed-s0: failed (BrokenProcessPool") for x in logs), logs


def test_stopping_compare_stops_its_isolated_run(tmp_path):
    """SIGTERM to the parent must not leave the spawned training process running (an orphan on the CPU)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    script = (
        "import time\n"
        "from hindsearch.study.compare import run_isolated\n"
        f"run_isolated(time.sleep, (120,), 'sleeper', on_start=lambda pid: open({str(pid_file)!r}, 'w').write(str(pid)))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(child, 0)  # the child runs
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) != 0
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the spawned run outlived its stopped parent")


def test_tiny_compare_parallel_jobs_with_probe_and_bootstrap(tiny_preset, monkeypatch):
    """--jobs 2 trains two runs at once in spawned processes; --probe writes probe.json of the starting
    checkpoint; results.md carries the paired bootstrap against GRPO and the probe table."""
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    out = tiny_preset / "out-par"
    logs: list[str] = []
    table_when_done: list[bool] = []  # results.md is rewritten after each finished run, not only at the end

    def log(msg: str) -> None:
        logs.append(msg)
        if msg.endswith(": done"):
            table_when_done.append((out / "results.md").exists())

    md = run_compare(str(tiny_preset / "preset.toml"), ["grpo", "hindsearch"], [0], out, test_limit=4,
                     log=log, jobs=2, probe=2)
    assert sum("started" in x for x in logs) == 2 and sum(x.endswith(": done") for x in logs) == 2
    assert table_when_done == [False, True]
    for m in ("grpo", "hindsearch"):
        assert (out / f"{m}-s0" / "done.json").exists()
    probe = json.loads((out / "probe.json").read_text())
    assert probe["n_failed"] <= 2 and set(probe["hints"]) == {"neutral", "critique_gold", "critique_nogold", "answer"}
    assert "paired bootstrap" in md and "Teacher probes" in md and "| hindsearch | 1 | 4 |" in md
    for m in ("grpo", "hindsearch"):  # each final checkpoint probed too, and summarised beside the start
        final = json.loads((out / f"{m}-s0" / "probe.json").read_text())
        assert final["checkpoint"].endswith("final") and "igsd" in final
        assert any(line.startswith(f"| {m} | 1 | ") for line in md.split("### Probes of the start")[1].splitlines())
    assert "| start | - | " in md


def test_the_start_is_the_presets_whichever_seeds_are_listed(tiny_preset, monkeypatch):
    """'--seeds 1' builds the start a '--seeds 0,1' comparison has (the preset's train.seed): the first listed
    seed used to seed the warm-up, so a comparison extended by its other seeds started from another checkpoint."""
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    inits = {}
    for seeds in ([1], [0, 1]):
        out = tiny_preset / f"out-start-{'-'.join(map(str, seeds))}"
        run_compare(str(tiny_preset / "preset.toml"), ["grpo"], seeds, out, steps=1, test_limit=2,
                    log=lambda *_: None, isolate=False)
        inits[len(seeds)] = json.loads((out / "init.json").read_text())
    assert inits[1]["warmup_seed"] == inits[2]["warmup_seed"] == 0
    assert inits[1]["init_model"] == inits[2]["init_model"] and inits[1]["sha256"] == inits[2]["sha256"]
    import torch

    # torch's CPU kernel set also decides the weights bit for bit: recorded beside the digest, and a comparison
    # resumed under another set says so
    assert inits[1]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(inits[1]["cpu_pins"]) == {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS"}
    out, logs = tiny_preset / "out-start-0-1", []
    run_compare(str(tiny_preset / "preset.toml"), ["grpo"], [0, 1], out, steps=1, test_limit=2, log=logs.append,
                isolate=False)
    assert not any("CPU kernels" in x for x in logs), logs
    (out / "init.json").write_text(json.dumps({**inits[2], "cpu_capability": "AVX2-ELSEWHERE"}))
    run_compare(str(tiny_preset / "preset.toml"), ["grpo"], [0, 1], out, steps=1, test_limit=2, log=logs.append,
                isolate=False)
    warned = [x for x in logs if "CPU kernels" in x]
    assert len(warned) == 1 and "AVX2-ELSEWHERE" in warned[0] and "ATEN_CPU_CAPABILITY=avx2-elsewhere" in warned[0]


def test_compare_config_takes_a_preset_name_from_any_folder(tmp_path, monkeypatch, capsys):
    """``--config tiny-cpu`` resolves like ``hindsearch train --config tiny-cpu`` (the checkout's configs/), from
    a folder without configs/; an unknown name fails with one line listing the presets."""
    import hindsearch.cli.compare
    from hindsearch.cli import main

    monkeypatch.chdir(tmp_path)
    seen = {}

    def fake_run_compare(config, methods, seeds, out, **kw):  # stops before training: only the resolution is tested
        seen.update(config=config, methods=methods, seeds=seeds, kw=kw)
        return "table"

    monkeypatch.setattr(hindsearch.cli.compare, "run_compare", fake_run_compare)
    assert main(["compare", "--config", "tiny-cpu", "--methods", "grpo", "--seeds", "3", "--out", "o", "--no-report",
                 "--jobs", "2", "--probe", "5", "--steps", "7", "--mini-limit", "9"]) == 0
    cfg = Path(seen["config"])
    assert cfg.is_absolute() and cfg.name == "tiny-cpu.toml" and cfg.parent.name == "configs" and cfg.exists()
    assert resolve_methods(Config.load(cfg)).model.name  # a real preset
    assert seen["methods"] == ["grpo"] and seen["seeds"] == [3]
    assert (seen["kw"]["jobs"], seen["kw"]["probe"], seen["kw"]["steps"], seen["kw"]["mini_limit"]) == (2, 5, 7, 9)
    main(["compare", "--out", "o", "--no-report"])  # the default is the tiny-cpu preset too
    assert Path(seen["config"]) == cfg and seen["kw"]["probe"] == 0 and seen["kw"]["jobs"] == 1
    capsys.readouterr()
    assert main(["compare", "--config", "no-such-preset", "--out", "o"]) == 1
    err = capsys.readouterr().err
    assert "'no-such-preset' not found" in err and "tiny-cpu" in err


@pytest.mark.parametrize("flag", ["--jobs", "--steps", "--probe", "--mini-limit", "--test-limit"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_compare_rejects_counts_below_one(flag, value, capsys):
    from hindsearch.cli import main

    with pytest.raises(SystemExit) as e:
        main(["compare", "--out", "o", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}: '{value}' must be at least 1" in capsys.readouterr().err


def test_load_results_names_an_unreadable_file(tmp_path):
    from hindsearch.study.results import load_results

    (tmp_path / "grpo-s0").mkdir()
    (tmp_path / "grpo-s0" / "results.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"grpo-s0/results.json: unreadable \(not a JSON object\)"):
        load_results(tmp_path, ["grpo"], [0, 1])
    bad: list[str] = []
    assert load_results(tmp_path, ["grpo"], [0, 1], bad) == [] and "grpo-s0/results.json" in bad[0]


def test_tiny_compare_sampled_states_and_eval_at(tiny_preset, monkeypatch):
    """--sampled, --states and --eval-at: sampled rows per test question, the start's held-out states (with its
    weight digest) measured on every run, EM after step 1 from the kept step weights, and their tables."""
    from hindsearch.study.compare import parse_steps
    from hindsearch.models import weights_digest
    from hindsearch.study.sampled import SAMPLED_FILE, STATES_FILE, read_rows

    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    out = tiny_preset / "out-sampled"
    md = run_compare(str(tiny_preset / "preset.toml"), ["grpo", "hindsearch-shuffled"], [0], out, test_limit=4,
                     log=lambda *_: None, isolate=False, sampled=2, states=3, eval_at=[1])
    st = json.loads((out / "states.json").read_text())
    init = json.loads((out / "init.json").read_text())
    assert st["start_sha256"] == init["sha256"] == weights_digest(init["init_model"])
    assert init["threads"] == 1  # the start is built with one torch thread on any machine (compare.START_THREADS)
    # the tiny random start never searches, so it has no failed state after an information block (the states
    # themselves are tested on a scripted engine in test_transfer); the plumbing still runs end to end
    assert len(st["failed"]) <= 3 and all(t["hops"] == 2 for t in st["failed"])
    for m in ("grpo", "hindsearch-shuffled"):
        rd = out / f"{m}-s0"
        res = json.loads((rd / "results.json").read_text())
        assert set(res["curve"]) == {"1", "2"} and res["curve"]["2"] == res["benchmarks"]["world"]
        assert (rd / "steps" / "step-1" / "config.json").exists() and (rd / "eval" / "test-world-step-1").is_dir()
        rows = read_rows(rd / SAMPLED_FILE)
        assert len(rows) == 4 and all(r["k"] == 2 and 0.0 <= r["em"] <= r["pass_k"] <= 1.0 for r in rows.values())
        assert len(read_rows(rd / STATES_FILE)) == len(st["failed"])
    assert resolve_methods(Config.load(out / "hindsearch-shuffled-s0" / "config.toml")).hindsearch.critique_source == "shuffled"
    assert "EM along the way" in md and "| step 1 | step 2 |" in md
    assert "### Along the way: each method against GRPO" in md and "| hindsearch-shuffled | grpo | EM |" in md
    assert "Sampled behaviour on the test split (2 samples" in md and "| hindsearch-shuffled | grpo | 1 |" in md
    assert parse_steps("25,10,10") == [10, 25] and parse_steps("") == []
    with pytest.raises(ValueError, match="--eval-at"):
        parse_steps("10,x")


def test_compare_out_is_guarded(tmp_path):
    """compare writes only into a new or empty folder or a comparison folder: a user's folder, the current folder
    or a run folder is refused before anything is written."""
    from hindsearch.fsutil import UnsafeOutput, claim_output

    user = tmp_path / "notes"
    user.mkdir()
    (user / "mine.txt").write_text("keep")
    run = tmp_path / "run"
    claim_output(run, "run")
    for out in (user, run, "", "."):
        with pytest.raises(UnsafeOutput):
            run_compare("no-such-config.toml", ["grpo"], [0], out, log=lambda *_: None)
    assert sorted(p.name for p in user.iterdir()) == ["mine.txt"]


def test_distill_check_runs_its_arms_and_writes_the_curve(tiny_preset, monkeypatch, capsys):
    """benchmarks/distill_check.py end to end on the tiny preset: GRPO's loss at 0, the three arms, a curve row per
    (arm, seed, measured step) plus the start, resumable (a rerun trains and measures nothing)."""
    import importlib.util

    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    spec = importlib.util.spec_from_file_location("distill_check", Path(__file__).parents[1] / "benchmarks" / "distill_check.py")
    dc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dc)
    out = tiny_preset / "dc"
    argv = ["--config", str(tiny_preset / "preset.toml"), "--arms", "gold,nogold,shuffled", "--seeds", "0",
            "--steps", "2", "--every", "1", "--states", "2", "--samples", "2", "--em-questions", "2",
            "--one-hop-questions", "2", "--out", str(out)]
    assert dc.main(argv) == 0
    rows = [json.loads(x) for x in (out / "curve.jsonl").read_text().splitlines()]
    assert sorted((r["arm"], r["step"]) for r in rows) == [("gold", 1), ("gold", 2), ("nogold", 1), ("nogold", 2),
                                                           ("shuffled", 1), ("shuffled", 2), ("start", 0)]
    assert all("one_hop_em" in r for r in rows if r["step"] in (0, 2)) and not any("one_hop_em" in r for r in rows if r["step"] == 1)
    for arm in ("gold", "nogold", "shuffled"):
        cfg = resolve_methods(Config.load(out / f"{arm}-s0" / "config.toml"))
        assert cfg.train.grpo_scale == 0.0 and cfg.hindsearch.distill_on == "decision"
        assert cfg.hindsearch.judge_sees_gold == (arm != "nogold")
        assert cfg.hindsearch.critique_source == ("shuffled" if arm == "shuffled" else "own")
    assert "| gold | 2 | 1 |" in (out / "curve.md").read_text()
    stamp = (out / "curve.jsonl").stat().st_mtime_ns
    assert dc.main(argv) == 0 and (out / "curve.jsonl").stat().st_mtime_ns == stamp


def test_every_run_trains_with_the_start_thread_count_whatever_jobs(tiny_preset, monkeypatch):
    """``--jobs 1`` passed no thread count, so its runs took torch's default (2 on a 2-core box) while the published
    runs used 1: each run now gets the count recorded with the start in ``init.json``."""
    import hindsearch.study.compare as C

    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    seen: list[tuple] = []
    monkeypatch.setattr(C, "run_isolated", lambda target, job, name: seen.append(job) or 0)
    out = tiny_preset / "out-threads"
    run_compare(str(tiny_preset / "preset.toml"), ["grpo"], [0], out, test_limit=2, log=lambda *_: None, jobs=1)
    assert json.loads((out / "init.json").read_text())["threads"] == 1
    assert len(seen) == 1 and seen[0][-1] == 1  # _one_run's threads
    rec = json.loads((out / "init.json").read_text())
    (out / "init.json").write_text(json.dumps({**rec, "threads": 3}))
    assert C.run_threads(out) == 3 and C.run_threads(tiny_preset / "nowhere") == C.START_THREADS


def test_compare_says_how_to_build_a_preset_model_folder(tmp_path, monkeypatch):
    """A fresh clone has no micro model: compare stops in one line that gives the command that builds it."""
    from hindsearch.study.compare import check_model_built

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    preset = str(root / "recipes" / "micro" / "micro-scarce.toml")
    with pytest.raises(FileNotFoundError, match=r"build it first: python .*recipes/micro/build.py --config "
                                                  r".*micro-scarce.toml --out \.hindsearch/micro-w0-default-t600-s0"):
        run_compare(preset, ["grpo"], [0], tmp_path / "out", log=lambda *_: None)
    check_model_built(preset, "smollm2-135m")  # aliases and hub ids pass to the loader
    check_model_built(preset, "Qwen/Qwen2.5-3B-Instruct")
    (tmp_path / ".hindsearch" / "m").mkdir(parents=True)
    check_model_built(preset, ".hindsearch/m")
    with pytest.raises(FileNotFoundError, match="train or download it there first"):
        check_model_built(str(tmp_path / "p.toml"), "runs/x/final")
