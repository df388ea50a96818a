"""Issue 41, item 11: ``hindsearch report`` reads only regular files, within a size cap.

A FIFO as ``metrics.jsonl`` used to hang the report until it was killed, and ``/dev/zero`` or ``/dev/urandom``
behind a run file ran it out of memory. The report runs here as a real process with a time limit and an
address-space limit, so the old behaviour fails the test instead of the machine; the page names each file it
did not read and why.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import hindsearch

pytestmark = pytest.mark.timeout(300)


def report(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    def limits() -> None:  # a reader of /dev/zero fails fast here instead of taking the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    src = str(Path(hindsearch.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "hindsearch.cli", "report", str(folder), *extra], env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=limits)


def a_run(path: Path) -> Path:
    path.mkdir()
    (path / ".hindsearch-output.json").write_text(json.dumps({"kind": "run"}))
    (path / "config.toml").write_text('method = "grpo"\n')
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 0.5, "reward": 0.1 * i}) + "\n"
                                                for i in (1, 2, 3)))
    return path


def test_a_fifo_as_metrics_does_not_hang_the_report(tmp_path):
    run = a_run(tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")  # nobody ever writes into it
    os.mkfifo(run / "summary.json")
    r = report(run)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (run / "report.html").read_text()
    assert "metrics.jsonl: a FIFO, not a regular file; not read" in page
    assert "summary.json: a FIFO, not a regular file; not read" in page


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_behind_a_run_file_is_not_read(tmp_path, device):
    run = a_run(tmp_path / "run")
    for name in ("samples.jsonl", "summary.json", "results.json", "dev_curve.jsonl"):
        (run / name).symlink_to(device)
    (run / "config.toml").unlink()
    (run / "config.toml").symlink_to(device)
    r = report(run)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (run / "report.html").read_text()
    for name in ("samples.jsonl", "summary.json", "results.json", "dev_curve.jsonl", "config.toml"):
        assert f"{name}: a character device, not a regular file; not read" in page, name
    assert "3 logged steps" in page  # the readable metrics are still shown


def test_an_oversized_json_file_is_named_and_skipped(tmp_path):
    from hindsearch.study.report.runs import read_json

    MAX_DOC_BYTES = 64 << 20  # the cap on a whole-file read (report.runs.MAX_DOC_BYTES)

    big = tmp_path / "summary.json"
    with big.open("wb") as f:
        f.truncate(MAX_DOC_BYTES + 1)  # sparse: no disk used
    bad: list[str] = []
    assert read_json(big, bad) == {}
    assert bad == [f"{big}: {MAX_DOC_BYTES + 1} bytes, over the 64 MiB this reads; not read"]
