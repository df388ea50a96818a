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

Issue 23 added three classes of invocations (``ISSUE23``): A, outputs a command did not make (a
user's folder, ``~``, ``.``, ``/``, a symlink to a user's folder, ``out = ""``, a run folder's own files
as a report); B, resumes of a run folder whose config.toml was edited; C, evaluation reruns into a
folder whose rows another decoding, config or QA file made. And the *resume scenarios*: a real tiny
run (3 GRPO steps, a checkpoint each) is copied and broken as a stop would break it (killed during the
first save, torn last log lines, a checkpoint missing its optimizer, scheduler or RNG state, truncated
weights, a torn trainer state, an edited config) and resumed; they count duplicated step rows in
``metrics.jsonl``, resumes that went on without naming what they dropped or set aside (silent), and
refused resumes that changed the folder.

    python benchmarks/fuzz_cli.py [--json OUT.json] [--timeout 120] [--only issue23] [--no-scenarios]
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
    build_issue23_sandbox(root)


TINY = ['model.name="tiny-random"', 'model.device="cpu"', "train.questions_per_step=2", "rollout.num_generations=2",
        "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=1024", "train.lr=0.01",
        "train.kl_coef=0.04", "warmup.enabled=false", "train.samples_per_step=2", "train.eval_limit=2",
        "data.world_entities=60"]
EV = ["eval", "--model", "tiny-random", "--index", "idx", "--no-progress", "--set", "rollout.max_turns=1",
      "--set", "rollout.max_new_tokens_per_turn=4"]


def build_issue23_sandbox(root: Path) -> None:
    """What issue 23's cases need: a home folder with files (``HOME`` points there), a symlink to the user's
    folder, a run folder of ours (marker, logs), one whose config.toml was edited since it started, a tiny
    config, QA files whose ids collide, and a finished evaluation folder."""
    from hindsearch.cli import main as cli
    from hindsearch.config import Config
    from hindsearch.fsutil import OUTPUT_MARKER

    (root / "home").mkdir()
    (root / "home" / ".bashrc").write_text("export PATH\n")
    (root / "user" / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
    (root / "user" / "config.toml").write_text("# my notes\n")
    (root / "user" / "summary.json").write_text("{}\n")
    (root / "user" / "results.md").write_text("# mine\n")
    (root / "user" / "corpus.jsonl").write_text('{"id": "u", "contents": "mine"}\n')
    (root / "userlink").symlink_to(root / "user")
    cfg = Config.load(None, TINY + [f'data.world_dir="{root / "world"}"'])
    (root / "tiny.toml").write_text(cfg.to_toml())
    (root / "out-empty.toml").write_text('out = ""\n' + "\n".join(ln for ln in cfg.to_toml().splitlines()
                                                                if not ln.startswith("out ")) + "\n")
    mine = root / "myrun"
    mine.mkdir()
    (mine / "config.toml").write_text(cfg.to_toml())
    (mine / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 0.5}) + "\n" for i in (1, 2)))
    (mine / OUTPUT_MARKER).write_text(json.dumps({"kind": "run", "config": cfg.to_dict()}))
    edited = root / "edited"
    edited.mkdir()
    (edited / OUTPUT_MARKER).write_text(json.dumps({"kind": "run", "config": cfg.to_dict()}))
    cfg.set("train.lr=0.02")
    cfg.set("rollout.num_generations=4")
    (edited / "config.toml").write_text(cfg.to_toml())
    (root / "other-rollout.toml").write_text("[rollout]\ntemperature = 0.7\n")
    (root / "shared").mkdir()
    dev = [json.loads(x) for x in (root / "qa.jsonl").read_text().splitlines()]
    (root / "collide.jsonl").write_text("".join(json.dumps({**r, "question": f"Which {i}?", "golden_answers": ["x"]})
                                                + "\n" for i, r in enumerate(dev)))
    from hindsearch.models import load_tokenizer, tiny_random_model
    from hindsearch.retrieval.factory import build_index

    lines = (root / "data" / "c.jsonl").read_text().splitlines()
    (root / "c-half.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    build_index(root / "c-half.jsonl", root / "idx-half", show_progress=False)
    import contextlib
    import io

    here = Path.cwd()
    os.chdir(root)  # the model cache (.hindsearch/) and the recorded paths are the sandbox's
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            tok = load_tokenizer("tiny-random")
            tiny_random_model(tok, seed=1).save_pretrained(root / "tinymodel")
            tok.save_pretrained(root / "tinymodel")
            rc = cli([*EV, "--data", "d=qa.jsonl", "--out", "evaled"])
    finally:
        os.chdir(here)
    assert rc == 0, "the sandbox's evaluation failed"


def issue23_invocations() -> list[list[str]]:
    """Issue 23's classes A-C: every one must be refused with one line and change nothing."""
    ev = [*EV, "--data", "d=qa.jsonl"]
    return [
        # A: a writing command's output is a folder or file it did not make
        ["train", "--config", "tiny.toml", "--out", "user"], ["train", "--config", "tiny.toml", "--out", "userlink"],
        ["train", "--config", "tiny.toml", "--out", "~"], ["train", "--config", "tiny.toml", "--out", "."],
        ["train", "--config", "tiny.toml", "--out", "/"], ["train", "--config", "tiny.toml", "--out", "home"],
        ["train", "--config", "out-empty.toml"], ["train", "--config", "tiny.toml", "--out", "evaled"],
        [*ev, "--out", "user"], [*ev, "--out", "userlink"], [*ev, "--out", "~"], [*ev, "--out", "myrun"],
        [*ev, "--out", "world"], [*ev, "--out", "."],
        ["data", "mini", "--shared", "shared", "--out", "user"], ["data", "mini", "--shared", "shared", "--out", "~"],
        ["data", "mini", "--shared", "shared", "--out", "myrun"], ["data", "mini", "--shared", "shared", "--out", "shared"],
        ["report", "myrun", "--out", "myrun/metrics.jsonl"], ["report", "myrun", "--out", "myrun/config.toml"],
        ["report", "myrun", "--out", "user/thesis.tex"], ["report", "myrun", "--out", "myrun"],
        ["report", "myrun", "--out", "~/.bashrc"], ["report", "evaled", "--out", "evaled/summary.json"],
        ["index", "--corpus", "data/c.jsonl", "--out", "userlink"], ["index", "--corpus", "data/c.jsonl", "--out", "~"],
        ["sft", "--config", "tiny.toml", "--out", "user"], ["sft", "--config", "tiny.toml", "--out", "myrun"],
        # B: a resume whose config.toml was edited in a key that changes training
        ["train", "--resume", "edited"], ["train", "--allow-config-change"], ["train", "--resume", "~/nowhere"],
        ["train", "--resume", "evaled"],
        # C: an evaluation rerun into a folder whose rows something else made
        [*ev, "--out", "evaled", "--sample"], [*ev, "--out", "evaled", "--seed", "3", "--sample"],
        [*ev, "--out", "evaled", "--seed", "3"], [*ev, "--out", "evaled", "--config", "other-rollout.toml"],
        [*ev, "--out", "evaled", "--set", "rollout.max_turns=2"],
        [*ev, "--out", "evaled", "--set", "rollout.max_new_tokens_per_turn=8"],
        [*EV, "--data", "d=collide.jsonl", "--out", "evaled"],
        [*EV[:2], "tinymodel", *EV[3:], "--data", "d=qa.jsonl", "--out", "evaled"],
        [*EV[:3], "--index", "idx-half", *EV[5:], "--data", "d=qa.jsonl", "--out", "evaled"],
    ]


def invocations() -> list[list[str]]:
    """Every bad invocation: issue 16's, then issue 23's classes A-C."""
    return base_invocations() + issue23_invocations()


def base_invocations() -> list[list[str]]:
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
        ["search", *idx, "--retrieval-url", "http://127.0.0.1:9", "q"], ["search", "--retrieval-url", "ftp://x", "q"],
        ["search", "--retrieval-url", "http://127.0.0.1:9", "--timeout", "0", "q"], ["search", "--retrieval-url", "http://127.0.0.1:9", "q"],
        ["search", *idx, "q", "--snippet", "0"],
        # serve: each must fail before it serves
        ["serve", *idx, "--port", "99999"], ["serve", *idx, "--port", "-1"], ["serve", *idx, "--port", "http"],
        ["serve", *idx, "--max-queries", "0"], ["serve", *idx, "--max-topk", "-1"], ["serve", *idx, "--topk", "0"],
        ["serve", *idx, "--topk", "500"], ["serve", *idx, "--max-body-bytes", "0"], ["serve", *idx, "--body-timeout", "nan"],
        ["serve", *idx, "--header-timeout", "-1"], ["serve", *idx, "--max-inflight", "0"], ["serve", "--index", "notarun"],
        ["serve", "--index", "missing"], ["serve", *idx, "--host", "256.1.1.1"], ["serve", *idx, "--host", "no such host"],
        # eval (all fail before a model loads, or right after)
        ["eval", "--out", "o", "--limit", "-1"], ["eval", "--out", "o", "--limit", "0"],
        ["eval", "--out", "o", "--retrieval-url", "ftp://x"], ["eval", "--out", "o", "--retrieval-url", "not a url"],
        ["eval", "--out", "o", "--batch-size", "0"], ["eval", "--out", "o", "--seed", "-2"],
        [*ev[:-1], "--out", "afile"], [*ev[:-1], "--out", "afile/x"],
        ["eval", "--out", "o", "--data", "d=empty.jsonl"], ["eval", "--out", "o", "--data", "d=missing.jsonl"],
        ["eval", "--out", "o", "--data", "d=broken.jsonl"], ["eval", "--out", "o", "--data", "noequals"],
        ["eval", "--out", "o", "--data", "d=qa.jsonl,d=qa.jsonl"], ["eval", "--out", "o", "--data", "d=data"],
        ["eval", "--out", "o", "--config", "missing.toml"], ["eval", "--out", "o", "--config", "bad.toml"],
        ["eval", "--out", "o", "--set", "rollout.max_turns=-1"], ["eval", "--out", "o", "--set", "nosuch.key=1"],
        ["eval", "--out", "o", "--index", "idx", "--retrieval-url", "http://x"],
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


def sandbox_env(root: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1", "HOME": str(root / "home"),
            "HF_HOME": os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")}


def run_one(argv: list[str], root: Path, timeout: float) -> dict:
    env = sandbox_env(root)
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


# ---------------------------------------------------------------- resume scenarios (issue 23, class B)
def _steps(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _break_ckpt3(name: str, how: str):
    def brk(run: Path) -> None:
        f = run / "checkpoints" / "checkpoint-3" / name
        if how == "delete":
            f.unlink()
        elif how == "truncate":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
        else:
            f.write_text(how)
    return brk


def _no_complete_checkpoint(run: Path) -> None:
    import shutil

    for c in (run / "checkpoints").glob("checkpoint-*"):
        shutil.rmtree(c)
    (run / "checkpoints" / ".checkpoint-staging" / "checkpoint-1").mkdir(parents=True)
    shutil.rmtree(run / "final", ignore_errors=True)


def _torn_logs(run: Path) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "loss": 0.')
    with (run / "samples.jsonl").open("a") as f:
        f.write('{"step": 3, "question": "Who')


def _edit(run: Path) -> None:
    p = run / "config.toml"
    p.write_text(p.read_text().replace("lr = 0.01\n", "lr = 0.02\n", 1))


SCENARIOS = [
    # (name, how to break the copy, extra flags, should the resume succeed, what its output must name)
    ("killed during the first save", _no_complete_checkpoint, [], True, ["no complete checkpoint"]),
    ("torn last lines of metrics.jsonl and samples.jsonl", _torn_logs, [], True,
     ["metrics.jsonl: dropped a torn last line", "samples.jsonl: dropped a torn last line"]),
    ("checkpoint-3 without optimizer.pt", _break_ckpt3("optimizer.pt", "delete"), [], True, ["checkpoint-3", "optimizer.pt"]),
    ("checkpoint-3 without scheduler.pt", _break_ckpt3("scheduler.pt", "delete"), [], True, ["checkpoint-3", "scheduler.pt"]),
    ("checkpoint-3 without rng_state.pth", _break_ckpt3("rng_state.pth", "delete"), [], True, ["checkpoint-3", "rng_state"]),
    ("checkpoint-3 with model.safetensors cut in half", _break_ckpt3("model.safetensors", "truncate"), [], True,
     ["checkpoint-3", "model.safetensors"]),
    ("checkpoint-3 without model.safetensors", _break_ckpt3("model.safetensors", "delete"), [], True,
     ["checkpoint-3", "model.safetensors"]),
    ("checkpoint-3 with optimizer.pt cut in half", _break_ckpt3("optimizer.pt", "truncate"), [], True,
     ["checkpoint-3", "optimizer.pt"]),
    ("checkpoint-3 with a torn trainer_state.json", _break_ckpt3("trainer_state.json", '{"global_step": 3'), [], True,
     ["checkpoint-3", "trainer_state.json"]),
    ("config.toml edited (train.lr)", _edit, [], False, ["train.lr = 0.01 -> 0.02"]),
    ("config.toml edited, --allow-config-change", _edit, ["--allow-config-change"], True, ["train.lr = 0.01 -> 0.02"]),
]


def resume_scenarios(root: Path, timeout: float) -> list[dict]:
    """Train a tiny 3-step run once, then resume a broken copy of it per scenario (see the module docstring)."""
    import shutil

    env = sandbox_env(root)
    base = root / "sc" / "trained"
    (root / "sc").mkdir()
    cmd = [sys.executable, "-m", "hindsearch.cli", "train", "--config", "tiny.toml", "--out", str(base),
           "--set", "train.steps=3", "--set", "train.save_steps=1", "--set", f'data.world_dir="{root / "sc" / "world"}"']
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=max(timeout, 600))
    if p.returncode != 0:
        raise RuntimeError(f"the scenarios' training run failed: {p.stderr.strip().splitlines()[-1:]}")
    results = []
    for name, brk, flags, ok, needles in SCENARIOS:
        run = root / "sc" / name.split(" (")[0].replace(" ", "-").replace(",", "")[:40]
        shutil.copytree(base, run, symlinks=True)
        (run / "config.toml").write_text((run / "config.toml").read_text().replace(str(base), str(run)))
        brk(run)
        before = snapshot(run)
        t = time.time()
        p = subprocess.run([sys.executable, "-m", "hindsearch.cli", "train", "--resume", str(run), *flags], cwd=root,
                           env=env, capture_output=True, text=True, timeout=max(timeout, 600))
        text = p.stdout + p.stderr
        steps = _steps(run / "metrics.jsonl")
        said = all(n in text for n in needles)
        if ok:
            kind = "resumed, said so" if p.returncode == 0 and said else ("silent" if p.returncode == 0 else "failed")
        else:
            kind = "refused, clean" if p.returncode != 0 and said and "Traceback" not in text else (
                "silent" if p.returncode == 0 else "unclear refusal")
        results.append({"scenario": name, "rc": p.returncode, "kind": kind, "steps": steps,
                        "duplicated": len(steps) - len(set(steps)), "changed": [] if ok else
                        sorted(k for k in set(before) | set(snapshot(run)) if before.get(k) != snapshot(run).get(k)),
                        "seconds": round(time.time() - t, 1),
                        "said": next((ln for ln in text.splitlines() if any(n in ln for n in needles)), "")[:200]})
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write every result as JSON here")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per invocation before it counts as a hang")
    ap.add_argument("--only", choices=("all", "issue23"), default="all",
                    help="issue23: only issue 23's invocations (classes A-C) and the resume scenarios")
    ap.add_argument("--no-scenarios", action="store_true", help="skip the resume scenarios (they train a tiny run)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fuzz-cli-"))
    build_sandbox(root)
    results = []
    for argv in invocations() if args.only == "all" else issue23_invocations():
        r = run_one(argv, root, args.timeout)
        results.append(r)
        flag = "" if r["kind"] == "clean error" and not r["lost"] and not r["tmp"] else "  <--"
        print(f"{r['kind']:<18} rc={r['rc']!s:<4} {r['seconds']:>5.1f}s  hindsearch {' '.join(r['argv'])[:70]:<70} "
              f"| {r['error'][:110]}{flag}", flush=True)
        for k in ("lost", "new", "tmp"):
            if r[k]:
                print(f"{'':<18} {k}: {r[k]}")
    scen = [] if args.no_scenarios else resume_scenarios(root, args.timeout)
    for r in scen:
        flag = "" if r["kind"] in ("resumed, said so", "refused, clean") and not r["duplicated"] and not r["changed"] else "  <--"
        print(f"{r['kind']:<18} rc={r['rc']!s:<4} {r['seconds']:>5.1f}s  resume: {r['scenario'][:50]:<50} "
              f"steps {r['steps']} | {r['said'][:100]}{flag}", flush=True)
    kinds = ("clean error", "traceback", "silent acceptance", "hang", "unclear error")
    summary = {"bad invocations tried": len(results), **{k: sum(r["kind"] == k for r in results) for k in kinds},
               "silent deletions or changes": sum(len(r["lost"]) for r in results),
               "leftover .tmp folders": len({t for r in results for t in r["tmp"]}),
               "files left behind by a failed command": len({t for r in results for t in r["new"]}),
               "resume scenarios tried": len(scen),
               "resumes that named what they dropped or refused": sum(r["kind"] in ("resumed, said so", "refused, clean")
                                                                     for r in scen),
               "silent resumes": sum(r["kind"] == "silent" for r in scen),
               "failed or unclear resumes": sum(r["kind"] in ("failed", "unclear refusal") for r in scen),
               "duplicated step rows": sum(r["duplicated"] for r in scen),
               "refused resumes that changed the run": sum(bool(r["changed"]) for r in scen),
               "seconds in all": round(sum(r["seconds"] for r in results + scen), 1)}
    print()
    w = max(len(k) for k in summary)
    print(f"{'measure':<{w}}  value")
    for k, v in summary.items():
        print(f"{k:<{w}}  {v}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "scenarios": scen, "summary": summary}, indent=1) + "\n")
    bad = (sum(summary[k] for k in kinds[1:]) + summary["silent deletions or changes"] + summary["leftover .tmp folders"]
           + summary["files left behind by a failed command"] + summary["silent resumes"]
           + summary["failed or unclear resumes"] + summary["duplicated step rows"]
           + summary["refused resumes that changed the run"])
    return 0 if bad == 0 and len(results) >= (80 if args.only == "all" else 30) else 1


if __name__ == "__main__":
    sys.exit(main())
