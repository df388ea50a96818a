"""Safe output folders: replace only what hindsearch wrote, atomic publishes, PID locks, atomic checkpoints.

* ``check_replaceable(out, is_ours)`` refuses an ``--out`` that is a file, the current folder (or
  one above it), or a non-empty folder hindsearch did not write (``is_ours`` looks for the
  folder's marker file: ``index.json`` for an index, ``world.json`` for a world).
* ``staging(out)`` yields a temporary sibling folder to build into and removes it when the build
  fails; ``publish(tmp, out)`` renames it into place (the old folder is moved aside first and
  deleted only after the rename).
* ``FolderLock(folder)`` holds ``folder/.hindsearch.lock`` (PID, host, process start time) for one
  writer; a second writer gets ``FolderLocked`` naming the holder. A lock whose process is gone
  (or whose PID was reused by another process) is stale and taken over, with a message.
* ``atomic_checkpoints(trainer)`` makes a transformers ``Trainer`` write each checkpoint into a
  staging folder, mark it complete and rename it into place; ``complete_checkpoints(dir)`` lists
  the checkpoints a resume may use, newest first, with the reasons others were skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

LOCK_NAME = ".hindsearch.lock"
COMPLETE_NAME = "hindsearch-complete.json"
STAGING_NAME = ".checkpoint-staging"


class UnsafeOutput(FileExistsError):
    """An output path that hindsearch refuses to write over (it would delete or replace user data)."""


class FolderLocked(RuntimeError):
    """Another live process holds the folder's lock."""


# ---------------------------------------------------------------- output folders
def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def check_replaceable(out: str | Path, is_ours: Callable[[Path], bool], what: str, flag: str = "--out",
                      protect: tuple[str | Path, ...] = ()) -> None:
    """Raise ``UnsafeOutput`` unless ``out`` is missing, an empty folder, or a folder ``is_ours`` accepts.

    ``protect`` lists inputs (e.g. the corpus being indexed) that must not lie inside ``out``.
    """
    out = Path(out)
    res = out.resolve()
    if out.exists() and not out.is_dir():
        raise UnsafeOutput(f"{flag} {out}: is a file, not a folder; choose a new folder for the {what}")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise UnsafeOutput(f"{flag} {out}: {parent} is a file, not a folder; choose another path for the {what}")
    if _inside(Path.cwd().resolve(), res):
        raise UnsafeOutput(f"{flag} {out}: is the current folder or a folder above it; choose a new folder for the {what}")
    for p in protect:
        if _inside(Path(p).resolve(), res):
            raise UnsafeOutput(f"{flag} {out}: holds the input {p}, which replacing it would delete; choose another folder")
    if out.is_dir() and any(out.iterdir()) and not is_ours(out):
        raise UnsafeOutput(f"{flag} {out}: folder holds files hindsearch did not write (it is not a {what}); "
                           f"refusing to replace it; choose a new or empty folder")


def json_marker(filename: str, key: str) -> Callable[[Path], bool]:
    """A predicate for ``check_replaceable``: the folder holds ``filename``, a JSON object with ``key``."""

    def is_ours(folder: Path) -> bool:
        try:
            meta = json.loads((Path(folder) / filename).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(meta, dict) and key in meta

    return is_ours


@contextlib.contextmanager
def staging(out: str | Path) -> Iterator[Path]:
    """A fresh temporary sibling of ``out`` (``.NAME.tmp-PID``), removed if the block raises."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, out: str | Path) -> Path:
    """Rename ``tmp`` to ``out``; an existing ``out`` (already checked replaceable) is moved aside, then deleted."""
    out = Path(out)
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}"
        out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            old.rename(out)  # put the previous folder back
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
    return out


# ---------------------------------------------------------------- lock
def _proc_start(pid: int) -> str | None:
    """The process' start time in clock ticks since boot (Linux), to tell a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FolderLock:
    """One writer per folder: ``with FolderLock(run_dir, "run folder"): ...``.

    The lock file holds ``{"pid", "host", "start", "cmd", "since"}``. A lock is stale when its host
    is this host and its process is gone or its PID now belongs to a process started at another
    time; a stale lock is replaced (``log`` says so). A live holder, or a holder on another host,
    raises ``FolderLocked`` naming the process and the lock file to delete if it is wrong.
    """

    def __init__(self, folder: str | Path, what: str = "folder", log: Callable[[str], Any] | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self.log = log
        self.held = False

    def _mine(self) -> dict[str, Any]:
        import sys

        return {"pid": os.getpid(), "host": socket.gethostname(), "start": _proc_start(os.getpid()),
                "cmd": " ".join(sys.argv[:3])[:200], "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def _holder(self) -> dict[str, Any] | None:
        """The current holder's record, or None when the lock is stale (or vanished)."""
        try:
            text = self.path.read_text()
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            info = json.loads(text)
            pid = int(info["pid"])
        except (ValueError, KeyError, TypeError):
            return {"pid": "?", "since": "just now"} if age < 5 else None  # being written, or torn long ago
        if info.get("host") != socket.gethostname():
            return info
        if not _alive(pid):
            return None
        start = _proc_start(pid)
        if info.get("start") and start and start != info["start"]:
            return None  # the PID was reused by another process
        return info

    def _refuse(self, holder: dict[str, Any]) -> FolderLocked:
        where = "" if holder.get("host") in (None, socket.gethostname()) else f" on host {holder['host']}"
        return FolderLocked(
            f"{self.folder} is in use: process {holder.get('pid')}{where} ({holder.get('cmd') or 'hindsearch'}, "
            f"since {holder.get('since', '?')}) is writing this {self.what}; wait for it or stop it, "
            f"or choose another folder (if no such process runs, delete {self.path})")

    def check(self) -> None:
        """Raise ``FolderLocked`` now if a live process holds the lock (without taking it): lets a
        command fail before it loads a model, and take the lock later."""
        holder = self._holder() if self.path.exists() else None
        if holder is not None:
            raise self._refuse(holder)

    def acquire(self) -> "FolderLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None:
                    raise self._refuse(holder) from None
                stale = self.path.read_text() if self.path.exists() else ""
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                if self.log:
                    self.log(f"removed a stale lock in {self.folder} ({stale.strip()[:120] or 'empty'})")
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self._mine()) + "\n")
            self.held = True
            return self
        raise FolderLocked(f"could not take the lock {self.path} (other processes keep taking it)")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            if json.loads(self.path.read_text()).get("pid") == os.getpid():
                self.path.unlink()
        except (OSError, ValueError):
            pass

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


# ---------------------------------------------------------------- checkpoints
def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed from (None when it is complete)."""
    if not (ckpt / COMPLETE_NAME).exists() and not (ckpt / "trainer_state.json").exists():
        return "incomplete: no trainer_state.json (interrupted while saving)"
    try:
        json.loads((ckpt / "trainer_state.json").read_text())
    except (OSError, ValueError) as e:
        return f"incomplete: trainer_state.json unreadable ({type(e).__name__})"
    if not any(ckpt.glob("*.safetensors")) and not any(ckpt.glob("*.bin")) and not any(ckpt.glob("*.pt")):
        return "incomplete: no weights file"
    return None


def complete_checkpoints(ckpt_dir: str | Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(complete checkpoints newest first, [(skipped checkpoint, reason)]) of ``ckpt_dir``."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return [], []
    found = []
    for p in d.iterdir():
        name = p.name
        if p.is_dir() and name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit():
            found.append((int(name[len("checkpoint-"):]), p))
    good, skipped = [], []
    for _, p in sorted(found, reverse=True):
        why = checkpoint_problem(p)
        (skipped.append((p, why)) if why else good.append(p))
    return good, skipped


def atomic_checkpoints(trainer: Any) -> Any:
    """Make ``trainer._save_checkpoint`` atomic: save into ``OUTPUT/.checkpoint-staging``, write the
    completion marker, then rename ``checkpoint-N`` into ``OUTPUT`` and rotate there. A kill during a
    save leaves only the staging folder, which no resume reads (it is cleared on the next save)."""
    from transformers.trainer_utils import rotate_checkpoints

    original_save = trainer._save_checkpoint
    original_dir = trainer._get_output_dir

    def save(model: Any, trial: Any) -> None:
        real = Path(original_dir(trial=trial))
        stage = real / STAGING_NAME
        if trainer.args.should_save:
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True, exist_ok=True)
        trainer.accelerator.wait_for_everyone()
        trainer._get_output_dir = lambda trial=None: str(stage)
        try:
            original_save(model, trial)
        finally:
            trainer._get_output_dir = original_dir
        trainer.accelerator.wait_for_everyone()
        if trainer.args.should_save:
            for ck in sorted(stage.iterdir()):
                (ck / COMPLETE_NAME).write_text(json.dumps({"step": trainer.state.global_step}) + "\n")
                dest = real / ck.name
                if dest.exists():  # a checkpoint of the same step from an earlier try: replace it
                    publish(ck, dest)
                else:
                    ck.rename(dest)
            _fsync_dir(real)
            shutil.rmtree(stage, ignore_errors=True)
            rotate_checkpoints(output_dir=str(real), save_total_limit=trainer.args.save_total_limit,
                               best_model_checkpoint=trainer.state.best_model_checkpoint, use_mtime=True)
        trainer.accelerator.wait_for_everyone()

    trainer._save_checkpoint = save
    return trainer
