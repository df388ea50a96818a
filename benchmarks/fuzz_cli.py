"""Fuzz the ``hindsearch`` command line with bad invocations (issue 16); prints one table.

Each invocation runs as its own process (``python -m hindsearch.cli ...``, offline, a time limit
each) in a sandbox folder holding what a user has lying around: a corpus, a folder of their own
files, a plain file, an index, a world, a run folder with checkpoints, QA files good, empty and
broken. Every invocation here is wrong (a bad value, a bad path, a missing file, an output that
would overwrite user data ...) and must fail with exit status != 0 and one clear error line, no
traceback, and without deleting or changing any file of the sandbox.

The table counts: tried, clean one-line errors, tracebacks, silent acceptances (exit 0, or a
server that started serving), hangs (time limit), silent deletions or changes of sandbox files,
leftover temporary folders, and files a failed command left behind.

    python benchmarks/fuzz_cli.py [--json OUT.json] [--timeout 120]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build_sandbox(root: Path) -> None:
    from hindsearch.data.world import generate_world, write_world
    from hindsearch.retrieval.factory import build_index

    world = generate_world(seed=0, n_entities=40)
    write_world(world, root / "world")
    (root / "data").mkdir()
    (root / "data" / "c.jsonl").write_text((root / "world" / "corpus.jsonl").read_text())
    build_index(root / "data" / "c.jsonl", root / "idx", show_progress=False)
    (root / "user").mkdir()
    (root / "user" / "thesis.tex").write_text("three years of work\n")
    (root / "user" / "notes.txt").write_text("do not delete\n")
    (root / "afile").write_text("a plain file\n")
    (root / "qa.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in world.splits["dev"][:2]))
    (root / "empty.jsonl").write_text("")
    (root / "broken.jsonl").write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n{oops\n')
    (root / "bad.toml").write_text("[train\nsteps = ")
    (root / "corpus-bad.jsonl").write_text('{"id": "1", "contents": "ok"}\n[1, 2]\n')
    (root / "binary.jsonl").write_bytes(b"\xff\xfe\x00\x01" * 64)
    run = root / "run"
    (run / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-1" / "trainer_state.json").write_text("{}")
    (run / "config.toml").write_text('method = "grpo"\n')
    (root / "notarun").mkdir()


def invocations() -> list[list[str]]:
    """Bad invocations (argv after ``hindsearch``)."""
    nope = "/proc/hindsearch-cannot-write-here"
    idx = ["--index", "idx"]
    ev = ["eval", "--model", "tiny-random", "--index", "idx", "--data", "d=qa.jsonl", "--no-progress"]
    return [
        # top level
        ["no-such-command"], ["--no-such-flag"], ["index", "--no-such-flag"],
        # index: outputs that would destroy data, bad inputs, bad values
        ["index", "--corpus", "data/c.jsonl", "--out", "data"],
        ["index", "--corpus", "data/c.jsonl", "--out", "."],
        ["index", "--corpus", "data/c.jsonl", "--out", ".."],
        ["index", "--corpus", "data/c.jsonl", "--out", "user"],
        ["index", "--corpus", "data/c.jsonl", "--out", "afile"],
        ["index", "--corpus", "data/c.jsonl", "--out", "afile/sub"],
        ["index", "--corpus", "data/c.jsonl", "--out", "world"],
        ["index", "--corpus", "data/c.jsonl", "--out", nope],
        ["index", "--corpus", "data", "--out", "i2"],
        ["index", "--corpus", "missing.jsonl", "--out", "i2"],
        ["index", "--corpus", "empty.jsonl", "--out", "i2"],
        ["index", "--corpus", "corpus-bad.jsonl", "--out", "i2"],
        ["index", "--corpus", "binary.jsonl", "--out", "i2"],
        ["index", "--corpus", "bad.toml", "--out", "i2"],
        ["index", "--corpus", "data/c.jsonl", "--out", "i2", "--kind", "sparse"],
        ["index", "--corpus", "data/c.jsonl", "--out", "i2", "--batch-size", "0"],
        ["index", "--corpus", "data/c.jsonl", "--out", "i2", "--hnsw", "-4"],
        ["index", "--corpus", "data/c.jsonl"],
        # world
        ["world", "--out", "afile"], ["world", "--out", "user"], ["world", "--out", "user", "--force"],
        ["world", "--out", "."], ["world", "--out", "data", "--force"], ["world", "--out", "w2", "--entities", "0"],
        ["world", "--out", "w2", "--entities", "10"], ["world", "--out", "w2", "--seed", "-1"],
        ["world", "--out", "w2", "--entities", "many"], ["world", "--out", nope],
        # search
        ["search", "q"], ["search", "--index", "notarun", "q"], ["search", "--index", "afile", "q"],
        ["search", "--index", "missing", "q"], ["search", *idx, "q", "-k", "0"], ["search", *idx, "q", "-k", "-3"],
        ["search", *idx, "--url", "http://127.0.0.1:9", "q"], ["search", "--url", "ftp://x", "q"],
        ["search", "--url", "http://127.0.0.1:9", "--timeout", "0", "q"], ["search", "--url", "http://127.0.0.1:9", "q"],
        ["search", *idx, "q", "--snippet", "0"],
        # serve: each must fail before it serves
        ["serve", *idx, "--port", "99999"], ["serve", *idx, "--port", "-1"], ["serve", *idx, "--port", "http"],
        ["serve", *idx, "--max-queries", "0"], ["serve", *idx, "--max-topk", "-1"], ["serve", *idx, "--topk", "0"],
        ["serve", *idx, "--topk", "500"], ["serve", *idx, "--max-body-bytes", "0"], ["serve", *idx, "--body-timeout", "nan"],
        ["serve", *idx, "--header-timeout", "-1"], ["serve", *idx, "--max-inflight", "0"], ["serve", "--index", "notarun"],
        ["serve", "--index", "missing"], ["serve", *idx, "--host", "256.1.1.1"], ["serve", *idx, "--host", "no such host"],
        # eval (all fail before a model loads, or right after)
        ["eval", "--out", "o", "--limit", "-1"], ["eval", "--out", "o", "--limit", "0"],
        ["eval", "--out", "o", "--retriever-url", "ftp://x"], ["eval", "--out", "o", "--retriever-url", "not a url"],
        ["eval", "--out", "o", "--batch-size", "0"], ["eval", "--out", "o", "--seed", "-2"],
        [*ev[:-1], "--out", "afile"], [*ev[:-1], "--out", "afile/x"],
        ["eval", "--out", "o", "--data", "d=empty.jsonl"], ["eval", "--out", "o", "--data", "d=missing.jsonl"],
        ["eval", "--out", "o", "--data", "d=broken.jsonl"], ["eval", "--out", "o", "--data", "noequals"],
        ["eval", "--out", "o", "--data", "d=qa.jsonl,d=qa.jsonl"], ["eval", "--out", "o", "--data", "d=data"],
        ["eval", "--out", "o", "--config", "missing.toml"], ["eval", "--out", "o", "--config", "bad.toml"],
        ["eval", "--out", "o", "--set", "rollout.max_turns=-1"], ["eval", "--out", "o", "--set", "nosuch.key=1"],
        ["eval", "--out", "o", "--index", "idx", "--retriever-url", "http://x"],
        [*ev[:-1], "--out", "o2", "--index", "notarun"],
        # train / sft
        ["train", "--set", "train.lr=nan"], ["train", "--set", "train.lr=inf"], ["train", "--set", "train.lr=-inf"],
        ["train", "--set", "train.steps=-1"], ["train", "--set", "train.steps=many"], ["train", "--set", "model.dtype=int3"],
        ["train", "--set", "nosuch.key=1"], ["train", "--set", "noequals"], ["train", "--set", "data.world_entities=\"x\""],
        ["train", "--config", "missing.toml"], ["train", "--config", "bad.toml"], ["train", "--method", "ppo"],
        ["train", "--out", "run", "--set", "train.steps=1"], ["train", "--out", "afile", "--set", "train.steps=1"],
        ["train", "--resume", "notarun"], ["train", "--resume", "missing"], ["train", "--resume", "run", "--set", "train.steps=3"],
        ["sft", "--out", "s", "--set", "warmup.lr=nan"], ["sft", "--out", "s", "--demos", "missing.jsonl"],
        # data
        ["data", "fetch", "--out", "f", "--what", "everything"], ["data", "fetch", "--out", "f", "--connect-timeout", "0"],
        ["data", "fetch", "--out", "f", "--endpoint", "ftp://mirror"], ["data", "fetch", "--out", "f", "--endpoint", "http://127.0.0.1:9"],
        ["data", "mini", "--shared", "missing", "--out", "m"],
        # report / compare
        ["report", "missing"], ["report", "notarun"], ["report", "run", "--out", "afile/x.html"],
        ["compare", "--out", "c", "--methods", "grpo,nosuch"], ["compare", "--out", "c", "--seeds", "a,b"],
    ]


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run_one(argv: list[str], root: Path, timeout: float) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}
    before = snapshot(root)
    t = time.time()
    p = subprocess.Popen([sys.executable, "-m", "hindsearch.cli", *argv], cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc: int | None = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    dt = time.time() - t
    after = snapshot(root)
    lost = sorted(k for k in before if after.get(k) != before[k])
    new = sorted(k for k in after if k not in before)
    tmp = sorted(str(q.relative_to(root)) for q in root.rglob("*") if q.is_dir() and (".tmp" in q.name or ".old-" in q.name))
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if rc is None:
        serving = "Uvicorn running" in err or "Application startup complete" in err
        kind = "silent acceptance" if serving else "hang"
    elif rc == 0:
        kind = "silent acceptance"
    elif "Traceback" in err:
        kind = "traceback"
    elif last.startswith("hindsearch") and "error:" in last:
        kind = "clean error"
    else:
        kind = "unclear error"
    return {"argv": argv, "rc": rc, "kind": kind, "error": last[:240], "lost": lost, "new": new, "tmp": tmp, "seconds": round(dt, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write every result as JSON here")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per invocation before it counts as a hang")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fuzz-cli-"))
    build_sandbox(root)
    results = []
    for argv in invocations():
        r = run_one(argv, root, args.timeout)
        results.append(r)
        flag = "" if r["kind"] == "clean error" and not r["lost"] and not r["tmp"] else "  <--"
        print(f"{r['kind']:<18} rc={r['rc']!s:<4} {r['seconds']:>5.1f}s  hindsearch {' '.join(r['argv'])[:70]:<70} "
              f"| {r['error'][:110]}{flag}", flush=True)
        for k in ("lost", "new", "tmp"):
            if r[k]:
                print(f"{'':<18} {k}: {r[k]}")
    kinds = ("clean error", "traceback", "silent acceptance", "hang", "unclear error")
    summary = {"bad invocations tried": len(results), **{k: sum(r["kind"] == k for r in results) for k in kinds},
               "silent deletions or changes": sum(len(r["lost"]) for r in results),
               "leftover .tmp folders": len({t for r in results for t in r["tmp"]}),
               "files left behind by a failed command": len({t for r in results for t in r["new"]}),
               "seconds in all": round(sum(r["seconds"] for r in results), 1)}
    print()
    w = max(len(k) for k in summary)
    print(f"{'measure':<{w}}  value")
    for k, v in summary.items():
        print(f"{k:<{w}}  {v}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "summary": summary}, indent=1) + "\n")
    bad = (sum(summary[k] for k in kinds[1:]) + summary["silent deletions or changes"] + summary["leftover .tmp folders"]
           + summary["files left behind by a failed command"])
    return 0 if bad == 0 and len(results) >= 80 else 1


if __name__ == "__main__":
    sys.exit(main())
