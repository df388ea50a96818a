"""Two processes through the real TRL trainer (``accelerate launch --multi_gpu --num_processes 2`` with no visible
GPU, so torchrun starts 2 CPU ranks on gloo: accelerate's ``--cpu`` with 2 processes needs mpirun and otherwise
starts one process), where rank 0
has failed rollouts and rank 1 has none, two steps each of ``hindsearch`` (LM judge = TRL's reference model, with
the neutral control) and ``igsd``.

On CPU accelerate runs DDP, whose forwards issue no collective. To make the test see what ZeRO-3 / FSDP do, the
launched script shards TRL's reference model (the LM judge, the frozen teacher, IGSD's proposer) with real FSDP2
(``fully_shard`` on CPU, gloo: every forward all-gathers its weights), and gives the DDP-wrapped policy an
**emulated sharded forward**: a forward pre-hook that all-reduces a marker (as ZeRO-3 all-gathers weights on every
forward) and checks the sum; a forward on one rank that meets another collective on the other rank raises or
hangs (a watchdog prints the stacks and exits; the hard timeout kills the process group). Each rank also counts its forwards per model; the test asserts that both ranks
ran the same number. Without the model core's lockstep (``--unsynced all`` patches ``core.lockstep.active`` to
False: every rank does only its own work) the run fails.

This file is also the launched script (``python tests/test_multiprocess.py --dir DIR``). The lockstep rule itself
(``lockstep.lockstep`` / ``lockstep.forward``) is tested on 2 gloo processes without a model, and alone (a no-op).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT_S = 240
METHODS = ("hindsearch", "igsd")
MARK = {"policy": 1.0, "ref": 2.0}


# ---------------------------------------------------------------- the launched script (one per rank)
def _engine_class():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_trainer import ScriptedEngine

    from hindsearch.agent.engine import RolloutEngine

    class RankEngine(ScriptedEngine):
        """``ScriptedEngine`` on rank 0 (even rollouts answer the gold, odd ones search ``weather`` and fail);
        on every other rank all rollouts search the question and answer the gold: no failed rollout there."""

        def __init__(self, *a, all_gold: bool):
            super().__init__(*a)
            self.all_gold = all_gold

        def rollout(self, records, num_generations=1, **kw):
            if not self.all_gold:
                return super().rollout(records, num_generations, **kw)
            enc = lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
            self._scripts = [[enc(f"<search> {r.question} </search>"), enc(f"<answer> {r.golden_answers[0]} </answer>")]
                             for r in records for _ in range(num_generations)]
            return RolloutEngine.rollout(self, records, num_generations, **kw)

    return RankEngine


def shard(model) -> None:
    """Real FSDP2 sharding of a Llama on CPU (gloo): each decoder layer and the root are ``fully_shard``-ed, so
    every forward all-gathers the weights layer by layer, as on GPUs."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def emulate_sharding(model, name: str, counts: dict[str, int], collective: bool = True) -> None:
    """Every forward of ``model`` counts itself and (``collective``) joins a collective first, like ZeRO-3's
    weight all-gather (for the policy, which DDP wraps on CPU and FSDP2 cannot shard under it)."""
    import torch
    import torch.distributed as dist

    def hook(_mod, _args):
        counts[name] += 1
        if not collective:
            return
        t = torch.tensor([MARK[name]], dtype=torch.float64)
        dist.all_reduce(t)
        if float(t) != MARK[name] * dist.get_world_size():
            raise RuntimeError(f"rank {dist.get_rank()}: forward {counts[name]} of the {name} model met another "
                               f"collective on another rank (sum {float(t)}): ranks ran different forwards")

    model.register_forward_pre_hook(hook)


def worker(d: Path, methods: list[str], unsynced: str, watchdog_s: float) -> None:
    import faulthandler

    import torch

    rank = int(os.environ["RANK"])
    (d / f"pid-rank{rank}").write_text(str(os.getpid()))  # torchrun starts ranks in their own sessions
    faulthandler.dump_traceback_later(watchdog_s, exit=True)  # a hung rank prints where it waits, then exits
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hindsearch.config import Config
    from hindsearch.data.world import generate_world
    from hindsearch.core import lockstep
    from hindsearch.retrieval.factory import load_index
    from hindsearch.train.run import build_trainer

    torch.set_num_threads(1)
    if unsynced == "all":  # no lockstep: every rank does only its own work
        lockstep.active = lambda: False
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_trainer import OVERRIDES

    tok = AutoTokenizer.from_pretrained(d / "init")
    retriever = load_index(d / "bm25")
    records = generate_world(seed=0, n_entities=60).splits["train"][:4]
    Engine = _engine_class()
    from hindsearch.hindsight import judge

    real_finish = judge.finish
    # the tiny random judge writes blank lines (a degenerate critique); its generate calls stay real, only their
    # text is replaced by a usable critique so that the teacher's forwards (critique and neutral control) run too
    judge.finish = lambda raw, *a: real_finish("Search for the passage that names the answer directly.", *a)
    for method in methods:
        extra = {"hindsearch": ['hindsearch.judge_kind="lm"', "hindsearch.critique_max_tokens=6",
                                "hindsearch.neutral_control=true"],
                 "igsd": ["igsd.max_positions_per_rollout=2", "igsd.max_query_tokens=4", "igsd.n_controls=1"]}[method]
        cfg = Config.load(None, [o for o in OVERRIDES if not o.startswith("train.save_steps")]
                          + [f'method="{method}"', "train.save_steps=100", "train.kl_coef=0.04"] + extra)
        model = AutoModelForCausalLM.from_pretrained(d / "init")
        model.train()
        engine = Engine(model, tok, retriever, cfg.rollout, all_gold=rank != 0)
        trainer = build_trainer(cfg, model, tok, engine, records, d / f"run-{method}")
        counts = {"policy": 0, "ref": 0}
        emulate_sharding(trainer.accelerator.unwrap_model(trainer.model), "policy", counts)
        assert trainer.aux_ctx.frozen is trainer.ref_model  # beta > 0: the judge and teacher are TRL's reference
        ref = trainer.accelerator.unwrap_model(trainer.ref_model)
        shard(ref)  # the reference model (judge, teacher, IGSD proposals) is really sharded
        emulate_sharding(ref, "ref", counts, collective=False)
        trainer.train()
        failed = [float(t.failed) for t in trainer._last_trajs]
        (d / f"counts-{method}-rank{rank}.json").write_text(json.dumps({**counts, "failed_last_step": sum(failed)}))
    assert lockstep.close()  # as the CLI does after a run that ended well, then its entry's lockstep.end_process


# ---------------------------------------------------------------- the lockstep rule, without a model
def _lockstep_rank(rank: int, port: int, out: str) -> None:
    """Rank 0 runs 5 forwards in the first region and 1 in the second, rank 1 runs 2 and 4 (and a nested region);
    every forward or dummy is an emulated sharded forward (an all-reduce of a marker, checked)."""
    import torch
    import torch.distributed as dist

    from hindsearch.core import lockstep as sync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    calls = {"real": 0, "dummy": 0, "bad": 0}

    def sharded(kind: str) -> int:
        calls[kind] += 1
        t = torch.tensor([7.0])
        dist.all_reduce(t)
        calls["bad"] += int(float(t) != 14.0)
        return calls[kind]

    work = [(5, 1), (2, 4)][rank]
    for region, n in enumerate(work):
        with sync.lockstep(lambda: sharded("dummy")):
            for i in range(n):
                if region == 1 and i == 1:
                    with sync.lockstep(lambda: sharded("dummy")):  # nested: joins the open region
                        sync.forward(sharded, "real")
                else:
                    assert sync.forward(sharded, "real") == calls["real"]
    calls["any"] = int(sync.any_rank(rank == 1))
    Path(out, f"rank{rank}.json").write_text(json.dumps(calls))
    _end_rank()


def test_lockstep_two_processes(tmp_path):
    """Unequal work in two regions: both ranks run max(5, 2) + max(1, 4) = 9 forwards, real ones first."""
    rc, out = _spawn_with_timeout(_lockstep_rank, (_free_port(), str(tmp_path)), 120)
    assert rc == 0, f"exit {rc} (None: timeout, a hang)\n{out[-3000:]}"
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0 == {"real": 6, "dummy": 3, "bad": 0, "any": 1}, r0
    assert r1 == {"real": 6, "dummy": 3, "bad": 0, "any": 1}, r1


def _fsdp_rank(rank: int, port: int, d: str) -> None:
    """Every sharded-forward function of the hindsight path and the rollout backend, with unequal work per rank,
    through a real FSDP2-sharded model; results must equal the unsharded model's."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hindsearch.agent.hf_backend import HFBackend
    from hindsearch.core.sampling import SamplingParams
    from hindsearch.core.scoring import score_continuations, shared_prefix_utilities

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tok = AutoTokenizer.from_pretrained(Path(d, "init"))
    full = AutoModelForCausalLM.from_pretrained(Path(d, "init")).eval()
    sharded = AutoModelForCausalLM.from_pretrained(Path(d, "init")).eval()
    shard(sharded)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    a, b, c = ids("who founded the city"), ids("<search> the river"), ids("the answer is")
    n = [3, 0][rank]  # rank 1 has nothing to score, decode or complete in some calls, less in the others
    checks: dict[str, bool] = {}
    with torch.no_grad():
        for name, fn in {
            "teacher": lambda m: score_continuations(m, [a, b, c][:n], [c, a, b][:n], topk=2, batch_size=1),
            "complete": lambda m: [(o.ids, o.finish) for o in HFBackend(m, tok).complete_queries(
                [a, a + b, c][: n or 1], [6, 2][rank], [0, 0, 1][: n or 1], batch_size=1)],
            "utilities": lambda m: shared_prefix_utilities(m, [a, a + b][:n], [c, c][:n], [b, a][:n], [0, 0][:n], 1),
            "rollout_turn": lambda m: [(o.ids, o.finish) for o in HFBackend(m, tok).generate(
                [a, b][: 2 - rank], [5, 3][: 2 - rank], SamplingParams(greedy=True), ("</search>",))],
        }.items():
            want, got = fn(full), fn(sharded)
            if isinstance(want, tuple):
                checks[name] = all(torch.allclose(x.float(), y.float(), atol=1e-5) for x, y in zip(want, got))
            elif isinstance(want, torch.Tensor):
                checks[name] = torch.allclose(want, got, atol=1e-5)
            else:
                checks[name] = want == got
    Path(d, f"fsdp-rank{rank}.json").write_text(json.dumps(checks))
    _end_rank()


def _end_rank() -> None:
    """Close the group and leave as ``hindsearch.cli.entry`` does: FSDP2's device mesh keeps gloo's threads alive
    past the destroy, and their teardown at interpreter exit aborted a finished rank with SIGABRT once in CI."""
    from hindsearch.core import lockstep

    assert lockstep.close()
    lockstep.end_process(0)


def test_sharded_forwards_fsdp2_two_processes(prepared):
    """Real FSDP2 sharding on 2 gloo processes, rank 0 with work and rank 1 with less or none in each call:
    every call returns (a hang is killed by the timeout) and matches the unsharded model on both ranks."""
    rc, out = _spawn_with_timeout(_fsdp_rank, (_free_port(), str(prepared)), 150)
    if rc is None:
        pytest.fail(f"FSDP2 ranks did not finish in 150 s (hang: ranks ran different forwards?)\n{out[-3000:]}")
    assert rc == 0, out[-3000:]
    for r in (0, 1):
        checks = json.loads((prepared / f"fsdp-rank{r}.json").read_text())
        assert checks == dict.fromkeys(("teacher", "complete", "utilities", "rollout_turn"), True), (r, checks)


def _spawn_with_timeout(fn, args: tuple, timeout_s: float) -> tuple[int | None, str]:
    """``fn(rank, *args)`` on 2 spawned processes in a child process group; ``(exit code or None on timeout, output)``."""
    here = str(Path(__file__).resolve().parent)
    code = (f"import sys, torch.multiprocessing as mp; sys.path.insert(0, {here!r}); import test_multiprocess as t; "
            f"mp.start_processes(t.{fn.__name__}, args={args!r}, nprocs=2, start_method='spawn', join=True)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        _kill(p.pid, killpg=True)  # spawned ranks share the child's process group
        out, _ = p.communicate()
        return None, out.decode(errors="replace")


def test_lockstep_alone_is_a_no_op():
    """One process: no collective, the dummy never runs, ``forward`` returns its function's value."""
    from hindsearch.core import lockstep as sync

    assert not sync.active() and sync.any_rank(False) is False and sync.any_rank(True) is True
    ran: list[str] = []
    with sync.lockstep(lambda: ran.append("dummy")):
        assert sync.forward(lambda x: ran.append("real") or x, 3) == 3
    assert ran == ["real"]


def test_the_cli_closes_the_process_group_after_a_clean_run_only(tmp_path):
    """A command that ends well destroys the process group (``lockstep.close``): gloo's threads left to the
    interpreter's teardown abort a finished ``accelerate launch`` run with SIGABRT. After an error the group is
    left alone (a rank destroying it while another waits in a collective would hang)."""
    import torch.distributed as dist

    from hindsearch.cli import main

    for n, (argv, rc) in enumerate([(["world", "--out", str(tmp_path / "w"), "--entities", "40"], 0),
                                    (["world", "--out", str(tmp_path / "w2"), "--entities", "10"], 1)]):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / f'store{n}'}", rank=0, world_size=1)
        try:
            assert main(argv) == rc
            assert dist.is_initialized() == (rc != 0), argv
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    assert not __import__("hindsearch.core.lockstep", fromlist=["close"]).close()  # none left: a no-op


@pytest.mark.parametrize("world_size,entities,ends", [("2", "40", True), ("1", "40", False), ("2", "10", False)])
def test_entry_ends_a_finished_rank_only(tmp_path, monkeypatch, world_size, entities, ends):
    """The console script leaves through ``lockstep.end_process`` only on a rank of a multi-process launch whose
    command ended well; a single process, or a failed command, exits normally with its code."""
    from hindsearch import cli
    from hindsearch.core import lockstep as sync

    ended: list[int] = []
    monkeypatch.setattr(sync, "end_process", lambda rc: ended.append(rc) or sys.exit(rc))
    monkeypatch.setenv("WORLD_SIZE", world_size)
    monkeypatch.setattr(sys, "argv", ["hindsearch", "world", "--out", str(tmp_path / "w"), "--entities", entities])
    with pytest.raises(SystemExit) as e:
        cli.entry()
    assert ended == ([0] if ends else []) and e.value.code == (0 if entities == "40" else 1)


def test_end_process_loses_nothing(tmp_path):
    """``lockstep.end_process`` skips the interpreter's finalisation but not what a run leaves to it: a non-daemon
    thread still writing, ``atexit`` handlers, unflushed output; the exit code is the one given."""
    done = tmp_path / "thread.txt"
    code = ("import atexit, sys, threading, time\n"
            "from hindsearch.core import lockstep as sync\n"
            f"threading.Thread(target=lambda: (time.sleep(0.5), open({str(done)!r}, 'w').write('ok'))).start()\n"
            "atexit.register(lambda: print('atexit ran', flush=True))\n"
            "sys.stdout.write('buffered, no newline')\n"
            "sync.end_process(3)\n"
            "print('never printed')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr[-2000:]
    assert out.stdout.startswith("buffered, no newline") and "atexit ran" in out.stdout, out.stdout
    assert "never printed" not in out.stdout and done.read_text() == "ok"


# ---------------------------------------------------------------- the test (parent process)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(d: Path, methods: list[str], unsynced: str = "", timeout_s: float = TIMEOUT_S) -> tuple[int | None, str]:
    """Run the script on 2 CPU processes in its own process group; ``(returncode or None on timeout, output)``."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
           str(Path(__file__).resolve()), "--dir", str(d), "--watchdog", str(max(timeout_s - 30, 10)), "--methods",
           *methods] + (["--unsynced", unsynced] if unsynced else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_DISABLE_RICH": "1",
           "CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "true"}
    log = d / "launch.log"
    with log.open("w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc: int | None = p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if p.poll() is None or rc is None:
                _kill(p.pid, killpg=True)
                p.wait()
                for f in d.glob("pid-rank*"):  # ranks live in their own sessions: end them by their recorded ids
                    _kill(int(f.read_text()), only_if=str(d))
    return rc, log.read_text(errors="replace")


def _kill(pid: int, killpg: bool = False, only_if: str | None = None) -> None:
    """SIGKILL ``pid`` (its process group with ``killpg``); with ``only_if``, only while its command line holds it."""
    try:
        if only_if is not None and only_if not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return
        (os.killpg if killpg else os.kill)(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, FileNotFoundError):
        pass


def prepare(d: Path) -> None:
    """The world's BM25 index and a tiny random model + tokenizer saved once for both ranks."""
    from hindsearch.data.world import generate_world
    from recipes.micro.build import train_tokenizer
    from hindsearch.models import tiny_random_model
    from hindsearch.retrieval.factory import build_index

    w = generate_world(seed=0, n_entities=60)
    build_index(w.passages, d / "bm25", kind="bm25", show_progress=False)
    tok = train_tokenizer([p.contents for p in w.passages] + [r.question for s in w.splits.values() for r in s],
                          vocab_size=1024)
    model = tiny_random_model(tok, seed=0, num_hidden_layers=1)
    model.save_pretrained(d / "init")
    tok.save_pretrained(d / "init")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp")
    prepare(d)
    return d


def test_two_ranks_with_unequal_failed_rollouts(prepared):
    tmp_path = prepared
    t0 = time.time()
    rc, out = launch(tmp_path, list(METHODS))
    tail = "\n".join(out.splitlines()[-60:])
    if rc is None:
        pytest.fail(f"2-process run did not finish in {TIMEOUT_S} s (hang: ranks ran different forwards?)\n{tail}")
    assert rc == 0, f"2-process run failed (exit {rc}):\n{tail}"
    for method in METHODS:
        c0, c1 = (json.loads((tmp_path / f"counts-{method}-rank{r}.json").read_text()) for r in (0, 1))
        assert c0["failed_last_step"] > 0 and c1["failed_last_step"] == 0, (c0, c1)  # the asymmetry is real
        assert (c0["policy"], c0["ref"]) == (c1["policy"], c1["ref"]), (method, c0, c1)
        rows = [json.loads(x) for x in (tmp_path / f"run-{method}" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2], method
        for r in rows:  # rank 0 logs: its failed rollouts went through the term's forwards
            if method == "hindsearch":
                assert r["hind/failed"] == 1.0 and r["hind/critiques"] == 1.0 and r["hind/judge_time"] > 0, r
                assert r["hind/teacher_time"] > 0 and r["hind/distill_tokens"] > 0, r
            else:
                assert r["igsd/failed"] == 1.0 and r["igsd/positions_selected"] > 0 and r["igsd/completions"] > 0, r
    print(f"2 processes x {len(METHODS)} methods x 2 steps: {time.time() - t0:.1f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--unsynced", choices=("all",), default="",
                    help="disable the model core's lockstep (shows the hang)")
    ap.add_argument("--watchdog", type=float, default=TIMEOUT_S, help="seconds before a rank dumps its stacks and exits")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as tests/conftest.py: recipes.micro.build
    worker(a.dir, a.methods, a.unsynced, a.watchdog)
    from hindsearch.core import lockstep

    lockstep.end_process(0)  # as hindsearch.cli.entry: DDP/FSDP keep gloo's threads alive past close (SIGABRT at teardown)
