"""``data mini`` (mini-wiki + filtered benchmarks) and ``data fetch`` (resumable download, fail fast)."""

from __future__ import annotations

import argparse
import json
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hindsearch.data import cli as data_cli
from hindsearch.data.corpus import read_corpus
from hindsearch.data.fetch import Remote, download, fetch
from hindsearch.data.mini import BENCHMARKS, build_mini, fast_normalize, passage_key
from hindsearch.data.qa import load_qa
from hindsearch.rewards import answer_in_text, normalize_answer

from shared_data import SHARED, shared  # noqa: E402 - tests dir on sys.path


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    data_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_fast_normalize_matches_rewards():
    samples = ["The Beatles!", "an apple, a day", "Théâtre de l'Odéon", "the’s thé", "A.B.C. (1999)", "  x\ty  ",
               "Ænima—the album", "Jean-Paul Sartre", "an", "Then a theory"]
    rng = random.Random(0)
    alphabet = "ab thean.,'’é-Ü  \n"
    samples += ["".join(rng.choice(alphabet) for _ in range(30)) for _ in range(300)]
    for s in samples:
        assert fast_normalize(s) == normalize_answer(s), s


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    shared()
    out = tmp_path_factory.mktemp("mini")
    t0 = time.perf_counter()
    meta = build_mini(SHARED, out, log=lambda s: None)
    seconds = time.perf_counter() - t0
    return out, meta, seconds, read_corpus(out / "corpus.jsonl")


def test_mini_counts_and_corpus(mini):
    out, meta, seconds, passages = mini
    assert seconds < 120  # well under a minute on an idle machine
    assert set(meta["benchmarks"]) == set(BENCHMARKS) and not meta["missing_sources"]
    assert json.loads((out / "mini.json").read_text()) == meta
    for name, b in meta["benchmarks"].items():
        assert 0 < b["kept"] <= b["total"], name
        assert len(load_qa(out / f"{name}.jsonl")) == b["kept"]
    assert meta["benchmarks"]["hotpotqa"] == {**meta["benchmarks"]["hotpotqa"], "kept": 500, "total": 500}
    assert meta["benchmarks"]["2wiki"]["kept"] < 200  # rows shipped without paragraphs are dropped
    assert len(passages) == meta["passages"] > 25000
    assert len({p.id for p in passages}) == len(passages)
    assert len({passage_key(p.bare_title, p.text) for p in passages}) == len(passages)
    assert all(p.contents.startswith('"') for p in passages)


def test_mini_kept_questions_have_evidence(mini):
    out, meta, _, passages = mini
    by_id = {p.id: p for p in passages}
    for name, (_, rule) in BENCHMARKS.items():
        for r in load_qa(out / f"{name}.jsonl", limit=150):
            assert r.data_source == name
            if rule == "multi":
                ps = [by_id[i] for i in r.metadata["evidence_ids"]]
                assert set(r.evidence) <= {p.bare_title for p in ps}
            else:
                ids = r.metadata["answer_passage_ids"]
                assert ids and all(answer_in_text(r.golden_answers, by_id[i].contents) for i in ids)


@pytest.mark.slow
def test_mini_dropped_single_hop_questions_have_no_answer_passage(mini):
    out, _, _, passages = mini
    norm = [f" {fast_normalize(p.contents)} " for p in passages]
    kept = {r.id for r in load_qa(out / "bamboogle.jsonl")}
    dropped = [r for r in load_qa(SHARED / "ros-subsample/bamboogle/test.jsonl") if r.id not in kept]
    assert dropped
    for r in dropped:
        answers = [f" {fast_normalize(a)} " for a in r.golden_answers if fast_normalize(a)]
        assert not any(a in t for a in answers for t in norm), r


def _tiny_shared(root: Path, reverse: bool = False) -> Path:
    """A small shared-data folder with one corpus, one single-hop and one multi-hop set."""
    rows = [{"id": "a", "contents": "Velmor\nVelmor is a city founded by Aldric Morrow."},
            {"id": "b", "contents": '"Ossel"\nThe Ossel is a river.'},
            {"id": "c", "contents": "Velmor\nVelmor is a city founded by Aldric Morrow."}]  # duplicate
    if reverse:
        rows = rows[::-1]
    (root / "wiki18-slice").mkdir(parents=True)
    (root / "wiki18-slice/wiki18_passages_from_search_r1_runs.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    (root / "ros-subsample/nq").mkdir(parents=True)
    (root / "ros-subsample/nq/test.jsonl").write_text(
        json.dumps({"id": "q1", "question": "Who founded Velmor?", "golden_answers": ["Aldric Morrow"]}) + "\n"
        + json.dumps({"id": "q2", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"]}) + "\n")
    (root / "migres").mkdir()
    para = {"title": "Kesh", "paragraph_text": "Kesh lies on the Ossel.", "is_supporting": True}
    (root / "migres/musique.json").write_text(
        json.dumps({"id": "2hop__1_2", "question": "Where is Kesh?", "answer": "Ossel", "answer_aliases": [],
                    "paragraphs": [para, {**para, "title": "Other", "is_supporting": False}]}) + "\n")
    return root


def test_mini_tiny_folder_ids_stable_and_cli(tmp_path, capsys):
    a = build_mini(_tiny_shared(tmp_path / "s1"), tmp_path / "o1", log=lambda s: None)
    build_mini(_tiny_shared(tmp_path / "s2", reverse=True), tmp_path / "o2", log=lambda s: None)
    p1, p2 = read_corpus(tmp_path / "o1/corpus.jsonl"), read_corpus(tmp_path / "o2/corpus.jsonl")
    assert len(p1) == 4 and {p.id: p.contents for p in p1} == {p.id: p.contents for p in p2}
    assert a["benchmarks"]["nq"] == {"source": "ros-subsample/nq/test.jsonl", "rule": "single", "total": 2, "kept": 1}
    assert a["benchmarks"]["musique"]["kept"] == 1 and "hotpotqa" not in a["benchmarks"]
    assert "ircot-hotpotqa/dev_subsampled.jsonl" in a["missing_sources"]
    assert run_cli(["data", "mini", "--shared", str(tmp_path / "s1"), "--out", str(tmp_path / "o3")]) == 0
    table = capsys.readouterr().out
    assert "mini-wiki: 4 passages" in table and "nq              1      2" in table
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_mini(tmp_path / "nowhere", tmp_path / "o4")


class _RangeHandler(BaseHTTPRequestHandler):
    """Serves files under ``root`` at ``/datasets/<repo>/resolve/main/<path>``, honouring ``Range``."""

    root: Path
    seen_ranges: list[str]
    cut_after: int | None = None  # close the connection after this many body bytes (simulated drop)

    def do_GET(self):  # noqa: N802
        rel = self.path.split("/resolve/main/", 1)[-1]
        f = self.root / rel
        if not f.is_file():
            self.send_error(404)
            return
        data = f.read_bytes()
        rng = self.headers.get("Range")
        self.seen_ranges.append(rng or "")
        start = int(rng.split("=")[1].rstrip("-")) if rng else 0
        if start >= len(data):
            self.send_response(416)
            self.end_headers()
            return
        body = data[start:]
        self.send_response(206 if rng else 200)
        if rng:  # RFC 9110: a 206 names the range it carries
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body if self.cut_after is None else body[: self.cut_after])

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(tmp_path):
    root = tmp_path / "hub"
    handler = type("H", (_RangeHandler,), {"root": root, "seen_ranges": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_download_resumes_with_range(hub, tmp_path):
    root, handler, url = hub
    payload = bytes(range(256)) * 4000
    (root / "x").mkdir(parents=True)
    (root / "x/big.bin").write_bytes(payload)
    dest = tmp_path / "dl/big.bin"
    handler.cut_after = 300_000  # the first attempt drops mid-file
    with pytest.raises(ConnectionError, match="big.bin"):
        download(f"{url}/datasets/r/resolve/main/x/big.bin", dest, read_timeout=5)
    part = dest.with_name("big.bin.part")
    assert part.stat().st_size == 300_000 and not dest.exists()
    handler.cut_after = None
    download(f"{url}/datasets/r/resolve/main/x/big.bin", dest)
    assert dest.read_bytes() == payload and not part.exists()
    assert handler.seen_ranges == ["", "bytes=300000-"]


def test_fetch_verifies_rows_and_skips_done(hub, tmp_path):
    root, handler, url = hub
    (root / "nq").mkdir(parents=True)
    src = "\n".join(json.dumps({"id": str(i), "question": f"q{i}", "golden_answers": ["a"]}) for i in range(7)) + "\n"
    (root / "nq/test.jsonl").write_text(src)
    remotes = {"test": [Remote("nq", "RUC-NLPIR/FlashRAG_datasets", "nq/test.jsonl", "nq/test.jsonl", 7)]}
    manifest = fetch("test", tmp_path / "out", endpoint=url, remotes=remotes, log=lambda s: None)
    assert manifest["nq/test.jsonl"]["rows"] == 7 and len(load_qa(tmp_path / "out/nq/test.jsonl")) == 7
    assert manifest["nq/test.jsonl"]["url"] == f"{url}/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main/nq/test.jsonl"
    n = len(handler.seen_ranges)
    fetch("test", tmp_path / "out", endpoint=url, remotes=remotes, log=lambda s: None)
    assert len(handler.seen_ranges) == n  # already fetched: no request
    bad = {"test": [Remote("nq", "r", "nq/test.jsonl", "nq2/test.jsonl", 3610)]}
    with pytest.raises(ValueError, match="expected 3610 rows, found 7"):
        fetch("test", tmp_path / "out", endpoint=url, remotes=bad, log=lambda s: None)
    with pytest.raises(ConnectionError, match="HTTP 404"):
        fetch("test", tmp_path / "out", endpoint=url,
              remotes={"test": [Remote("nq", "r", "missing.jsonl", "m/t.jsonl")]}, log=lambda s: None)
    with pytest.raises(ValueError, match="--what"):
        fetch("everything", tmp_path / "out")


def test_fetch_fails_fast_naming_the_url(tmp_path):
    endpoint = f"http://127.0.0.1:{_free_port()}"
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError) as e:
        run_cli(["data", "fetch", "--what", "test", "--out", str(tmp_path), "--endpoint", endpoint,
                 "--connect-timeout", "2"])
    assert time.perf_counter() - t0 < 10
    assert f"{endpoint}/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main/nq/test.jsonl" in str(e.value)
