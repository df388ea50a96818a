"""Per-stage peak RSS (sampler thread) and the glibc allocator settings the CLI and the tests apply."""

import subprocess
import sys
import time

from hindsearch.memory import MALLOC_SETTINGS, StageMemory, format_memory_table, rss_mb


def test_stage_peak_sees_memory_freed_before_the_stage_ends():
    import torch

    mem = StageMemory(interval_s=0.005)
    with mem.stage("idle"):
        time.sleep(0.05)
    with mem.stage("spike"):
        x = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
        time.sleep(0.1)
        del x
    idle, spike = mem.stages["idle"], mem.stages["spike"]
    assert spike["peak_rss_mb"] >= spike["start_rss_mb"] + 60  # the freed tensor still counts in the peak
    assert idle["peak_rss_mb"] < idle["start_rss_mb"] + 30
    assert spike["seconds"] >= 0.1
    with mem.stage("spike"):  # re-entering a stage keeps its larger peak and adds the time
        pass
    assert mem.stages["spike"]["peak_rss_mb"] == spike["peak_rss_mb"]
    assert mem.stages["spike"]["seconds"] >= spike["seconds"]
    table = format_memory_table(mem.summary())
    assert "spike" in table and "process peak" in table
    assert rss_mb() > 0


def test_malloc_tuning_applies_unless_the_environment_sets_it():
    code = "from hindsearch.memory import tune_malloc; print(sorted(tune_malloc()))"
    env_all = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env_all)
    assert out.stdout.strip() == str(sorted(env for env, _ in MALLOC_SETTINGS.values()))
    env = {**env_all, "MALLOC_ARENA_MAX": "4"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert "MALLOC_ARENA_MAX" not in out.stdout and "MALLOC_MMAP_THRESHOLD_" in out.stdout
    env = {**env_all, "HINDSEARCH_MALLOC_TUNE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_large_freed_tensors_return_to_the_kernel_with_tuning():
    """With the mmap threshold at 1 MiB a freed 256 MiB buffer made of 4 MiB tensors leaves RSS (glibc default:
    the dynamic threshold grows past 4 MiB after the first free, and the chunks stay in the heap)."""
    code = (
        "import sys, torch; from hindsearch.memory import tune_malloc, rss_mb\n"
        "if sys.argv[1] == '1': tune_malloc()\n"
        "base = rss_mb()\n"
        "for _ in range(3):\n"
        "    xs = [torch.ones(1024 * 1024) for _ in range(64)]\n"
        "    del xs\n"
        "print(rss_mb() - base)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MALLOC_")}
    tuned = float(subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True, check=True,
                                 env={**env, "HINDSEARCH_MALLOC_TUNE": "1"}).stdout)
    assert tuned < 32


def rss_counter_slack_mb(peak_mb: float) -> float:
    """How far VmRSS read at one moment can exceed VmHWM read later, for the same memory. The kernel keeps each of
    the three counters in RSS (anon, file, shmem pages) per CPU (Linux >= 6.2), each CPU holding up to
    max(32, 2 x CPUs) pages not yet summed into what /proc reports, and VmHWM is updated only at some events
    (older kernels cache per thread instead, flushing every 64 faults). Two readings, each rounded to 0.1 MiB:
    twice the per-CPU bound, or 2% of the peak where that is more, plus the rounding. A summary that reported
    something other than the high-water mark (the end RSS, one stage's peak) is off by more on a real run."""
    import os

    cpus = os.cpu_count() or 1
    per_reading = 3 * cpus * max(32, 2 * cpus) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return max(2 * per_reading, 0.02 * peak_mb) + 0.2


def test_rss_counter_slack_is_small_but_covers_the_kernel_counters():
    assert 0.2 < rss_counter_slack_mb(0.0) and rss_counter_slack_mb(1190.6) >= 1190.6 - 1190.5 + 0.2
    assert rss_counter_slack_mb(1000.0) < 0.1 * 1000.0 or (__import__("os").cpu_count() or 1) > 64


def test_main_job_reports_peak_rss_per_stage(tmp_path, monkeypatch):
    """run_train on a tiny world with a warm-up (micro-batched through the Trainer) and one GRPO step in micro-batches:
    summary.json and the printed summary carry every stage's peak RSS and time; the warm-up folder has a metrics row
    per SFT step."""
    import json
    from pathlib import Path

    from hindsearch.config import Config
    from hindsearch.train.run import run_train

    monkeypatch.setenv("HINDSEARCH_CACHE", str(tmp_path / "cache"))
    cfg = Config.load(None, [
        'model.name="tiny-random"', 'model.device="cpu"', f'data.world_dir="{tmp_path / "world"}"',
        "data.world_entities=60", "rollout.num_generations=2", "rollout.max_turns=1",
        "rollout.max_new_tokens_per_turn=16", "rollout.max_total_tokens=1024", "train.steps=1", "train.save_steps=1",
        "train.questions_per_step=2", "train.micro_batch_size=1", "train.kl_coef=0.0", "train.eval_limit=2",
        "warmup.num_demos=4", "warmup.batch_size=2", "warmup.micro_batch_size=1", "warmup.epochs=1",
        "train.samples_per_step=1", f'out="{tmp_path / "run"}"'])
    lines: list[str] = []
    summary = run_train(cfg, log=lines.append)
    stages = summary["memory"]["stages"]
    assert list(stages) == ["data", "load", "eval_base", "warmup", "eval_warmup", "rl", "eval_rl"]
    for name, r in stages.items():
        assert r["peak_rss_mb"] >= max(r["start_rss_mb"], r["end_rss_mb"]) > 100, name
        assert r["seconds"] >= 0, name
    # the process peak (VmHWM) covers every stage's sampled peak (VmRSS), up to how far two readings of the
    # kernel's RSS counters can disagree about the same memory
    top = max(r["peak_rss_mb"] for r in stages.values())
    assert summary["memory"]["peak_rss_mb"] >= top - rss_counter_slack_mb(top), (summary["memory"]["peak_rss_mb"], top)
    on_disk = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert on_disk["memory"]["stages"] == stages
    assert any("peak RSS MiB" in x and "process peak" in x for x in lines)
    wdir = next((tmp_path / "cache" / "warmup").glob("warmup-*"))
    rows = [json.loads(x) for x in (wdir / "metrics.jsonl").read_text().splitlines()]
    info = json.loads((wdir / "warmup.json").read_text())
    assert [r["step"] for r in rows] == list(range(1, info["sft"]["steps"] + 1)) == [1, 2]
    assert [r["loss"] for r in rows] == info["sft"]["loss"]


def test_release_free_memory_returns_small_freed_allocations():
    """Many small tensors (below the 1 MiB mmap threshold, so in the heap) freed: malloc_trim gives the pages back."""
    code = (
        "import torch; from hindsearch.memory import tune_malloc, rss_mb, release_free_memory\n"
        "tune_malloc(); base = rss_mb()\n"
        "xs = [torch.ones(64 * 1024) for _ in range(2000)]; keep = xs[-1]; del xs\n"  # 500 MiB of 256 KiB tensors
        "before = rss_mb() - base; release_free_memory(); print(before, rss_mb() - base)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MALLOC_")}
    before, after = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                              env=env).stdout.split())
    assert before > 300 and after < 50, (before, after)
