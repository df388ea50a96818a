"""Safe output folders (replace only what hindsearch wrote), atomic publishes, PID locks,
checkpoints.

``expand_out`` is the one place an output path's ``~`` is expanded. ``check_replaceable`` /
``guard_output`` / ``claim_output`` refuse an ``--out`` hindsearch did not write (or holding a file
it did not write); ``staging`` + ``publish`` build beside and rename into place; ``FolderLock``
holds one writer per folder (a stale lock is taken over); ``AtomicCheckpoints`` writes each
checkpoint complete or not at all and never saves a non-finite weight, and ``complete_checkpoints``
lists those a resume may use. ``iter_jsonl`` / ``read_jsonl`` are the one JSONL reader
(``JSONL_MODES``). The user-facing rules: docs/runs.md, "Output folders".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

LOCK_NAME = ".hindsearch.lock"
OUTPUT_MARKER = ".hindsearch-output.json"
COMPLETE_NAME = "hindsearch-complete.json"
STAGING_NAME = ".checkpoint-staging"


class UnsafeOutput(FileExistsError):
    """An output path hindsearch refuses to write over (it would delete or replace user data)."""


class FolderLocked(RuntimeError):
    """Another live process holds the folder's lock."""


class DiskFull(OSError):
    """A write failed for a full disk (or user quota); the message says so and names the folder."""


_NO_SPACE = ("no space left on device", "os error 28", "disk quota exceeded")
_WRITE_FAILED = ("unexpected pos", "file write failed")
"""How a failed write reads when no OSError carries its errno (safetensors' Rust writer says why,
torch's zip writer only that its file position is wrong)."""


def _free(folder: Path) -> int | None:
    for p in (Path(folder), *Path(folder).parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(p).free
    return None


def disk_full(err: BaseException, folder: str | Path, what: str) -> DiskFull | None:
    """``DiskFull`` for ``err`` when it is a write into ``folder`` that failed for want of space
    (ENOSPC or EDQUOT, or a library's write error with under 64 MiB free); else None."""
    import errno

    text = str(err).lower()
    free = _free(Path(folder))
    no_space = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
    no_space = no_space or any(s in text for s in _NO_SPACE)
    low = free is not None and free < 64 << 20
    if not no_space and not (any(s in text for s in _WRITE_FAILED) and low):
        return None
    left = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
    full = DiskFull(f"the disk is full: writing {what} in {folder} failed ({left}); "
                    f"free some space and rerun")
    full.errno = errno.ENOSPC
    return full


def _write_fresh(path: Path, text: str, what: str, fd: int | None = None) -> None:
    """Write ``text`` into ``path`` (a new file, or ``fd`` just created for it); a failed write
    removes the file again (no empty or torn file is left) and a full disk raises ``DiskFull``."""
    if fd is None:
        fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        with contextlib.suppress(OSError):
            path.unlink()
        raise (disk_full(e, path.parent, what) or e) from e


class NotRegularFile(OSError):
    """A file a reader refuses to open: not a regular file (a FIFO, a socket, a device such as
    ``/dev/zero``), or larger than the reader's size cap. Its message says which, without the path
    (the caller names the file)."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def open_regular(path: str | Path, cap: int | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, only when it is a regular file (checked on the opened
    file, so a symbolic link to ``/dev/zero`` or a FIFO is refused too, without blocking) of at most
    ``cap`` bytes; else ``NotRegularFile``. A file that grows after the check is the reader's to
    bound."""
    # a FIFO opens at once instead of waiting for a writer
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise NotRegularFile(f"{kind}, not a regular file; not read")
        if cap is not None and st.st_size > cap:
            raise NotRegularFile(
                f"{st.st_size} bytes, over the {cap / 2**20:.0f} MiB this reads; not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


JSONL_MODES = ("strict", "skip-bad", "drop-torn-tail", "yield-bad")
"""How ``iter_jsonl`` meets a bad line: ``strict`` raises ``BadJsonl`` naming the file and line;
``skip-bad`` skips it and names it in ``bad``; ``drop-torn-tail`` drops a last line without a
newline that does not parse (what a killed writer leaves; named in ``bad``) and is strict about
every other line; ``yield-bad`` yields it as ``(line, BadLine(reason))`` in file order, for a caller
that names it in its own words (and is strict about the file itself)."""


class BadJsonl(ValueError):
    """A JSONL file or line its reader refuses: the message names the file and the line."""


@dataclass(frozen=True)
class BadLine:
    """A line ``iter_jsonl`` could not read (``yield-bad`` mode): why, without the file and line."""

    reason: str


def _clean(s: str) -> str:
    """``s`` as text that encodes to UTF-8 (a lone surrogate of a non-UTF-8 name shown escaped)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


def json_problem(e: BaseException) -> str:
    """Why a JSON text did not parse: the decoder's message and column, a value nested too deep for
    the parser, or another ``ValueError`` (an integer past Python's digit limit, say)."""
    if isinstance(e, json.JSONDecodeError):
        return f"invalid JSON: {e.msg} (column {e.colno})"
    if isinstance(e, RecursionError):
        return "invalid JSON: nested too deep to read"
    return f"invalid JSON: {_clean(str(e))[:200]}"


def iter_jsonl(path: str | Path, mode: str = "strict", bad: list[str] | None = None, *,
               name: str | None = None, parse: Callable[[str], Any] = json.loads,
               objects: bool = True, max_bytes: int | None = None,
               max_line: int | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSONL file (nothing when it is absent),
    read through ``open_regular`` (a FIFO or a device is refused, never read). A line that is not
    UTF-8, does not ``parse``, or (``objects``) is not a JSON object is bad; ``mode``
    (``JSONL_MODES``) says what then. ``bad`` collects ``"file:line: reason"`` of what was skipped
    or dropped; ``name`` is how the file is named (default: its path). ``max_bytes`` / ``max_line``
    cap what is read; past a cap the rest is not read (named, or an error). A byte-order mark before
    the first line is read past, and a ``.gz`` file is read decompressed."""
    if mode not in JSONL_MODES:
        raise ValueError(f"iter_jsonl: mode {mode!r} is not one of {', '.join(JSONL_MODES)}")
    where = name or str(path)
    bad = [] if bad is None else bad
    if not Path(path).exists():
        return

    def refuse(message: str) -> None:
        # yield-bad: the file itself (a FIFO, past a cap) is the caller's error
        if mode != "skip-bad":
            raise BadJsonl(message)
        bad.append(message)

    try:
        with open_regular(path) as plain, _decompressed(plain, str(path)) as f:
            read = 0
            lines = f if max_line is None else iter(lambda: f.readline(max_line + 1), b"")
            for i, raw in enumerate(lines, 1):
                read += len(raw)
                if i == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a BOM is no row
                    raw = raw[3:]
                if max_bytes is not None and read > max_bytes:
                    return refuse(f"{where}:{i}: past the first {max_bytes >> 20} MiB; "
                                  f"the rest is not read")
                if max_line is not None and len(raw) > max_line:
                    return refuse(f"{where}:{i}: a line over {max_line >> 20} MiB; "
                                  f"the rest is not read")
                if not raw.strip():
                    continue
                torn = not raw.endswith(b"\n")  # only the last line can lack one
                try:
                    value = parse(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    problem = f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                except (ValueError, RecursionError) as e:
                    problem = json_problem(e)
                else:
                    if not objects or isinstance(value, dict):
                        yield i, value
                        continue
                    problem, torn = "not a JSON object", False  # it parsed: whole, not torn
                if mode == "yield-bad":
                    yield i, BadLine(problem)
                    continue
                if torn and mode == "drop-torn-tail":
                    bad.append(f"{where}: dropped a torn last line {i} "
                               f"(no newline at its end: a write cut short)")
                    return
                refuse(f"{where}:{i}: {problem}")
    except NotRegularFile as e:
        refuse(f"{where}: {e}")
    except OSError as e:
        if mode != "skip-bad":
            raise
        bad.append(f"{where}: unreadable ({type(e).__name__}: {_clean(str(e))[:200]})")


def _decompressed(f: BinaryIO, name: str) -> contextlib.AbstractContextManager[Any]:
    """``f`` read through gzip when ``name`` ends with ``.gz``; else ``f`` itself."""
    if name.endswith(".gz"):
        import gzip

        return gzip.GzipFile(fileobj=f, mode="rb")
    return contextlib.nullcontext(f)


def read_jsonl(path: str | Path, mode: str = "strict", bad: list[str] | None = None,
               **options: Any) -> list[Any]:
    """The values of a JSONL file (``iter_jsonl``, same arguments), without their line numbers."""
    return [value for _, value in iter_jsonl(path, mode, bad, **options)]


def drop_torn_tail(path: str | Path) -> None:
    """Cut a file after its last newline: what ``drop-torn-tail`` dropped leaves the file too."""
    with open(path, "rb+") as f:
        data = f.read()
        f.truncate(data.rfind(b"\n") + 1)


class NonFiniteWeights(RuntimeError):
    """A weight is NaN or inf after optimizer step ``step`` (``name``: the first such parameter);
    nothing of that step is saved."""

    def __init__(self, message: str, step: int, name: str) -> None:
        super().__init__(message)
        self.step, self.name = step, name


# ---------------------------------------------------------------- output folders
def _inside(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def expand_out(path: str | Path) -> Path:
    """An output path with ``~`` expanded: the one place this happens, so logs and checkpoints of
    one ``--out '~/x'`` land in the same folder."""
    return Path(os.path.expanduser(str(path)))


def _a(what: str) -> str:
    return ("an " if what[:1] in "aeiou" else "a ") + what


def _has_content(folder: Path) -> bool:
    """Whether ``folder`` holds anything but a (stale) lock file."""
    return any(p.name != LOCK_NAME for p in folder.iterdir())


def written_files(folder: str | Path) -> list[str]:
    """Every file (or link) under ``folder``, as sorted paths relative to it: what a build wrote,
    for its marker."""
    folder = Path(folder)
    files = (p for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    return sorted(str(p.relative_to(folder)) for p in files)


def strays(folder: Path, listed: list[str] | None, marker: str) -> list[str]:
    """The files of ``folder`` that a replace would delete and its maker did not write: those not in
    ``listed`` (the files its marker records), or, when the marker records none, those modified
    after the ``marker`` file."""
    if listed is not None:
        known = set(listed)
        return [f for f in written_files(folder) if f not in known and f != LOCK_NAME]
    try:
        since = (folder / marker).stat().st_mtime
    except OSError:
        return []
    return [f for f in written_files(folder) if f not in (marker, LOCK_NAME)
            and (folder / f).lstat().st_mtime > since + 1.0]


def check_replaceable(out: str | Path, is_ours: Callable[[Path], bool], what: str,
                      flag: str = "--out", protect: tuple[str | Path, ...] = (),
                      stray: Callable[[Path], list[str]] | None = None) -> Path:
    """Raise ``UnsafeOutput`` unless ``out`` is missing, an empty folder, or a folder ``is_ours``
    accepts that holds no file ``stray`` names (files its maker did not write: replacing the folder
    would delete them).

    ``protect`` lists inputs (e.g. the corpus being indexed) that must not lie inside ``out``.
    Returns ``out`` with ``~`` expanded (``expand_out``).
    """
    out = expand_out(out)
    res = out.resolve()
    if out.exists() and not out.is_dir():
        raise UnsafeOutput(f"{flag} {out}: is a file, not a folder; "
                           f"choose a new folder for the {what}")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise UnsafeOutput(f"{flag} {out}: {parent} is a file, not a folder; "
                               f"choose another path for the {what}")
    if _inside(Path.cwd().resolve(), res):
        raise UnsafeOutput(f"{flag} {out}: is the current folder or a folder above it; "
                           f"choose a new folder for the {what}")
    for p in protect:
        if _inside(Path(p).resolve(), res):
            raise UnsafeOutput(f"{flag} {out}: holds the input {p}, "
                               f"which replacing it would delete; choose another folder")
    if out.is_dir() and _has_content(out) and not is_ours(out):
        kind = output_kind(out)
        if kind is not None:
            raise UnsafeOutput(f"{flag} {out}: is a hindsearch {KIND_NAMES.get(kind, kind)}, "
                               f"not {_a(what)}; choose a new or empty folder")
        raise UnsafeOutput(f"{flag} {out}: folder holds files hindsearch did not write "
                           f"(it is not {_a(what)}); refusing to replace it; "
                           f"choose a new or empty folder")
    if stray is not None and out.is_dir() and (extra := stray(out)):
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise UnsafeOutput(f"{flag} {out}: holds {extra[0]}{more}, which hindsearch did not write; "
                           f"rebuilding the {what} would delete it; "
                           f"move it out or choose another folder")
    return out


KIND_NAMES = {"run": "run folder", "eval": "evaluation folder", "mini": "mini-wiki folder",
              "sft": "warm-up folder", "compare": "comparison folder", "probe": "probe folder"}


def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """The folder's ``OUTPUT_MARKER`` record (``{"kind": ...}``), or None."""
    try:
        meta = json.loads((Path(folder) / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("kind"), str) else None


def output_kind(folder: str | Path) -> str | None:
    meta = read_marker(folder)
    return meta["kind"] if meta else None


def guard_output(out: str | Path, kind: str, what: str | None = None, flag: str = "--out",
                 protect: tuple[str | Path, ...] = ()) -> Path:
    """``check_replaceable`` for a folder a command writes into: ours when its marker names
    ``kind``. Returns the expanded path."""
    if not str(out).strip():
        raise UnsafeOutput(f"{flag} is empty (it would write into the current folder); "
                           f"give a new folder")

    def is_ours(folder: Path) -> bool:
        return output_kind(folder) == kind

    return check_replaceable(out, is_ours, what or KIND_NAMES.get(kind, kind), flag, protect)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON via a temporary file and a rename (a crash keeps the old or new)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_fresh(tmp, json.dumps(obj, indent=1, default=str) + "\n", path.name)
    tmp.replace(path)


def claim_output(out: str | Path, kind: str, **record: Any) -> dict[str, Any]:
    """Create ``out`` and mark it as a hindsearch ``kind`` folder (``record`` is stored in the
    marker, with the ``provenance``: the hindsearch commit and the machine that made the folder,
    which ``hindsearch report`` shows)."""
    from hindsearch.provenance import provenance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"kind": kind, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "provenance": provenance(), **record}
    write_json_atomic(out / OUTPUT_MARKER, meta)
    return meta


def json_marker(filename: str, key: str) -> Callable[[Path], bool]:
    """For ``check_replaceable``: the folder holds ``filename``, a JSON object with ``key``."""

    def is_ours(folder: Path) -> bool:
        try:
            meta = json.loads((Path(folder) / filename).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(meta, dict) and key in meta

    return is_ours


def _link_target(out: str | Path) -> Path:
    """``out``, or the path a symbolic link ``out`` points to (followed to the end)."""
    out = expand_out(out)
    return Path(os.path.realpath(out)) if out.is_symlink() else out


@contextlib.contextmanager
def staging(out: str | Path) -> Iterator[Path]:
    """A fresh temporary sibling of ``out`` (``.NAME.tmp-PID``), removed if the block raises. When
    ``out`` is a symbolic link, the sibling is made next to the folder the link points to (see
    ``publish``)."""
    out = _link_target(out)
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
    """Rename ``tmp`` to ``out``; an existing ``out`` (already checked replaceable) is moved aside,
    then deleted. A symbolic link ``out`` stays a link: the folder it points to is replaced."""
    out = _link_target(out)
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

    def __init__(self, folder: str | Path, what: str = "folder",
                 log: Callable[[str], Any] | None = None):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self.log = log
        self.held = False

    def _mine(self) -> dict[str, Any]:
        import sys

        return {"pid": os.getpid(), "host": socket.gethostname(), "start": _proc_start(os.getpid()),
                "cmd": " ".join(sys.argv[:3])[:200],
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

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
            # being written, or torn long ago
            return {"pid": "?", "since": "just now"} if age < 5 else None
        if info.get("host") != socket.gethostname():
            return info
        if not _alive(pid):
            return None
        start = _proc_start(pid)
        if info.get("start") and start and start != info["start"]:
            return None  # the PID was reused by another process
        return info

    def _refuse(self, holder: dict[str, Any]) -> FolderLocked:
        here = holder.get("host") in (None, socket.gethostname())
        where = "" if here else f" on host {holder['host']}"
        return FolderLocked(
            f"{self.folder} is in use: process {holder.get('pid')}{where} "
            f"({holder.get('cmd') or 'hindsearch'}, since {holder.get('since', '?')}) "
            f"is writing this {self.what}; wait for it or stop it, "
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
                    self.log(f"removed a stale lock in {self.folder} "
                             f"({stale.strip()[:120] or 'empty'})")
                continue
            # removed again when the write fails (a full disk): no empty lock refuses the next run
            _write_fresh(self.path, json.dumps(self._mine()) + "\n", "its lock", fd)
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


WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "adapter_model.bin")
"""The weights files a transformers/PEFT save writes (one of them; an index names its shards)."""
TRAINING_STATE = ("optimizer.pt", "scheduler.pt")
"""Written next to the weights unless ``save_only_model``; with the RNG state (``rng_state*.pth``)
and ``trainer_state.json`` they are what a resume needs to continue the same run."""


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is unreadable (None when its header parses and its size matches)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes)"
            n = int.from_bytes(head, "little")
            if n > size - 8:
                return f"{path.name} is truncated (header of {n} bytes in a {size}-byte file)"
            meta = json.loads(f.read(n))
        ends = (int(v["data_offsets"][1]) for k, v in meta.items() if k != "__metadata__")
        end = max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"{path.name} is unreadable ({type(e).__name__})"
    if 8 + n + end != size:
        return f"{path.name} is truncated ({size} bytes, its header says {8 + n + end})"
    return None


def _torch_file_problem(path: Path) -> str | None:
    """Why a ``torch.save`` file is unreadable: it is a zip archive whose directory is at its end,
    so a truncated or empty file fails to open (its tensors are not read)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            if not z.namelist():
                return f"{path.name} is empty"
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        return f"{path.name} is unreadable or truncated ({type(e).__name__})"
    return None


def corrupted_file(path: Path) -> str | None:
    """Why a ``torch.save`` file (a zip archive) is corrupted: a member whose bytes fail the CRC-32
    the archive recorded when it was written (bytes overwritten in place, the size unchanged). Reads
    the whole file."""
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (OSError, EOFError, zipfile.BadZipFile, ValueError, NotImplementedError,
            zlib.error) as e:
        return f"{path.name} is unreadable ({type(e).__name__}: {e})"
    return f"{path.name} is corrupted ({bad} fails its CRC check)" if bad else None


def _file_problem(path: Path) -> str | None:
    if not path.is_file():
        return f"no {path.name}"
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix in (".pt", ".pth", ".bin"):
        return _torch_file_problem(path)
    if path.suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return f"{path.name} is unreadable ({type(e).__name__})"
    return None


def _weights_problem(ckpt: Path) -> str | None:
    names = [n for n in WEIGHT_NAMES if (ckpt / n).exists()]
    if not names:
        return f"no weights file ({', '.join(WEIGHT_NAMES[:3])}, ...)"
    for n in names:
        if why := _file_problem(ckpt / n):
            return why
        if n.endswith(".index.json"):  # sharded weights: every shard it names
            try:
                shards = sorted(set(json.loads((ckpt / n).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as e:
                return f"{n} is unreadable ({type(e).__name__})"
            for shard in shards:
                if why := _file_problem(ckpt / shard):
                    return why
    return None


def _sharded_layout(ckpt: Path) -> bool:
    """A DeepSpeed or FSDP save (``global_stepN/``, ``pytorch_model_fsdp_0``, ``optimizer_0``): its
    weights and optimizer are not the files ``checkpoint_problem`` checks by name (the recorded
    sizes still are)."""
    sharded = ("global_step", "pytorch_model_fsdp", "optimizer_0")
    return any(p.name.startswith(sharded) for p in ckpt.iterdir())


def checkpoint_problem(ckpt: Path, model_only: bool | None = None) -> str | None:
    """Why ``ckpt`` cannot be resumed from (None when it is complete).

    Complete means: ``trainer_state.json`` readable, the weights readable and of the size their
    header says (every shard of a sharded save), and, unless the save was model-only,
    ``optimizer.pt``, ``scheduler.pt`` and the RNG state (``rng_state*.pth``) present and readable.
    The completion marker written by ``AtomicCheckpoints`` lists every file with its size; a file
    that changed size since (truncated, replaced) or went missing makes the checkpoint incomplete
    too.
    """
    ckpt = Path(ckpt)
    marker: dict[str, Any] = {}
    if (ckpt / COMPLETE_NAME).exists():
        try:
            marker = json.loads((ckpt / COMPLETE_NAME).read_text())
        except (OSError, ValueError):
            return f"incomplete: {COMPLETE_NAME} unreadable"
        if not isinstance(marker, dict):
            return f"incomplete: {COMPLETE_NAME} unreadable"
    if not (ckpt / "trainer_state.json").exists():
        return "incomplete: no trainer_state.json (interrupted while saving)"
    if why := _file_problem(ckpt / "trainer_state.json"):
        return f"incomplete: {why}"
    files = marker.get("files")
    if isinstance(files, dict):
        for name, size in sorted(files.items()):
            p = ckpt / name
            if not p.is_file():
                return f"incomplete: {name} is missing (it was written with the checkpoint)"
            if isinstance(size, int) and p.stat().st_size != size:
                return f"incomplete: {name} is {p.stat().st_size} bytes, it was written with {size}"
    if model_only is None:
        model_only = bool(marker.get("model_only", False))
    layout = marker.get("layout") or ("sharded" if _sharded_layout(ckpt) else "standard")
    if layout == "standard":
        if why := _weights_problem(ckpt):
            return f"incomplete: {why}"
        if not model_only:
            for name in TRAINING_STATE:
                if why := _file_problem(ckpt / name):
                    restart = " (the optimizer would restart from zero)"
                    return f"incomplete: {why}" + (restart if name == "optimizer.pt" else "")
            rng = sorted(ckpt.glob("rng_state*.pth"))
            if not rng:
                return "incomplete: no rng_state.pth"
            for r in rng:
                if why := _torch_file_problem(r):
                    return f"incomplete: {why}"
    return None


def corrupted_checkpoint(ckpt: Path) -> str | None:
    """Why ``ckpt``'s torch files (optimizer, scheduler, RNG state, training arguments) are
    corrupted although complete (``corrupted_file``); read in full, so a resume checks only the
    checkpoint it starts from."""
    for p in sorted(Path(ckpt).rglob("*")):
        if p.is_file() and p.suffix in (".pt", ".pth", ".bin") and (why := corrupted_file(p)):
            return f"corrupted: {why}"
    return None


def nonfinite_parameter(model: Any) -> str | None:
    """The name of ``model``'s first parameter holding a NaN or inf (None when all are finite)."""
    import torch

    for name, p in model.named_parameters():
        if p.numel() and not bool(torch.isfinite(p.detach()).all()):
            return name
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


class AtomicCheckpoints:
    """A ``transformers.Trainer`` mixin (``class T(AtomicCheckpoints, Trainer)``) that makes each
    checkpoint save atomic: save into ``OUTPUT/.checkpoint-staging``, write the completion marker,
    then rename ``checkpoint-N`` into ``OUTPUT`` and rotate there. A kill during a save leaves only
    the staging folder, which no resume reads (it is cleared on the next save)."""

    _checkpoint_stage: Path | None = None
    """The staging folder while a checkpoint is saved (``_get_output_dir`` answers it then)."""

    def check_finite_weights(self, step: int) -> None:
        """Raise ``NonFiniteWeights`` if a weight is NaN or inf on any process (all call it)."""
        trainer: Any = self
        name = nonfinite_parameter(trainer.model)
        acc = trainer.accelerator
        if acc.num_processes > 1:  # sharded weights differ by process: all of them decide together
            import torch

            mine = torch.tensor([float(name is not None)], device=acc.device)
            flag = acc.reduce(mine, reduction="sum")
            name = name or ("a weight on another process" if float(flag.item()) > 0 else None)
        if name is not None:
            raise NonFiniteWeights(f"weight {name} is non-finite (NaN or inf) after step {step}",
                                   step, name)

    # transformers 5 has no public hook for where a checkpoint is written: these two overrides
    # redirect it
    def _get_output_dir(self, trial: Any) -> str:
        if self._checkpoint_stage is not None:
            return str(self._checkpoint_stage)
        return super()._get_output_dir(trial)  # type: ignore[misc]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        trainer: Any = self
        step = trainer.state.global_step
        try:
            # a poisoned state is never saved as a checkpoint to resume from
            self.check_finite_weights(step)
        except NonFiniteWeights as e:
            raise NonFiniteWeights(f"{e}; checkpoint-{step} is not written",
                                   e.step, e.name) from None
        real = Path(trainer._get_output_dir(trial=trial))
        stage = real / STAGING_NAME
        if trainer.args.should_save:
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True, exist_ok=True)
        trainer.accelerator.wait_for_everyone()
        self._checkpoint_stage = stage
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        except Exception as e:
            if (full := disk_full(e, real, f"checkpoint-{step}")) is None:
                raise
            if trainer.args.should_save:
                shutil.rmtree(stage, ignore_errors=True)  # the torn save: give its space back
            raise DiskFull(f"{full} (the torn save was removed; "
                           f"resume from the last complete checkpoint with --resume)") from e
        finally:
            self._checkpoint_stage = None
        trainer.accelerator.wait_for_everyone()
        if trainer.args.should_save:
            model_only = bool(getattr(trainer.args, "save_only_model", False))
            layout = "sharded" if (getattr(trainer, "is_deepspeed_enabled", False)
                                   or getattr(trainer, "is_fsdp_enabled", False)) else "standard"
            for ck in sorted(stage.iterdir()):
                if layout == "standard" and (why := checkpoint_problem(ck, model_only=model_only)):
                    free = _free(stage)
                    left = f": {free / 2**20:.1f} MiB free" if free is not None else ""
                    raise RuntimeError(
                        f"checkpoint {ck.name} was not written completely "
                        f"({why.split(': ', 1)[-1]}); "
                        f"it is left in {stage} and not resumed from; check the disk "
                        f"(space{left}, permissions) and resume from the previous checkpoint")
                written = (f for f in sorted(ck.rglob("*")) if f.is_file())
                files = {str(f.relative_to(ck)): f.stat().st_size for f in written}
                record = {"step": trainer.state.global_step, "model_only": model_only,
                          "layout": layout, "files": files}
                (ck / COMPLETE_NAME).write_text(json.dumps(record) + "\n")
                dest = real / ck.name
                if dest.exists():  # a checkpoint of the same step from an earlier try: replace it
                    publish(ck, dest)
                else:
                    ck.rename(dest)
            _fsync_dir(real)
            shutil.rmtree(stage, ignore_errors=True)
            rotate_checkpoints(output_dir=str(real), save_total_limit=trainer.args.save_total_limit,
                               best_model_checkpoint=trainer.state.best_model_checkpoint,
                               use_mtime=True)
        trainer.accelerator.wait_for_everyone()
