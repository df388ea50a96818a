"""Fault suite (issue 16): nothing is deleted, nothing is lost or written twice, nothing hangs.

* ``index``/``world --out`` never delete what hindsearch did not write, and a failed build leaves
  no temporary folder behind;
* the retrieval server dies during an evaluation: the errors are recorded, and a rerun redoes
  exactly those rows (or keeps them with ``--keep-errors``);
* a checkpoint save killed half-way is never resumed from; resume falls back to the newest
  complete checkpoint and says which one it skipped;
* two writers in one run/output folder: the second is refused while the first lives, and a
  stale lock is taken over;
* bad CLI values and bad server bodies get one clear line (CLI) or a 4xx JSON (server).
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import one_line_error  # the shared CLI-error check
from hindsearch.cli import main
from hindsearch.fsutil import (COMPLETE_NAME, LOCK_NAME, STAGING_NAME, AtomicCheckpoints, FolderLock, FolderLocked,
                               UnsafeOutput)
from hindsearch.retrieval.factory import build_index

pytestmark = pytest.mark.timeout(300)

CORPUS = [{"id": str(i), "contents": f'"Title {i}"\nword{i} common text number {i}'} for i in range(12)]


def write_corpus(path: Path, rows=CORPUS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp" in p.name or ".old-" in p.name]




# ---------------------------------------------------------------- data loss
def test_index_never_deletes_user_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    write_corpus(data / "c.jsonl")
    (data / "notes.txt").write_text("precious")
    (tmp_path / "afile").write_text("also precious")
    before = snapshot(tmp_path)
    cases = [
        (["--corpus", "data/c.jsonl", "--out", "data"], "holds the input"),     # the corpus being indexed
        (["--corpus", "data/c.jsonl", "--out", "."], "current folder"),         # the working folder
        (["--corpus", "data/c.jsonl", "--out", str(tmp_path)], "current folder"),
        (["--corpus", "data/c.jsonl", "--out", "afile"], "is a file"),          # a file
        (["--corpus", "data/c.jsonl", "--out", "afile/sub"], "is a file"),      # under a file
        (["--corpus", "data", "--out", "idx"], "is a folder"),                  # a folder as corpus
        (["--corpus", "missing.jsonl", "--out", "idx"], "not found"),
    ]
    for args, needle in cases:
        assert main(["index", *args]) == 1, args
        one_line_error(capsys, "hindsearch index: error:", needle)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "thesis.tex").write_text("do not delete")
    assert main(["index", "--corpus", "data/c.jsonl", "--out", "user"]) == 1
    one_line_error(capsys, "did not write")
    assert snapshot(tmp_path) == {**before, "user/thesis.tex": b"do not delete"}
    assert leftovers(tmp_path) == [] and not (tmp_path / "idx").exists()


def test_index_replaces_only_its_own_folder_and_a_failed_build_leaves_nothing(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(corpus), "--out", str(out)]) == 0
    first = json.loads((out / "index.json").read_text())
    # a gzip corpus (wiki-18 as `data fetch` writes it) is read transparently and replaces the old index
    gz = tmp_path / "c2.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in CORPUS[:5]))
    assert main(["index", "--corpus", str(gz), "--out", str(out)]) == 0
    assert json.loads((out / "index.json").read_text())["n_docs"] == 5 != first["n_docs"]
    kept = snapshot(out)
    # a bad row fails the build: the previous index stays as it was, and no .tmp folder is left
    bad = write_corpus(tmp_path / "bad.jsonl", CORPUS[:3])
    with bad.open("a") as f:
        f.write("{not json\n")
    assert main(["index", "--corpus", str(bad), "--out", str(out)]) == 1
    one_line_error(capsys, "bad.jsonl:4")
    assert snapshot(out) == kept and leftovers(tmp_path) == []
    # an empty corpus, or a truncated .gz: same
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["index", "--corpus", str(tmp_path / "empty.jsonl"), "--out", str(out)]) == 1
    (tmp_path / "cut.jsonl.gz").write_bytes(gz.read_bytes()[:40])
    assert main(["index", "--corpus", str(tmp_path / "cut.jsonl.gz"), "--out", str(out)]) == 1
    one_line_error(capsys, "cut.jsonl.gz")
    assert snapshot(out) == kept and leftovers(tmp_path) == []
    with pytest.raises(UnsafeOutput):
        build_index(corpus, tmp_path, show_progress=False)


def test_world_never_deletes_user_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "somefile").write_text("keep me")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("keep me too")
    before = snapshot(tmp_path)
    for out, needle in (("somefile", "is a file"), ("mine", "did not write"), (".", "current folder")):
        for extra in ([], ["--force"]):
            assert main(["world", "--out", out, "--entities", "40", *extra]) == 1
            one_line_error(capsys, "hindsearch world: error:", needle)
    assert snapshot(tmp_path) == before and leftovers(tmp_path) == []
    # its own folder is rebuilt in place by --force, through a staging sibling
    assert main(["world", "--out", "w", "--entities", "40"]) == 0
    assert main(["world", "--out", "w", "--entities", "40", "--force"]) == 0
    assert (tmp_path / "w" / "world.json").exists() and leftovers(tmp_path) == []


# ---------------------------------------------------------------- eval: server death and the rerun
def test_server_death_during_eval_then_rerun_redoes_only_errored_rows(tmp_path, capsys, tok, model):
    from test_eval import CountingEngine, make_engine

    from hindsearch.data.world import generate_world
    from hindsearch.eval import evaluate
    from hindsearch.retrieval.factory import load_index
    from hindsearch.retrieval.client import RemoteRetriever
    from hindsearch.retrieval.server import BackgroundServer, create_app

    world = generate_world(seed=0, n_entities=60)
    build_index(world.passages, tmp_path / "index", show_progress=False)
    local = load_index(tmp_path / "index")
    dev = world.splits["dev"][:4]
    out = tmp_path / "eval"
    srv = BackgroundServer(create_app(local))
    remote = RemoteRetriever(srv.url, timeout_s=5, retries=0)
    eng = CountingEngine(make_engine(model, tok, remote, dev, {d.id for d in dev}))
    evaluate(eng, {"dev": dev[:2]}, out_dir=out, batch_size=2, progress=False)  # two good rows
    srv.stop()  # the server dies: the other two questions record retrieval errors, the eval still finishes
    res = evaluate(eng, {"dev": dev}, out_dir=out, batch_size=2, progress=False)
    assert res["benchmarks"]["dev"]["errors"] == 2 and eng.seen == [d.id for d in dev]
    # --keep-errors: nothing is redone, the errored rows stay
    eng.seen = []
    res = evaluate(eng, {"dev": dev}, out_dir=out, batch_size=2, progress=False, redo_errors=False)
    assert eng.seen == [] and res["benchmarks"]["dev"]["errors"] == 2
    # the server is back (another port): the rerun redoes exactly the two errored rows and says so
    srv = BackgroundServer(create_app(local))
    try:
        logs: list[str] = []
        eng = CountingEngine(make_engine(model, tok, RemoteRetriever(srv.url, timeout_s=5, retries=0), dev,
                                         {d.id for d in dev}))
        res = evaluate(eng, {"dev": dev}, out_dir=out, batch_size=2, progress=False, log=logs.append)
    finally:
        srv.stop()
    assert eng.seen == [d.id for d in dev[2:]]
    assert any("redoing 2 question(s)" in m for m in logs)
    assert res["benchmarks"]["dev"]["errors"] == 0 and res["benchmarks"]["dev"]["em"] == 1.0
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["qid"] for r in rows) == sorted(d.id for d in dev)  # nothing lost, nothing twice
    assert "| EM |" in (out / "results.md").read_text()
    assert not (out / LOCK_NAME).exists()


def test_client_wait_is_bounded_when_the_server_never_answers():
    from hindsearch.retrieval.client import RemoteRetriever, RetrieverUnavailable

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections (kernel backlog) and never answers
    try:
        r = RemoteRetriever(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5, retries=5, backoff=0.05)
        t = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match="deadline 1 s"):
            r.retrieve(["q"], 3)
        assert time.monotonic() - t < 1.5  # 2 x timeout_s, not (retries + 1) x timeout_s
        t = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match="not retried"):
            r.retrieve(["q"], 3)  # within the cool-down: fails at once, so engine retries do not multiply it
        assert time.monotonic() - t < 0.1
    finally:
        silent.close()


# ---------------------------------------------------------------- checkpoints
def tiny_trainer(out: Path, steps: int):
    import torch
    from transformers import Trainer, TrainingArguments

    from hindsearch.models import load_tokenizer, tiny_random_model

    torch.manual_seed(0)
    tok = load_tokenizer("tiny-random")
    model = tiny_random_model(tok, num_hidden_layers=1)
    ids = tok("a few words to learn", return_tensors="pt")["input_ids"][0]
    data = [{"input_ids": ids, "labels": ids}] * 8
    args = TrainingArguments(output_dir=str(out), max_steps=steps, save_steps=1, save_total_limit=2,
                             per_device_train_batch_size=1, report_to="none", use_cpu=True, logging_steps=1,
                             disable_tqdm=True)
    class AtomicTrainer(AtomicCheckpoints, Trainer):
        pass

    return AtomicTrainer(model=model, args=args, train_dataset=data)


def test_killed_checkpoint_save_is_never_resumed(tmp_path):
    from hindsearch.train.run import last_checkpoint

    run = tmp_path / "run"
    ck = run / "checkpoints"
    trainer = tiny_trainer(ck, steps=3)
    real = trainer._save_optimizer_and_scheduler

    def dies_at_step_3(output_dir):
        if trainer.state.global_step == 3:
            raise KeyboardInterrupt("SIGTERM during the save")  # the weights are written, the rest is not
        real(output_dir)

    trainer._save_optimizer_and_scheduler = dies_at_step_3
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    names = sorted(p.name for p in ck.iterdir())
    assert names == [STAGING_NAME, "checkpoint-1", "checkpoint-2"]  # checkpoint-3 never appeared
    assert all((ck / n / COMPLETE_NAME).exists() for n in names[1:])
    assert last_checkpoint(run) == ck / "checkpoint-2"

    # an older, in-place torn checkpoint (no trainer_state.json) is skipped with a message and set aside
    (ck / "checkpoint-4").mkdir()
    (ck / "checkpoint-4" / "model.safetensors").write_bytes(b"\0" * 10)
    logs: list[str] = []
    assert last_checkpoint(run, log=logs.append) == ck / "checkpoint-2"
    assert logs and "skipping checkpoint-4" in logs[0] and (ck / ".torn-checkpoint-4").is_dir()

    # resume from the fallback: step 3 is redone and saved completely; the staging folder is gone
    trainer = tiny_trainer(ck, steps=3)
    trainer.train(resume_from_checkpoint=str(ck / "checkpoint-2"))
    assert trainer.state.global_step == 3
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith(".torn")) == ["checkpoint-2", "checkpoint-3"]
    assert last_checkpoint(run) == ck / "checkpoint-3"


SIGTERM_DURING_SAVE = """
import sys, time
sys.path.insert(0, sys.argv[2])
from test_faults import tiny_trainer
trainer = tiny_trainer(__import__("pathlib").Path(sys.argv[1]), steps=3)
real = trainer._save_optimizer_and_scheduler
def slow(output_dir):
    if trainer.state.global_step == 2:
        print("saving", flush=True)
        time.sleep(120)
    real(output_dir)
trainer._save_optimizer_and_scheduler = slow
trainer.train()
"""


def test_sigterm_during_a_checkpoint_save(tmp_path):
    """A real SIGTERM while checkpoint-2 is being written: resume falls back to checkpoint-1."""
    import signal

    from hindsearch.train.run import last_checkpoint

    ck = tmp_path / "run" / "checkpoints"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.Popen([sys.executable, "-c", SIGTERM_DURING_SAVE, str(ck), str(Path(__file__).parent)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        while (line := p.stdout.readline()) and line.strip() != "saving":  # the trainer's log lines
            pass
        assert line.strip() == "saving"
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        p.kill()
    assert p.returncode != 0
    assert (ck / STAGING_NAME / "checkpoint-2").is_dir()  # the torn save, where no resume looks
    assert not (ck / "checkpoint-2").exists() and last_checkpoint(tmp_path / "run") == ck / "checkpoint-1"


# ---------------------------------------------------------------- two writers
HOLD = ("import sys, time\nfrom hindsearch.fsutil import FolderLock\n"
        "FolderLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")


def hold_lock(folder: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_writer_is_refused_and_a_stale_lock_is_taken_over(tmp_path):
    from hindsearch.config import Config
    from hindsearch.eval import evaluate
    from hindsearch.train.run import run_train

    folder = tmp_path / "run"
    holder = hold_lock(folder)
    try:
        with pytest.raises(FolderLocked, match=rf"process {holder.pid} .*is writing this run folder"):
            with FolderLock(folder, "run folder"):
                pass
        cfg = Config.load(None, [f'out="{folder}"', "train.steps=1"])
        with pytest.raises(FolderLocked, match=f"process {holder.pid}"):
            run_train(cfg, log=lambda m: None)  # refused before any data or model is touched
        with pytest.raises(FolderLocked, match="evaluation folder"):
            evaluate(None, {"dev": []}, out_dir=folder, progress=False)
    finally:
        holder.kill()
        holder.wait()
    assert (folder / LOCK_NAME).exists()  # a killed holder leaves its lock: stale now
    logs: list[str] = []
    with FolderLock(folder, log=logs.append):
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert logs and "stale lock" in logs[0] and not (folder / LOCK_NAME).exists()
    # a PID that is alive but belongs to another process than the one that wrote the lock is stale too
    (folder / LOCK_NAME).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "start": "0"}))
    with FolderLock(folder):
        pass
    # a torn lock file (a writer killed between create and write) is stale once it is a few seconds old
    (folder / LOCK_NAME).write_text("")
    os.utime(folder / LOCK_NAME, (time.time() - 60, time.time() - 60))
    with FolderLock(folder):
        pass


def test_cli_second_eval_in_one_folder_is_one_line(tmp_path, capsys):
    from hindsearch.data.world import generate_world

    world = generate_world(seed=0, n_entities=40)
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in world.splits["dev"][:2]))
    build_index(world.passages, tmp_path / "index", show_progress=False)
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        rc = main(["eval", "--model", "no-such/model", "--index", str(tmp_path / "index"), "--data", f"d={q}",
                   "--out", str(out), "--no-progress", "--set", "rollout.max_turns=1",
                   "--set", "rollout.max_new_tokens_per_turn=4"])
    finally:
        holder.kill()
        holder.wait()
    assert rc == 1
    one_line_error(capsys, "is in use", str(holder.pid))  # refused before the (missing) model is looked up
    assert not (out / "trajectories.jsonl").exists()


# ---------------------------------------------------------------- bad CLI values: one line, exit != 0
BAD_VALUES = [
    (["serve", "--index", "x", "--port", "99999"], "--port"),
    (["serve", "--index", "x", "--max-queries", "0"], "--max-queries"),
    (["serve", "--index", "x", "--body-timeout", "nan"], "--body-timeout"),
    (["eval", "--out", "o", "--limit", "-1"], "--limit"),
    (["eval", "--out", "o", "--retrieval-url", "ftp://x"], "--retrieval-url"),
    (["eval", "--out", "o", "--index", "x", "--retrieval-url", "http://x"], "--retrieval-url"),  # one retriever
    (["search", "--retrieval-url", "localhost:8000", "q"], "--retrieval-url"),
    (["data", "fetch", "--out", "o", "--connect-timeout", "-3"], "--connect-timeout"),
    (["world", "--out", "o", "--entities", "0"], "--entities"),
]


@pytest.mark.parametrize("argv,flag", BAD_VALUES, ids=[" ".join(a[:1] + [f]) for a, f in BAD_VALUES])
def test_bad_flag_values_are_rejected(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"argument {flag}" in err.splitlines()[-1]


def test_bad_values_found_later_name_the_field(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "afile").write_text("x")
    assert main(["train", "--set", "train.lr=nan"]) == 1
    one_line_error(capsys, "train.lr must be a finite number")
    assert main(["eval", "--out", "o", "--data", "d=empty.jsonl", "--index", "nowhere"]) == 1
    one_line_error(capsys, "no questions")
    assert main(["eval", "--out", "afile", "--data", "d=empty.jsonl"]) == 1
    one_line_error(capsys, "--out afile: is a file")
    (tmp_path / "run" / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    assert main(["train", "--out", "run", "--set", "train.steps=1"]) == 1
    one_line_error(capsys, "already holds checkpoints")
    assert main(["index", "--corpus", "afile", "--out", "/proc/hindsearch-cannot-write-here"]) == 1
    one_line_error(capsys, "hindsearch index: error:")


def test_every_command_documents_every_flag_and_has_debug_and_version(capsys):
    import argparse

    from hindsearch.cli import build_parser

    def walk(p: argparse.ArgumentParser, name: str):
        yield name, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    yield from walk(sp, f"{name} {n}")

    commands = list(walk(build_parser(), "hindsearch"))
    assert {"hindsearch serve", "hindsearch index", "hindsearch search", "hindsearch data fetch", "hindsearch eval"} <= {n for n, _ in commands}
    for name, p in commands:
        assert p.description, name
        assert "--debug" in p._option_string_actions, name
        text = p.format_help()
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            assert a.help, (name, a.option_strings or a.dest)
            if a.option_strings and not a.required:  # the default is shown, or said in words
                assert "default" in p._get_formatter()._get_help_string(a), (name, a.option_strings)
        assert "(default:" in text or len(p._actions) <= 3, name
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("hindsearch ")


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError):
        main(["index", "--corpus", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "i"), "--debug"])


# ---------------------------------------------------------------- server: bad bodies, slow clients
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from hindsearch.retrieval.factory import load_index
    from hindsearch.retrieval.limits import ServerLimits
    from hindsearch.retrieval.server import BackgroundServer, create_app

    d = tmp_path_factory.mktemp("srv")
    build_index(write_corpus(d / "c.jsonl"), d / "index", show_progress=False)
    limits = ServerLimits(body_timeout_s=1.0, header_timeout_s=1.0, max_body_bytes=1 << 20)
    s = BackgroundServer(create_app(load_index(d / "index"), limits=limits), header_timeout_s=1.0)
    yield s
    s.stop()


def raw_post(url: str, body: bytes, timeout: float = 10.0) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    c.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data)


@pytest.mark.parametrize("body,status", [
    (b'{"queries": ["q"], "topk": ' + b"9" * 5000 + b"}", 400),          # an integer over Python's digit limit
    (b'{"queries": ' + b"[" * 3_000 + b"]" * 3_000 + b"}", 400),          # nesting past the recursion limit
    (b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 422),      # more containers than a body needs
    (b'{"queries": ["q"], "x": ' + b"[" * 60_000 + b"]" * 60_000 + b"}", 422),
    (b'{"queries": ["q"], "topk": 100, "return_scores": 1}', 422),
    (json.dumps({"queries": ["q"] * 5000, "topk": 3}).encode(), 422),    # over max_queries
    (json.dumps({"queries": ["q"] * 2560, "topk": 30}).encode(), 422),   # over max_hits (response size)
    (b"\xff\xfe{", 400),
])
def test_bad_bodies_get_a_json_4xx(server, body, status):
    got, payload = raw_post(server.url, body)
    assert got == status and "error" in payload


def test_search_r1_batch_fits_and_docs_are_off(server):
    import httpx

    r = httpx.post(server.url + "/retrieve", json={"queries": [f"word{i % 12}" for i in range(2560)], "topk": 3})
    assert r.status_code == 200 and len(r.json()["result"]) == 2560
    assert httpx.get(server.url + "/docs").status_code == 404 and httpx.get(server.url + "/openapi.json").status_code == 404


def test_slow_clients_are_dropped(server):
    host, port = server.url.removeprefix("http://").split(":")
    # slow headers: the connection is closed once the header timeout passes
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
    t = time.monotonic()
    assert s.recv(100) == b"" and time.monotonic() - t < 5
    s.close()
    # slow body: a 408 JSON once the body timeout passes
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    reply = b""
    while b'"error"' not in reply and (chunk := s.recv(4096)):
        reply += chunk
    s.close()
    assert reply.startswith(b"HTTP/1.1 408") and b'"error"' in reply
    assert raw_post(server.url, b'{"queries": ["word3"]}')[0] == 200  # still serving


def test_a_request_head_after_a_response_has_the_same_deadline(server):
    """On a kept-alive connection the next head must be complete within the header timeout of the last answer,
    however the bytes trickle in (uvicorn's keep-alive timer alone is cancelled by the first byte)."""
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    body = b'{"queries": ["word3"]}'
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.endswith(b"]]}"):
        reply += s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200")
    t = time.monotonic()
    s.sendall(b"POST /retrieve HTTP/1.1\r\n")
    for _ in range(8):  # a header line every 0.4 s: the head is never complete
        time.sleep(0.4)
        try:
            s.sendall(b"X-Slow: 1\r\n")
        except OSError:
            break
    s.settimeout(5)
    try:
        assert s.recv(100) == b""
    except ConnectionResetError:
        pass
    assert time.monotonic() - t < 4  # dropped at the 1 s header timeout, not left open
    s.close()


# ---------------------------------------------------------------- the fuzz benchmarks' cases, in CI
def _bench(name: str):
    import importlib

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_every_fuzz_server_body_gets_a_json_4xx(server):
    bodies = _bench("fuzz_server").bad_bodies()
    assert len(bodies) >= 60
    for name, body in bodies:
        status, payload = raw_post(server.url, body, timeout=60)
        assert 400 <= status < 500 and "error" in payload, (name, status, payload)
    assert raw_post(server.url, b'{"queries": ["word3"]}')[0] == 200


def test_every_fuzz_cli_invocation_is_one_clean_line(tmp_path, monkeypatch, capsys):
    fuzz = _bench("fuzz_cli")
    fuzz.build_sandbox(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # '~' cases: a home folder with the user's files
    before = fuzz.snapshot(tmp_path)
    cases = fuzz.invocations()
    assert len(cases) >= 80
    for argv in cases:
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse: usage + one error line, exit 2
            rc = e.code
        err = capsys.readouterr().err.strip()
        assert rc not in (0, None), argv
        assert "Traceback" not in err and err.splitlines()[-1].startswith("hindsearch"), (argv, err)
        assert fuzz.snapshot(tmp_path) == before, argv
    assert not [p for p in tmp_path.rglob("*") if p.is_dir() and (".tmp" in p.name or ".old-" in p.name)]


class SlowRetriever:
    def retrieve(self, queries, k):
        time.sleep(1.0)
        return [[] for _ in queries]


def posts_at_once(limits, n: int, gap_s: float) -> list[tuple[int, dict, float]]:
    """``n`` ``/retrieve`` requests to a ``SlowRetriever`` server under ``limits``, started ``gap_s``
    apart: (status, payload, seconds) of each, in the order they finished."""
    import threading

    from hindsearch.retrieval.server import BackgroundServer, create_app

    s = BackgroundServer(create_app(SlowRetriever(), limits=limits))
    got: list[tuple[int, dict, float]] = []

    def one() -> None:
        t = time.monotonic()
        status, payload = raw_post(s.url, b'{"queries": ["q"]}', timeout=30)
        got.append((status, payload, time.monotonic() - t))

    try:
        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
            time.sleep(gap_s)
        for t in threads:
            t.join(30)
    finally:
        s.stop()
    return got


def test_requests_in_flight_are_bounded_with_a_json_503():
    from hindsearch.retrieval.limits import ServerLimits

    got = posts_at_once(ServerLimits(max_inflight=1, max_pending=1, queue_timeout_s=0.3), 4, 0.05)
    statuses = sorted(status for status, _, _ in got)
    assert statuses[0] == 200 and statuses[-1] == 503 and len(statuses) == 4
    assert all("busy" in payload["error"] for status, payload, _ in got if status == 503)


def test_requests_beyond_the_waiting_places_get_a_503_at_once():
    """With ``max_inflight + max_pending`` requests in, the next one is refused at once (its body is not held
    for the queue timeout)."""
    from hindsearch.retrieval.limits import ServerLimits

    got = posts_at_once(ServerLimits(max_inflight=1, max_pending=1, queue_timeout_s=30.0), 3, 0.1)
    refused = [(p, dt) for status, p, dt in got if status == 503]
    assert sorted(status for status, _, _ in got) == [200, 200, 503], got
    assert "2 requests in progress" in refused[0][0]["error"] and refused[0][1] < 0.5


def test_a_request_waits_for_a_retrieval_slot_at_most_the_queue_timeout():
    """``max_inflight`` requests are retrieved at once; one more waits for a slot and gets a 503 once
    ``queue_timeout_s`` passes (here before the slow retrieval ahead of it ends)."""
    from hindsearch.retrieval.limits import ServerLimits

    got = posts_at_once(ServerLimits(max_inflight=1, max_pending=4, queue_timeout_s=0.4), 2, 0.1)
    assert sorted(status for status, _, _ in got) == [200, 503], got
    assert "no retrieval slot within 0.4 s" in next(p["error"] for status, p, _ in got if status == 503)
