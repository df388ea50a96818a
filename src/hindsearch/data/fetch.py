"""``hindsearch data fetch``: download the paper-scale data from the Hugging Face hub (needs
network).

``--what`` picks ``train``, ``test``, ``wiki18``, ``e5index`` or ``all``; each dataset repo is
mirrored under ``--out`` through ``huggingface_hub.hf_hub_download`` (ETag checks, resumed
downloads, never a partial file where the data belongs). Each file is then checked by its row count
and recorded in ``fetch.json`` with its repo, commit, size and rows. The sources, paths and checks:
docs/data.md, "The paper-scale data".
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HUB = "https://huggingface.co"


@dataclass(frozen=True)
class Remote:
    """One file in a dataset repo on the hub, mirrored to ``<out>/<folder>/<path>``."""

    name: str
    """Label shown in the log."""
    repo: str
    """Dataset repo id, ``owner/name``."""
    path: str
    """File path inside the repo (kept as is under ``folder``)."""
    folder: str
    """Folder under ``--out`` that mirrors the repo (``local_dir``); ``""`` for ``--out`` itself."""
    rows: int | None = None
    """Expected rows (QA rows, parquet rows, corpus lines); ``None``: counted but not checked."""
    revision: str | None = None
    """Commit (or tag) to download; ``None``: ``main``, and the commit received is recorded."""

    @property
    def dest(self) -> str:
        """Path of the file under ``--out`` (POSIX, relative)."""
        return f"{self.folder}/{self.path}" if self.folder else self.path


@dataclass(frozen=True)
class Joined:
    """A file made by concatenating downloaded parts (Search-R1 splits its 65 GB index in two)."""

    name: str
    """Label shown in the log."""
    dest: str
    """Path of the joined file under ``--out``."""
    parts: tuple[Remote, ...]
    """The parts, in the order they are concatenated (each deleted once the join succeeded)."""
    rows: int | None = None
    """Vectors the FAISS index must hold (``ntotal``)."""
    dim: int | None = None
    """Vector size the FAISS index must have (``d``)."""


_FR = "RUC-NLPIR/FlashRAG_datasets"
_TRAIN = "PeterJinGo/nq_hotpotqa_train"
_E5 = "PeterJinGo/wiki-18-e5-index"
WIKI18_ROWS = 21015324
REMOTES: dict[str, list[Remote | Joined]] = {
    "train": [Remote("nq_hotpotqa_train", _TRAIN, "train.parquet", "nq_hotpotqa_train", 169615),
              Remote("nq_hotpotqa_test", _TRAIN, "test.parquet", "nq_hotpotqa_train")],
    "test": [Remote(name, _FR, path, "", rows) for name, path, rows in [
        ("nq", "nq/test.jsonl", 3610), ("triviaqa", "triviaqa/test.jsonl", 11313),
        ("popqa", "popqa/test.jsonl", 14267), ("hotpotqa", "hotpotqa/dev.jsonl", 7405),
        ("2wiki", "2wikimultihopqa/dev.jsonl", 12576), ("musique", "musique/dev.jsonl", 2417),
        ("bamboogle", "bamboogle/test.jsonl", 125)]],
    "wiki18": [Remote("wiki18", "PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz",
                      "wiki18", WIKI18_ROWS)],
    "e5index": [Joined("e5index", "wiki18/e5_Flat.index",
                       (Remote("e5index part_aa", _E5, "part_aa", "wiki18"),
                        Remote("e5index part_ab", _E5, "part_ab", "wiki18")),
                       rows=WIKI18_ROWS, dim=768)],
}
WHAT = ("train", "test", "wiki18", "e5index", "all")


class FetchError(RuntimeError):
    """A download that cannot go on; the message names the repo, the file and what to do."""


def default_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", _HUB).rstrip("/")


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (``huggingface_hub`` reads it only once, at import)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE")
    return constants.HF_HUB_OFFLINE if env is None else env.strip().upper() in {
        "1", "ON", "YES", "TRUE"}


def _explain(err: Exception, rem: Remote, endpoint: str, dest: Path, offline: bool) -> Exception:
    """Turn a ``huggingface_hub`` error into one plain line naming the repo and the file."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{rem.path} of dataset repo {rem.repo} (revision {rem.revision or 'main'}, {endpoint})"
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, LocalEntryNotFoundError):
        if offline:
            return FetchError(f"cannot fetch {what}: HF_HUB_OFFLINE is set and {dest} is not "
                              "downloaded yet; unset HF_HUB_OFFLINE, or copy a fetched data folder "
                              "here")
        cause = err.__cause__ or err.__context__
        why = f"{type(cause).__name__}: {cause}" if cause else str(err).split(". ")[0]
        return FetchError(f"cannot fetch {what}: the hub cannot be reached ({why}); data fetch "
                          "needs network access to the Hugging Face hub, or HF_ENDPOINT / "
                          "--endpoint set to a mirror")
    if isinstance(err, GatedRepoError):
        return FetchError(f"cannot fetch {what}: the repo is gated (HTTP {status}); accept its "
                          "terms on the hub and set HF_TOKEN (or run `hf auth login`)")
    if isinstance(err, RepositoryNotFoundError) or status == 401:
        return FetchError(f"cannot fetch {what}: the repo was not found or needs a token (HTTP "
                          f"{status}); check the name, and for a private repo set HF_TOKEN (or run "
                          "`hf auth login`)")
    if isinstance(err, RevisionNotFoundError):
        return FetchError(f"cannot fetch {what}: revision {rem.revision or 'main'} not found (HTTP "
                          f"{status})")
    if isinstance(err, RemoteEntryNotFoundError) or status == 404:
        return FetchError(f"cannot fetch {what}: no such file in the repo (HTTP {status}); "
                          "upstream may have moved it")
    if isinstance(err, HfHubHTTPError):
        return FetchError(f"cannot fetch {what}: HTTP {status}: {str(err).splitlines()[0]}")
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return FetchError(f"cannot fetch {what}: disk full while writing under {dest.parent} "
                          f"({shutil.disk_usage(_existing(dest.parent)).free} bytes free); free "
                          "space and rerun")
    return err


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def hub_download(rem: Remote, out: Path, endpoint: str,
                 etag_timeout: float = 10.0) -> tuple[Path, dict[str, Any]]:
    """Download one file with ``hf_hub_download`` into ``out/rem.folder``; returns (path, info).

    ``info``: ``commit`` (of the repo the file came from), ``bytes`` and ``downloaded`` (False when
    the local copy was current). Raises ``FetchError`` naming the repo and file; refuses up front
    when the disk has less free space than the file needs.
    """
    from huggingface_hub import hf_hub_download

    local_dir = out / rem.folder if rem.folder else out
    dest = out / rem.dest
    offline = hub_offline()
    kw: dict[str, Any] = {"repo_id": rem.repo, "filename": rem.path, "repo_type": "dataset",
                          "revision": rem.revision, "local_dir": local_dir, "endpoint": endpoint,
                          "etag_timeout": etag_timeout, "local_files_only": offline}
    # outermost folder made here
    new = next((d for d in (out, local_dir, local_dir / ".cache") if not d.exists()), None)
    try:
        # one HEAD: commit, size, whether the local copy is current
        plan = hf_hub_download(**kw, dry_run=True)
        # offline with a bare local file: a path, no plan
        will_download = getattr(plan, "will_download", False)
        size = getattr(plan, "file_size", None)
        if will_download and size:
            free = shutil.disk_usage(_existing(local_dir)).free
            if free < size:
                raise FetchError(f"cannot fetch {rem.path} of dataset repo {rem.repo}: it needs "
                                 f"{size:,} bytes and {_existing(local_dir)} has {free:,} free; "
                                 "free space or choose another --out")
        path = Path(hf_hub_download(**kw))
    except Exception as e:  # translated into one line naming the repo and file (or re-raised as is)
        if new is not None and new.is_dir() and not any(
                ".cache" not in p.relative_to(local_dir).parts for p in new.rglob("*")
                if p.is_file()):
            # a failed first download leaves no folder (only lock files were in it)
            shutil.rmtree(new, ignore_errors=True)
        if isinstance(e, FetchError):
            raise
        raise _explain(e, rem, endpoint, dest, offline) from e
    return path, {"commit": getattr(plan, "commit_hash", None), "bytes": path.stat().st_size,
                  "downloaded": will_download}


def count_rows(path: str | Path) -> int:
    """Rows of a downloaded file: parquet metadata, parsed QA rows (jsonl) or lines (.gz corpus)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    from hindsearch.data.qa import load_qa

    return len(load_qa(path))


def _check_rows(dest: Path, expected: int | None, found: int, source: str) -> None:
    if expected is not None and found != expected:
        raise FetchError(f"{dest}: expected {expected} rows, found {found} (from {source}: "
                         "upstream changed or the file is damaged; delete it to download again, or "
                         "pass --no-verify to keep it)")


IndexShape = Callable[[Path], tuple[int, int]]
"""``(vectors, dimensions)`` of a joined index file (``retrieval.dense.faiss_shape`` for FAISS): the
data layer downloads the index, the retrieval layer reads it."""


def _join(job: Joined, out: Path, endpoint: str, manifest: dict, verify: bool, etag_timeout: float,
          log, index_shape: IndexShape | None) -> dict:
    """Download ``job``'s parts, concatenate them into ``job.dest`` (through a temporary file),
    delete the parts."""
    dest = out / job.dest
    known = manifest.get(job.dest)
    if known and dest.is_file() and known.get("bytes") == dest.stat().st_size:
        log(f"{job.name}: already fetched ({dest})")
        return known
    parts = []
    for rem in job.parts:
        log(f"{rem.name}: {rem.repo}/{rem.path} -> {out / rem.dest}")
        parts.append(hub_download(rem, out, endpoint, etag_timeout))
    need, free = sum(info["bytes"] for _, info in parts), shutil.disk_usage(dest.parent).free
    if free < need:
        raise FetchError(f"cannot join {' + '.join(r.path for r in job.parts)} of dataset repo "
                         f"{job.parts[0].repo} into {dest}: it needs {need:,} bytes and "
                         f"{dest.parent} has {free:,} free (the parts are kept; free "
                         "space and rerun)")
    tmp = dest.with_name(dest.name + ".joining")
    try:
        with tmp.open("wb") as f:
            for path, _ in parts:
                with path.open("rb") as src:
                    shutil.copyfileobj(src, f, 1 << 24)
        rows = dim = None
        if verify:
            rows, dim = index_shape(tmp)
            _check_rows(dest, job.rows, rows, job.parts[0].repo)
            if job.dim is not None and dim != job.dim:
                raise FetchError(f"{dest}: vectors have {dim} dimensions, expected {job.dim}")
        tmp.replace(dest)
    except OSError as e:
        raise _explain(e, job.parts[0], endpoint, dest, False) from e
    finally:
        tmp.unlink(missing_ok=True)
    for path, _ in parts:
        path.unlink()
    return {"repo": job.parts[0].repo, "parts": [r.path for r in job.parts],
            "commit": parts[0][1]["commit"], "bytes": dest.stat().st_size, "rows": rows, "dim": dim}


def fetch(what: str, out: str | Path, endpoint: str | None = None, verify: bool = True,
          remotes: dict[str, list[Remote | Joined]] | None = None, etag_timeout: float = 10.0,
          log=print, index_shape: IndexShape | None = None) -> dict[str, Any]:
    """Fetch ``what`` (train | test | wiki18 | e5index | all) into ``out``; returns the updated
    ``fetch.json``. ``index_shape`` measures a joined index file (needed to verify ``e5index``)."""
    remotes = remotes or REMOTES
    if what not in (*remotes, "all"):
        raise ValueError(f"--what must be one of {', '.join([*remotes, 'all'])}, got {what!r}")
    endpoint = (endpoint or default_endpoint()).rstrip("/")
    out = Path(out)
    manifest_path = out / "fetch.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    jobs = [j for k in (remotes if what == "all" else [what]) for j in remotes[k]]
    joined = [j.name for j in jobs if isinstance(j, Joined)]
    if verify and index_shape is None and joined:
        raise ValueError(f"checking {', '.join(joined)} needs index_shape (e.g. "
                         "hindsearch.retrieval.dense.faiss_shape), "
                         "or verify=False")
    for job in jobs:
        if isinstance(job, Joined):
            entry = _join(job, out, endpoint, manifest, verify, etag_timeout, log, index_shape)
        else:
            log(f"{job.name}: {job.repo}/{job.path} -> {out / job.dest}")
            path, info = hub_download(job, out, endpoint, etag_timeout)
            known = manifest.get(job.dest, {})
            same = (not info["downloaded"] and known.get("bytes") == info["bytes"]
                    and known.get("rows") is not None)
            rows = known["rows"] if same else (count_rows(path) if verify else None)
            if verify:
                _check_rows(path, job.rows, rows, f"{job.repo}/{job.path}")
            entry = {"repo": job.repo, "path": job.path, "commit": info["commit"],
                     "bytes": info["bytes"], "rows": rows}
        manifest[job.dest] = entry
        out.mkdir(parents=True, exist_ok=True)
        tmp = manifest_path.with_name("fetch.json.tmp")
        tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        tmp.replace(manifest_path)
        rows = entry.get("rows")
        log(f"{job.name}: ok ({rows if rows is not None else 'unchecked'} rows, commit "
            f"{str(entry['commit'])[:12]})")
    return manifest
