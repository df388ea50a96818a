"""Issue 41, item 9: a full disk is named as such, and leaves nothing behind that refuses the next run.

The full disk is real: a small tmpfs mounted in a private mount namespace (``unshare -rm``, no root needed
where user namespaces are allowed; skipped where they are not), with the ``hindsearch`` command run inside it
as a real process. Whatever the commands print goes to files outside the mount.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import hindsearch

pytestmark = pytest.mark.timeout(300)


def _userns_mounts() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_tmpfs = pytest.mark.skipif(not _userns_mounts(), reason="no user/mount namespaces here (unshare -rm)")


def on_small_disk(tmp_path: Path, size: str, script: str) -> None:
    """Run the shell ``script`` with ``$M`` a fresh tmpfs of ``size`` (gone when the script ends) and ``$HS`` the
    ``hindsearch`` command of this tree."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    src = str(Path(hindsearch.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HINDSEARCH_CACHE": str(tmp_path / "cache"),
           "M": str(mnt), "HS": f"{shlex.quote(sys.executable)} -m hindsearch.cli"}
    full = f'mount -t tmpfs -o size={size} tmpfs "$M" || exit 99\n{script}'
    r = subprocess.run(["unshare", "-rm", "sh", "-c", full], env=env, cwd=tmp_path, timeout=280,
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def last_line(path: Path) -> str:
    lines = path.read_text().strip().splitlines()
    assert lines and "Traceback" not in path.read_text(), path.read_text()[-3000:]
    return lines[-1]


@needs_tmpfs
def test_eval_onto_a_full_disk_says_so_and_leaves_no_lock(tmp_path):
    from hindsearch.data.world import generate_world
    from hindsearch.retrieval.factory import build_index

    world = generate_world(seed=0, n_entities=40)
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in world.splits["dev"][:2]))
    build_index(world.passages, tmp_path / "index", show_progress=False)
    ev = (f'$HS eval --model tiny-random --index {tmp_path / "index"} --data d={q} --out "$M/ev" --no-progress '
          f"--set rollout.max_turns=1 --set rollout.max_new_tokens_per_turn=4")
    on_small_disk(tmp_path, "256k", f"""
dd if=/dev/zero of="$M/fill" bs=4k 2>/dev/null
{ev} > out1.txt 2> err1.txt; echo $? > rc1.txt
ls -A "$M/ev" > ls1.txt 2>&1
rm "$M/fill"
{ev} > out2.txt 2> err2.txt; echo $? > rc2.txt
""")
    assert (tmp_path / "rc1.txt").read_text().strip() == "1"
    line = last_line(tmp_path / "err1.txt")
    assert "the disk is full" in line and "MiB free" in line, line
    assert ".hindsearch.lock" not in (tmp_path / "ls1.txt").read_text()  # nothing left to refuse the next run
    assert not any(n.startswith(".") and ".tmp-" in n for n in (tmp_path / "ls1.txt").read_text().split())
    # with space again, the same command runs at once (no "in use: process ?")
    assert (tmp_path / "rc2.txt").read_text().strip() == "0", (tmp_path / "err2.txt").read_text()[-2000:]


@needs_tmpfs
@pytest.mark.parametrize("size", ["24m", "40m"], ids=["weights-do-not-fit", "optimizer-does-not-fit"])
def test_training_onto_a_full_disk_says_the_disk_is_full(tmp_path, size):
    """The run folder fits its logs and the initial weights (16 MB), not the first checkpoint (42 MB): with 24 MB
    safetensors fails on the weights, with 40 MB torch's zip writer on optimizer.pt ("unexpected pos")."""
    from test_output_safety import tiny_config

    tiny_config(tmp_path / "tiny.toml", tmp_path / "world")
    on_small_disk(tmp_path, size, f"""
$HS train --config {tmp_path / "tiny.toml"} --out "$M/run" --set train.steps=1 --set train.save_steps=1 \
  > out.txt 2> err.txt; echo $? > rc.txt
ls -A "$M/run" "$M/run/checkpoints" > ls.txt 2>&1
""")
    assert (tmp_path / "rc.txt").read_text().strip() == "1"
    line = last_line(tmp_path / "err.txt")
    assert "the disk is full" in line and "checkpoint-1" in line and "MiB free" in line, line
    assert "enforce fail" not in line and "unexpected pos" not in line
    listing = (tmp_path / "ls.txt").read_text()
    assert ".hindsearch.lock" not in listing and ".checkpoint-staging" not in listing, listing  # space given back
