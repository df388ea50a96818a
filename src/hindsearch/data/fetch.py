"""``hindsearch data fetch``: download the paper-scale data from the Hugging Face hub (needs network).

What is fetched (each to its own folder under ``--out``):

* ``train``: Search-R1's NQ+HotpotQA training set (``PeterJinGo/nq_hotpotqa_train``, parquet);
* ``test``: the seven benchmarks as FlashRAG publishes them (``RUC-NLPIR/FlashRAG_datasets``:
  nq, triviaqa, popqa test; hotpotqa, 2wikimultihopqa, musique dev; bamboogle test);
* ``wiki18``: the wiki-18 corpus Search-R1 retrieves from (``PeterJinGo/wiki-18-corpus``).

Downloads are resumable: bytes go to ``<file>.part`` and a rerun asks the server for the rest
with an HTTP ``Range`` header. A finished file is checked by row count (QA files are parsed
with ``hindsearch.data.qa.load_qa``, so a format change fails loudly) and recorded with its
SHA-256 in ``fetch.json``; a later run accepts an existing file only when its size and SHA-256
match that record, and a resumed download is appended only when the server's ``Content-Range``
starts where the ``.part`` file ends. Without network the first request fails within the connect
timeout with a ``ConnectionError`` naming the URL. ``HF_ENDPOINT`` (or ``endpoint=``) points
at a mirror.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from hindsearch.data.corpus import file_sha256


@dataclass(frozen=True)
class Remote:
    """One file on the hub: ``repo`` (a dataset repo), ``path`` in it, local ``dest`` and expected rows."""

    name: str
    repo: str
    path: str
    dest: str
    rows: int | None = None

    def url(self, endpoint: str) -> str:
        return f"{endpoint.rstrip('/')}/datasets/{self.repo}/resolve/main/{self.path}"


_FR = "RUC-NLPIR/FlashRAG_datasets"
REMOTES: dict[str, list[Remote]] = {
    "train": [Remote("nq_hotpotqa_train", "PeterJinGo/nq_hotpotqa_train", "train.parquet",
                     "nq_hotpotqa_train/train.parquet", 169615)],
    "test": [Remote(name, _FR, f"{sub}/{split}.jsonl", f"{name}/{split}.jsonl", rows) for name, sub, split, rows in [
        ("nq", "nq", "test", 3610), ("triviaqa", "triviaqa", "test", 11313), ("popqa", "popqa", "test", 14267),
        ("hotpotqa", "hotpotqa", "dev", 7405), ("2wiki", "2wikimultihopqa", "dev", 12576),
        ("musique", "musique", "dev", 2417), ("bamboogle", "bamboogle", "test", 125)]],
    "wiki18": [Remote("wiki18", "PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", "wiki18/wiki-18.jsonl.gz", 21015324)],
}
WHAT = ("train", "test", "wiki18", "all")


def default_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def download(url: str, dest: str | Path, connect_timeout: float = 5.0, read_timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` through ``dest.part``, resuming a partial file with HTTP Range.

    Raises ``ConnectionError`` naming the URL when the server cannot be reached or answers
    with an error status; the ``.part`` file is kept for the next attempt.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
    timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
    try:
        with httpx.stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as r:
            if r.status_code == 416 and offset:  # nothing left to fetch: the .part is complete
                part.rename(dest)
                return dest
            if r.status_code not in (200, 206):
                raise ConnectionError(f"download of {url} failed: HTTP {r.status_code}")
            if r.status_code == 206 and not r.headers.get("content-range", "").startswith(f"bytes {offset}-"):
                raise ConnectionError(f"download of {url}: the server resumed at {r.headers.get('content-range')!r}, "
                                      f"not at byte {offset}; delete {part} to start over")
            mode = "ab" if r.status_code == 206 else "wb"  # 200: server ignored Range, start over
            with part.open(mode) as f:
                for block in r.iter_raw():  # as received, so a dropped connection keeps its bytes
                    f.write(block)
    except httpx.HTTPError as e:
        kept = f"; {part.stat().st_size} bytes kept in {part} and resumed next time" if part.exists() else ""
        raise ConnectionError(f"cannot download {url}: {type(e).__name__}: {e or 'no answer'} "
                              f"(data fetch needs network access to the Hugging Face hub; set HF_ENDPOINT "
                              f"for a mirror){kept}") from e
    part.rename(dest)
    return dest


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


def fetch(what: str, out: str | Path, endpoint: str | None = None, verify: bool = True,
          remotes: dict[str, list[Remote]] | None = None, connect_timeout: float = 5.0, log=print) -> dict[str, Any]:
    """Fetch ``what`` (train | test | wiki18 | all) into ``out``; returns the updated ``fetch.json``."""
    if what not in WHAT:
        raise ValueError(f"--what must be one of {', '.join(WHAT)}, got {what!r}")
    remotes = remotes or REMOTES
    endpoint = endpoint or default_endpoint()
    out = Path(out)
    todo = [r for k in ([what] if what != "all" else [k for k in remotes]) for r in remotes[k]]
    manifest_path = out / "fetch.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for rem in todo:
        dest, url = out / rem.dest, rem.url(endpoint)
        known = manifest.get(rem.dest, {})
        if dest.exists() and known.get("bytes") == dest.stat().st_size:
            if known.get("sha256") == file_sha256(dest):
                log(f"{rem.name}: already fetched ({dest}, SHA-256 matches fetch.json)")
                continue
            raise ValueError(f"{dest}: its SHA-256 differs from the one fetch.json recorded when it was downloaded "
                             "(the file changed on disk); delete it to download it again")
        log(f"{rem.name}: {url} -> {dest}")
        download(url, dest, connect_timeout=connect_timeout)
        rows = count_rows(dest) if verify else None
        if verify and rem.rows is not None and rows != rem.rows:
            raise ValueError(f"{dest}: expected {rem.rows} rows, found {rows} (download from {url} is incomplete "
                             "or upstream changed; delete it to retry, or pass --no-verify to keep it)")
        manifest[rem.dest] = {"url": url, "rows": rows, "bytes": dest.stat().st_size, "sha256": file_sha256(dest)}
        out.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
        log(f"{rem.name}: ok ({rows if rows is not None else 'unchecked'} rows)")
    return manifest
