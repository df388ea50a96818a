"""``data fetch`` through ``huggingface_hub`` against a local fake of the hub (a real HTTP server on 127.0.0.1).

The fake answers what ``hf_hub_download`` asks: ``HEAD``/``GET /datasets/{repo}/resolve/{revision}/{path}``
with ``ETag``, ``X-Repo-Commit`` and ``Content-Length``, ranged ``GET`` (206 + ``Content-Range``), the hub's
``X-Error-Code`` on 401/404, and a bearer token for a private repo. It logs every request, so the tests
count what a rerun costs, and can drop a connection part-way through a body.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hindsearch.cli import main as cli_main
from hindsearch.data import fetch as fetch_mod
from hindsearch.data.fetch import REMOTES, FetchError, Joined, Remote, fetch
from hindsearch.retrieval.dense import faiss_shape

COMMIT = "a" * 40
TOKEN = "hf_fake_token_for_tests"
PRIVATE = "someone/private-set"


class FakeHub:
    """Files per dataset repo, one commit for all, a request log and fault switches."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.requests: list[tuple[str, str, str, str]] = []  # (method, path, Range, Authorization)
        self.drop_after: dict[str, int] = {}  # file path -> bytes sent before the first GET is cut
        self.fail_ranged = False  # a ranged GET answers 500
        self.url = ""

    def gets(self) -> list[tuple[str, str]]:
        return [(p.rsplit("/", 1)[-1], r) for m, p, r, _ in self.requests if m == "GET"]


_RESOLVE = re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, head: bool) -> None:
            rng, auth = self.headers.get("Range", ""), self.headers.get("Authorization", "")
            hub.requests.append((self.command, self.path, rng, auth))
            m = _RESOLVE.match(self.path)
            repos = {r for r, _ in hub.files}
            if not m or m["repo"] not in repos or (m["repo"] == PRIVATE and auth != f"Bearer {TOKEN}"):
                return self._error(401, "RepoNotFound")  # the hub's answer for a missing or private repo
            if m["rev"] not in ("main", COMMIT):
                return self._error(404, "RevisionNotFound")
            data = hub.files.get((m["repo"], m["path"]))
            if data is None:
                return self._error(404, "EntryNotFound")
            start = int(rng.split("=")[1].split("-")[0]) if rng else 0
            if rng and hub.fail_ranged:
                return self._error(500, None)
            body = data[start:]
            self.send_response(206 if rng else 200)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(body)))
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            cut = hub.drop_after.pop(m["path"], None)
            self.wfile.write(body if cut is None else body[:cut])
            self.close_connection = True

        def _error(self, status: int, code: str | None) -> None:
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def log_message(self, *args) -> None:
            pass

    return Handler


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running fake hub; ``HF_ENDPOINT`` points at it and ``HF_HOME`` (cache, token) is a tmp folder."""
    from huggingface_hub import constants

    fake = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets HF_HUB_OFFLINE=1 for the whole suite
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    yield fake
    server.shutdown()
    server.server_close()


def _qa_jsonl(n: int) -> bytes:
    return "".join(json.dumps({"id": str(i), "question": f"q{i}?", "golden_answers": [f"a{i}"]}) + "\n"
                   for i in range(n)).encode()


def _parquet(n: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"question": [f"q{i}" for i in range(n)]}), buf)
    return buf.getvalue()


def _corpus_gz(n: int) -> bytes:
    import gzip

    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    rows = "".join(json.dumps({"id": str(i), "contents": f'"T{i}"\n{words[i]} passage'}) + "\n" for i in range(n))
    return gzip.compress(rows.encode())


def _flat_index(n: int, d: int) -> bytes:
    import faiss
    import numpy as np

    index = faiss.IndexFlatIP(d)
    index.add(np.random.default_rng(0).standard_normal((n, d)).astype("float32"))
    return faiss.serialize_index(index).tobytes()


@pytest.fixture
def small_hub(hub):
    """The real ``REMOTES`` layout with small files; returns (hub, remotes with the small row counts, index bytes).

    The joined e5 index is a real ``IndexFlatIP`` of 384-wide vectors (MiniLM's size), one per wiki-18 line.
    """
    remotes: dict = {}
    wiki_rows = 4
    for what, jobs in REMOTES.items():
        remotes[what] = []
        for job in jobs:
            if isinstance(job, Joined):
                index = _flat_index(wiki_rows, 384)
                half = len(index) // 2
                for part, data in zip(job.parts, (index[:half], index[half:])):
                    hub.files[(part.repo, part.path)] = data
                remotes[what].append(dataclasses.replace(job, rows=wiki_rows, dim=384))
                continue
            n = wiki_rows if job.path.endswith(".gz") else 5 + len(hub.files)
            data = (_parquet(n) if job.path.endswith(".parquet") else _corpus_gz(n) if job.path.endswith(".gz")
                    else _qa_jsonl(n))
            hub.files[(job.repo, job.path)] = data
            remotes[what].append(dataclasses.replace(job, rows=n))
    return hub, remotes, index


README_PATHS = {  # what the README's Data section says `data fetch --what all --out data/` writes
    "nq_hotpotqa_train/train.parquet", "nq_hotpotqa_train/test.parquet",
    "nq/test.jsonl", "triviaqa/test.jsonl", "popqa/test.jsonl", "hotpotqa/dev.jsonl", "2wikimultihopqa/dev.jsonl",
    "musique/dev.jsonl", "bamboogle/test.jsonl", "wiki18/wiki-18.jsonl.gz", "wiki18/e5_Flat.index",
}


def _data_files(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and ".cache" not in p.parts
            and p.name != "fetch.json"}


def test_fetch_all_writes_the_readme_paths_and_a_rerun_is_served_from_cache(small_hub, tmp_path, monkeypatch):
    hub, remotes, index = small_hub
    out = tmp_path / "data"
    monkeypatch.setattr(fetch_mod, "REMOTES", remotes)
    assert cli_main(["data", "fetch", "--what", "all", "--out", str(out)]) == 0  # endpoint from HF_ENDPOINT
    assert _data_files(out) == README_PATHS  # the e5 parts are gone once joined
    assert (out / "wiki18/e5_Flat.index").read_bytes() == index
    manifest = json.loads((out / "fetch.json").read_text())
    assert set(manifest) == README_PATHS
    assert manifest["nq/test.jsonl"] == {"repo": "RUC-NLPIR/FlashRAG_datasets", "path": "nq/test.jsonl",
                                         "commit": COMMIT, "bytes": (out / "nq/test.jsonl").stat().st_size, "rows": 7}
    assert (manifest["wiki18/e5_Flat.index"]["rows"], manifest["wiki18/e5_Flat.index"]["dim"]) == (4, 384)
    n_files = len(hub.files)
    assert len(hub.gets()) == n_files and all(r == "" for _, r in hub.gets())
    assert not list(out.rglob("*.incomplete")) and not list(out.rglob("*.joining"))

    hub.requests.clear()
    fetch("all", out, remotes=remotes, log=lambda s: None, index_shape=faiss_shape)
    assert hub.gets() == []  # nothing downloaded again
    heads = [p for m, p, _, _ in hub.requests if m == "HEAD"]
    assert len(heads) == 2 * (n_files - 2)  # a dry-run and a real HEAD per plain file; the joined index: none
    assert all("/resolve/main/" in p for p in heads)

    pinned = {"test": [dataclasses.replace(remotes["test"][0], revision=COMMIT)]}
    hub.requests.clear()
    fetch("test", tmp_path / "pinned", remotes=pinned, log=lambda s: None)
    assert [p for m, p, _, _ in hub.requests] == [f"/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/{COMMIT}/nq/test.jsonl"] * 3
    hub.requests.clear()
    fetch("test", tmp_path / "pinned", remotes=pinned, log=lambda s: None)
    assert hub.requests == []  # a pinned commit already on disk costs no request at all


def test_the_readme_commands_run_on_what_fetch_wrote(small_hub, tmp_path, capsys):
    """fetch -> index the gzipped corpus -> search it; and search the joined e5 index with that corpus."""
    from hindsearch.data.qa import load_qa

    _, remotes, _ = small_hub
    out = tmp_path / "data"
    for what in ("test", "wiki18", "e5index"):
        fetch(what, out, remotes=remotes, log=lambda s: None, index_shape=faiss_shape)
    assert len(load_qa(out / "2wikimultihopqa/dev.jsonl")) == remotes["test"][4].rows  # the eval --data paths load
    wiki = str(out / "wiki18/wiki-18.jsonl.gz")
    assert cli_main(["index", "--corpus", wiki, "--out", str(tmp_path / "bm25")]) == 0
    assert cli_main(["search", "charlie", "--index", str(tmp_path / "bm25"), "-k", "1"]) == 0
    assert "T2  (id 2)" in capsys.readouterr().out
    assert cli_main(["search", "anything", "--faiss-index", str(out / "wiki18/e5_Flat.index"), "--corpus", wiki,
                     "--encoder", "minilm", "-k", "2"]) == 0  # the real file is 768 wide: --encoder e5-base-v2
    printed = capsys.readouterr().out
    assert "(2 hits)" in printed and (out / "wiki18/e5_Flat.index.hindsearch/index.json").is_file()


def test_missing_file_repo_and_token_errors_name_the_repo_and_file(hub, tmp_path, monkeypatch):
    hub.files[("RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl")] = _qa_jsonl(2)
    hub.files[(PRIVATE, "train.jsonl")] = _qa_jsonl(2)
    one = lambda repo, path: {"test": [Remote("x", repo, path, "x")]}
    with pytest.raises(FetchError, match=r"cannot fetch nq/dev\.jsonl of dataset repo RUC-NLPIR/FlashRAG_datasets "
                                         r"\(revision main, http://127\.0\.0\.1:\d+\): no such file in the repo \(HTTP 404\)"):
        fetch("test", tmp_path / "o", remotes=one("RUC-NLPIR/FlashRAG_datasets", "nq/dev.jsonl"), log=lambda s: None)
    with pytest.raises(FetchError, match=r"nq/test\.jsonl of dataset repo nobody/nothing .* not found or needs a token \(HTTP 401\)"):
        fetch("test", tmp_path / "o", remotes=one("nobody/nothing", "nq/test.jsonl"), log=lambda s: None)
    with pytest.raises(FetchError, match=r"revision v9 not found \(HTTP 404\)"):
        fetch("test", tmp_path / "o", remotes={"test": [Remote("x", "RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl", "x",
                                                                revision="v9")]}, log=lambda s: None)
    with pytest.raises(FetchError, match=rf"train\.jsonl of dataset repo {PRIVATE} .*set HF_TOKEN"):
        fetch("test", tmp_path / "o", remotes=one(PRIVATE, "train.jsonl"), log=lambda s: None)
    assert _data_files(tmp_path / "o") == set()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.requests.clear()
    fetch("test", tmp_path / "o", remotes=one(PRIVATE, "train.jsonl"), log=lambda s: None)
    assert (tmp_path / "o/x/train.jsonl").read_bytes() == _qa_jsonl(2)
    assert {a for _, _, _, a in hub.requests} == {f"Bearer {TOKEN}"}
    with pytest.raises(FetchError, match=r"x/nq/test\.jsonl: expected 3610 rows, found 2 \(from RUC-NLPIR"):
        fetch("test", tmp_path / "o", remotes={"test": [Remote("x", "RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl",
                                                                "x", 3610)]}, log=lambda s: None)
    with pytest.raises(ValueError, match="--what must be one of"):
        fetch("everything", tmp_path / "o")


def test_dropped_connection_resumes_with_range(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)  # it writes whole chunks (10 MB by default)
    payload = bytes(range(256)) * 4000
    hub.files[("r/big", "big.bin")] = payload
    hub.drop_after["big.bin"] = 300_000
    fetch("test", tmp_path / "o", remotes={"test": [Remote("big", "r/big", "big.bin", "")]}, verify=False, log=lambda s: None)
    assert (tmp_path / "o/big.bin").read_bytes() == payload
    assert hub.gets() == [("big.bin", ""), ("big.bin", f"bytes={4 << 16}-")]  # the 4 whole chunks it had are kept


def test_failed_download_leaves_no_partial_file_and_a_rerun_restarts_cleanly(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    payload = bytes(range(256)) * 4000
    hub.files[("r/big", "big.bin")] = payload
    hub.drop_after["big.bin"] = 300_000
    hub.fail_ranged = True  # the resume attempt fails too
    remotes = {"test": [Remote("big", "r/big", "big.bin", "sub")]}
    with pytest.raises(FetchError, match=r"big\.bin of dataset repo r/big .*HTTP 500"):
        fetch("test", tmp_path / "o", remotes=remotes, verify=False, log=lambda s: None)
    assert not (tmp_path / "o/sub/big.bin").exists()
    assert not (tmp_path / "o").exists()  # a failed first download leaves no folder behind (not even lock files)
    hub.fail_ranged = False
    hub.requests.clear()
    fetch("test", tmp_path / "o", remotes=remotes, verify=False, log=lambda s: None)
    assert (tmp_path / "o/sub/big.bin").read_bytes() == payload and hub.gets() == [("big.bin", "")]


def test_offline_uses_only_what_is_on_disk(hub, tmp_path, monkeypatch):
    hub.files[("RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl")] = _qa_jsonl(4)
    remotes = {"test": [Remote("nq", "RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl", "", 4)]}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FetchError, match=r"nq/test\.jsonl of dataset repo RUC-NLPIR/FlashRAG_datasets .*HF_HUB_OFFLINE "
                                         r"is set and .*nq/test\.jsonl is not downloaded yet"):
        fetch("test", tmp_path / "o", remotes=remotes, log=lambda s: None)
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    fetch("test", tmp_path / "o", remotes=remotes, log=lambda s: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    manifest = fetch("test", tmp_path / "o", remotes=remotes, log=lambda s: None)
    assert hub.requests == [] and manifest["nq/test.jsonl"]["rows"] == 4


def test_not_enough_disk_space_is_refused_before_downloading(hub, tmp_path, monkeypatch):
    import shutil

    hub.files[("r/big", "big.bin")] = b"x" * 5000
    real = shutil.disk_usage
    monkeypatch.setattr(fetch_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    (tmp_path / "o").mkdir()
    with pytest.raises(FetchError, match=r"big\.bin of dataset repo r/big: it needs 5,000 bytes and .* has 1,000 free"):
        fetch("test", tmp_path / "o", remotes={"test": [Remote("big", "r/big", "big.bin", "")]}, log=lambda s: None)
    assert hub.gets() == [] and list((tmp_path / "o").iterdir()) == []  # the folder that was there stays, as it was


class _NoSleep:
    """``time`` for huggingface_hub's retry loop, without the waits (1+2+4+8+8 s before it gives up)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def sleep(self, s: float) -> None:
        self.calls.append(s)

    def __getattr__(self, name):
        return getattr(time, name)


def test_unreachable_hub_gives_one_clear_line_after_the_retries(hub, tmp_path, monkeypatch):
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", no_sleep := _NoSleep())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    t0 = time.perf_counter()
    with pytest.raises(FetchError, match=r"cannot fetch nq/test\.jsonl of dataset repo RUC-NLPIR/FlashRAG_datasets "
                                         r".*the hub cannot be reached .*HF_ENDPOINT"):
        fetch("test", tmp_path / "o", endpoint=endpoint, log=lambda s: None)
    assert time.perf_counter() - t0 < 10 and no_sleep.calls == [1, 2, 4, 8, 8]  # 23 s of backoff in real use


def test_joining_the_index_parts_checks_the_space_it_needs(small_hub, tmp_path, monkeypatch):
    import shutil

    hub, remotes, index = small_hub
    parts = [hub.files[(p.repo, p.path)] for p in remotes["e5index"][0].parts]
    assert max(map(len, parts)) < 5000 < len(index)  # each part fits, the joined file does not
    real = shutil.disk_usage
    monkeypatch.setattr(fetch_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=5000))
    with pytest.raises(FetchError, match=rf"cannot join part_aa \+ part_ab of dataset repo PeterJinGo/wiki-18-e5-index "
                                         rf"into .*e5_Flat\.index: it needs {len(index):,} bytes and .* has 5,000 free"):
        fetch("e5index", tmp_path / "o", remotes=remotes, log=lambda s: None, index_shape=faiss_shape)
    assert sorted(p.name for p in (tmp_path / "o/wiki18").iterdir()) == [".cache", "part_aa", "part_ab"]
    monkeypatch.setattr(fetch_mod.shutil, "disk_usage", real)
    hub.requests.clear()
    fetch("e5index", tmp_path / "o", remotes=remotes, log=lambda s: None, index_shape=faiss_shape)  # the kept parts are not downloaded again
    assert hub.gets() == [] and (tmp_path / "o/wiki18/e5_Flat.index").read_bytes() == index


def test_verifying_a_joined_index_needs_its_reader_and_asks_before_any_download(small_hub, tmp_path):
    """The data layer downloads the index, the retrieval layer reads it: ``fetch`` takes the reader from its caller
    (the command passes FAISS's ``faiss_shape``) and, without one, refuses before it downloads anything."""
    hub, remotes, _ = small_hub
    with pytest.raises(ValueError, match=r"checking e5index needs index_shape .*or verify=False"):
        fetch("all", tmp_path / "o", remotes=remotes, log=lambda s: None)
    assert hub.requests == [] and not (tmp_path / "o").exists()
