"""Issue 41, item 10: ``hindsearch compare`` refuses what it cannot do, in one line, before it trains.

* ``--seeds 0,0`` (one run reported as two seeds) and ``--eval-at`` past the runs' steps are refused;
* a second ``compare`` on a folder a first one is writing is refused in one line, not by its child's
  traceback followed by "rerun the same command".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hindsearch
from conftest import one_line_error
from hindsearch.cli import main
from test_compare import tiny_preset  # noqa: F401  (the module's fixture: a micro model on a 60-entity world)

pytestmark = pytest.mark.timeout(400)


def test_a_repeated_seed_is_refused(tiny_preset, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    out = tmp_path / "cmp"
    base = ["compare", "--config", str(tiny_preset / "preset.toml"), "--methods", "grpo", "--steps", "1",
            "--test-limit", "2", "--out", str(out), "--no-report"]
    assert main([*base, "--seeds", "0,0"]) == 1
    one_line_error(capsys, "hindsearch compare: error: --seeds", "seed 0 twice")
    assert main([*base, "--seeds", "3, 1,3"]) == 1
    one_line_error(capsys, "seed 3 twice")
    assert not out.exists()


def test_eval_at_past_the_last_step_is_refused(tiny_preset, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("HINDSEARCH_CACHE", str(tiny_preset / "cache"))
    out = tmp_path / "cmp"
    base = ["compare", "--config", str(tiny_preset / "preset.toml"), "--methods", "grpo", "--seeds", "0",
            "--test-limit", "2", "--out", str(out), "--no-report"]
    assert main([*base, "--steps", "2", "--eval-at", "1,5"]) == 1
    one_line_error(capsys, "--eval-at 5", "train.steps = 2")
    assert main([*base, "--eval-at", "3"]) == 1  # the preset's train.steps = 2
    one_line_error(capsys, "--eval-at 3", "train.steps = 2")
    assert not out.exists()  # refused before anything is written


def test_a_second_compare_on_a_folder_in_use_is_one_line(tiny_preset, tmp_path):  # noqa: F811
    out = tmp_path / "cmp"
    src = str(Path(hindsearch.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
           "HINDSEARCH_CACHE": str(tiny_preset / "cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [sys.executable, "-m", "hindsearch.cli", "compare", "--config", str(tiny_preset / "preset.toml"),
            "--methods", "grpo", "--seeds", "0", "--steps", "2", "--test-limit", "2", "--out", str(out),
            "--no-report"]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = out / "grpo-s0" / ".hindsearch.lock"
        deadline = time.time() + 240
        while not lock.exists() and first.poll() is None and time.time() < deadline:  # its run is training
            time.sleep(0.2)
        assert lock.exists(), "the first compare never started its run"
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    finally:
        first.send_signal(signal.SIGTERM)  # stops its run too (isolated.stopped_on_exit)
        first.wait(60)
    assert second.returncode == 1
    err = second.stderr.strip()
    assert "Traceback" not in err and "Rerun the same command" not in err, err[-3000:]
    last = err.splitlines()[-1]
    assert "hindsearch compare: error:" in last and "is in use" in last and "comparison folder" in last, err
    assert f"process {first.pid}" in last
