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
