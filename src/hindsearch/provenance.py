"""What made an output folder: the hindsearch source (version, git commit, uncommitted changes) and
the machine.

``provenance()`` is stored in every output folder's marker (``fsutil.claim_output``) under
``"provenance"``, so that ``hindsearch report`` can show the commit and the hardware a run was made
with. It is written when the folder is claimed, costs a few milliseconds and never fails: what
cannot be found is None. No host name and no user name are recorded. The fields: docs/runs.md,
"Output folders".
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
"""The folder hindsearch is imported from (``src/hindsearch`` in a checkout)."""

TIMEOUT_S = 5.0
"""Seconds each external query (git, nvidia-smi) may take before it counts as not found."""


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of ``cmd`` (stripped), None when it is missing, fails or runs past ``TIMEOUT_S``."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def git_source(folder: Path = PACKAGE_DIR) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git checkout that holds ``folder`` as a tracked folder (a
    package installed into a virtualenv that lies inside some checkout is not that checkout's:
    None)."""
    if shutil.which("git") is None or "site-packages" in folder.parts:
        return None
    top = _run(["git", "rev-parse", "--show-toplevel"], folder)
    if not top or _run(["git", "ls-files", "--error-unmatch", "__init__.py"], folder) is None:
        return None
    commit = _run(["git", "rev-parse", "HEAD"], folder)
    if not commit:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], Path(top))
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def pip_vcs_commit() -> str | None:
    """The commit pip recorded for a package installed from a git URL (``direct_url.json``), else
    None."""
    from importlib import metadata

    try:
        raw = metadata.distribution("hindsearch").read_text("direct_url.json")
        info = json.loads(raw) if raw else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None
    vcs = info.get("vcs_info") if isinstance(info, dict) else None
    return (vcs.get("commit_id") if isinstance(vcs, dict) and isinstance(vcs.get("commit_id"), str)
            else None)


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines(
                ):
            if line.lower().startswith(("model name", "hardware", "cpu model")) and ":" in line:
                return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def memory_gb() -> float | None:
    """Physical memory in GB (None where ``sysconf`` does not say)."""
    try:
        return round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def gpus() -> list[dict[str, Any]]:
    """``[{"name", "memory_mib"}]`` of the GPUs ``nvidia-smi`` lists ([] without it: CUDA is never
    initialised in this process, so a later fork is safe)."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    rows = []
    for line in (out or "").splitlines():
        name, _, mem = line.rpartition(",")
        try:
            rows.append({"name": name.strip(), "memory_mib": int(float(mem))})
        except ValueError:
            rows.append({"name": line.strip(), "memory_mib": None})
    return rows


def host() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {"os": f"{platform.system()} {platform.release()}".strip(),
            "machine": platform.machine() or None, "python": platform.python_version(),
            "cpu": cpu_model(), "cpus": os.cpu_count(), "cpus_usable": usable,
            "memory_gb": memory_gb(), "gpus": gpus(),
            "torch": _version("torch"), "transformers": _version("transformers"),
            "trl": _version("trl"), "world_size": int(os.environ["WORLD_SIZE"])
            if os.environ.get("WORLD_SIZE", "").isdigit() else None}


@functools.cache
def _static() -> dict[str, Any]:
    """The parts that do not change while this process runs (the machine, the installed
    versions)."""
    return {"host": host(), "version": _version("hindsearch")}


def provenance() -> dict[str, Any]:
    """``{"hindsearch": {"version", "commit", "dirty"}, "host": {...}}`` (see the module docstring).
    The commit is asked for each time: a checkout can move while one process (a test session) claims
    several folders."""
    src = git_source()
    if src is None:
        commit = pip_vcs_commit()
        src = {"commit": commit, "dirty": None}
    static = _static()
    return {"hindsearch": {"version": static["version"], **src}, "host": dict(static["host"])}
