"""``hindsearch compare``: GRPO vs HindSearch vs IGSD (and their controls) from one start, side by
side.

Every (method, seed) run trains from the same warm-up checkpoint on the same questions, is evaluated
on the world's test split (and the mini benchmarks), and is marked done; ``results.md`` and
``curves.png`` aggregate the finished runs. Resumable run by run. The protocol and the method names:
docs/runs.md, "A comparison".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hindsearch.isolated import run_isolated, stopped_on_exit
from hindsearch.study.results import (MINI_BENCHMARKS, WORLD, eval_numbers, median_step_time,
                                      run_name, write_outputs, zero_advantage_share)

METHOD_ALIASES: dict[str, list[str]] = {
    "grpo": ["method=grpo"],
    "hindsearch": ["method=hindsearch", "hindsearch.judge_sees_gold=true"],
    "hindsearch-nogold": ["method=hindsearch", "hindsearch.judge_sees_gold=false"],
    "hindsearch-shuffled": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                            "hindsearch.critique_source=shuffled"],
    "hindsearch-live": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                        "hindsearch.teacher=live"],
    "hindsearch-ema": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                       "hindsearch.teacher=ema"],
    "hindsearch-onesided": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                            "hindsearch.divergence=one_sided"],
    "hindsearch-onesided-nogold": ["method=hindsearch", "hindsearch.judge_sees_gold=false",
                                   "hindsearch.divergence=one_sided"],
    "hindsearch-onesided-shuffled": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                                     "hindsearch.critique_source=shuffled",
                                     "hindsearch.divergence=one_sided"],
    "hindsearch-onesided-answer": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                                   "hindsearch.divergence=one_sided",
                                   "hindsearch.distill_on=answer_decision"],
    "hindsearch-onesided-answer-nogold": ["method=hindsearch", "hindsearch.judge_sees_gold=false",
                                          "hindsearch.divergence=one_sided",
                                          "hindsearch.distill_on=answer_decision"],
    "hindsearch-ready": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                         "hindsearch.ready_states=answer_now"],
    "hindsearch-ready-line": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                              "hindsearch.ready_states=answer_line"],
    "hindsearch-ready-shuffled": ["method=hindsearch", "hindsearch.judge_sees_gold=true",
                                  "hindsearch.ready_states=answer_now",
                                  "hindsearch.critique_source=shuffled"],
    "igsd": ["method=igsd"],
    "igsd-paper": ["method=igsd", "igsd.utility_state=query", "igsd.proposals=any",
                   "igsd.gate=positive_sigmoid"],
    "igsd-group": ["method=igsd", "igsd.hindsight=group"],
    "igsd-critique": ["method=igsd", "igsd.hindsight=critique"],
    "igsd-nogate": ["method=igsd", "igsd.gate=none"],
    "hindsearch+igsd": ["method=hindsearch+igsd"],
}


# --------------------------------------------------------------------------- planning
def parse_methods(text: str) -> list[str]:
    """Comma list of method names: an alias, or a registered method (a plugin's too, once the config
    that names the plugin is loaded); raises ``ValueError`` naming the bad one."""
    from hindsearch.hindsight.registry import METHODS

    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise ValueError("--methods is empty")
    for m in methods:
        if m not in METHOD_ALIASES and m not in METHODS:
            raise ValueError(f"--methods: unknown method {m!r}; choose from "
                             f"{', '.join(METHOD_ALIASES)} or a registered method "
                             f"({', '.join(METHODS)})")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--methods lists a method twice: {text!r}")
    return methods


def parse_steps(text: str) -> list[int]:
    """``--eval-at``: a comma list of positive steps ('' = none); raises ``ValueError`` naming a bad
    one."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--eval-at must be a comma list of steps >= 1, got {part!r}")
        out.append(int(part))
    return sorted(set(out))


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: a comma list of distinct integers; raises ``ValueError`` naming a bad or
    repeated one."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as e:
        raise ValueError(f"--seeds must be a comma list of integers, got {text!r}") from e
    if not seeds:
        raise ValueError("--seeds is empty")
    if twice := sorted({s for s in seeds if seeds.count(s) > 1}):
        raise ValueError(f"--seeds lists seed {twice[0]} twice ({text!r}): each seed is one run")
    return seeds


def check_eval_at(eval_at: Sequence[int], steps: int) -> None:
    """``--eval-at`` steps must lie within the runs' ``steps``; raises ``ValueError`` naming the
    first past it."""
    if past := [n for n in sorted(eval_at) if n > steps]:
        raise ValueError(f"--eval-at {past[0]}: past the last step of each run (train.steps = "
                         f"{steps}); give steps up to {steps} or raise --steps")


def run_overrides(method: str, seed: int, run_dir: Path, init_model: str | None,
                  base: Sequence[str]) -> list[str]:
    """Config overrides of one run: the user's, the method's, the seed, the folder and the shared
    initial model."""
    ov = list(base) + METHOD_ALIASES.get(method, [f'method="{method}"'])
    ov += [f"train.seed={seed}", f'out="{run_dir.as_posix()}"']
    if init_model is not None:
        ov += [f'model.name="{Path(init_model).as_posix()}"', "warmup.enabled=false"]
    return ov


def run_state(run_dir: Path) -> str:
    """``done`` (evaluated), ``trained`` (summary written, not evaluated), ``partial`` (has a
    checkpoint) or ``new``."""
    if (run_dir / "done.json").exists():
        return "done"
    if (run_dir / "summary.json").exists() and (run_dir / "final").is_dir():
        return "trained"
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("checkpoint-*")):
        return "partial"
    return "new"


# --------------------------------------------------------------------------- running
def shared_warmup(cfg: Any, out_dir: Path, log: Any = print) -> str | None:
    """Warm the preset's model up once (cached) and return the checkpoint every run starts from.

    Returns None when the preset disables the warm-up (runs then start from the preset's model).
    """
    if not cfg.warmup.enabled:
        return None
    rec = out_dir / "init.json"
    if rec.exists():
        recorded = json.loads(rec.read_text())
        if Path(recorded["init_model"], "config.json").exists():
            _warn_other_kernels(recorded, rec, log)
            return recorded["init_model"]
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.inputs import prepare
    from hindsearch.train.warmup import ensure_warmup

    setup = prepare(cfg)
    model, tok = load_policy(cfg.model)
    t0 = time.time()
    wdir = ensure_warmup(cfg, model, tok, setup.retriever, setup.train, cache_dir() / "warmup")
    log(f"shared warm-up checkpoint: {wdir} ({time.time() - t0:.0f}s)")
    import torch

    from hindsearch.models import weights_digest

    rec.write_text(json.dumps({"init_model": str(wdir), "model": cfg.model.name,
                               "warmup_seed": cfg.train.seed, "sha256": weights_digest(wdir),
                               "threads": torch.get_num_threads(),
                               # other kernels round differently; the CPU model and the library
                               # versions are in the folder's marker (provenance)
                               "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                               "cpu_pins": {k: os.environ.get(k) for k in CPU_PINS}}))
    return str(wdir)


CPU_PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")
"""Environment variables that choose the CPU code paths the start's weights depend on: torch's
vectorised kernels and MKL's matrix products each pick a path by CPU (20 training steps of a small
Llama came out with other weights under each); ``init.json`` records them beside the kernel set."""


def _warn_other_kernels(recorded: dict[str, Any], rec: Path, log: Any) -> None:
    """Say so when the start was built with another CPU kernel set than this process': its runs and
    runs trained here then differ bit for bit. ``ATEN_CPU_CAPABILITY`` (read by torch at start-up)
    chooses the set."""
    import torch

    built, here = recorded.get("cpu_capability"), torch.backends.cpu.get_cpu_capability()
    if built and built != here:
        log(f"warning: {rec} was built with torch's {built} CPU kernels and this process runs "
            f"{here}: runs trained here are not bit for bit the ones trained there "
            f"(ATEN_CPU_CAPABILITY={built.lower()} chooses the "
            f"kernels, where this CPU has them)")


def eval_sets(cfg: Any, mini: str | None, test_limit: int | None,
              mini_limit: int | None) -> list[tuple[str, list, Any]]:
    """``[(name, records, index_dir)]``: the world test split and, with ``mini``, the seven mini
    benchmarks."""
    from hindsearch.data.qa import load_qa
    from hindsearch.inputs import resolve_data

    paths = resolve_data(cfg)
    test_path = Path(cfg.data.test) if cfg.data.test else Path(paths["world"]) / "test.jsonl"
    sets = [(WORLD, load_qa(test_path)[:test_limit] if test_limit else load_qa(test_path),
             paths["index_dir"])]
    if mini:
        from hindsearch.retrieval.factory import ensure_index

        md = Path(mini)
        if not (md / "corpus.jsonl").exists():
            raise FileNotFoundError(f"--mini {md}: no corpus.jsonl (build it with: hindsearch data "
                                    f"mini --out {md})")
        index = ensure_index(md / "corpus.jsonl", md / f"index-{cfg.retrieval.kind}",
                             kind=cfg.retrieval.kind)
        for b in MINI_BENCHMARKS:
            f = md / f"{b}.jsonl"
            if not f.exists():
                raise FileNotFoundError(f"--mini {md}: {f.name} missing")
            recs = load_qa(f)
            sets.append((b, recs[:mini_limit] if mini_limit else recs, index))
    return sets


def evaluate_run(run_dir: Path, cfg: Any, sets: Sequence[tuple[str, list, Any]],
                 model_dir: Path | None = None, tag: str = "",
                 loaded: tuple[Any, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Greedy evaluation of ``model_dir`` (default ``run_dir/final``; ``loaded``: its model and
    tokenizer, when the caller has them) on every set (each with its own retriever), into
    ``run_dir/eval/test-<set><tag>``."""
    from dataclasses import replace

    from hindsearch.eval import evaluate
    from hindsearch.models import load_policy
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.inputs import eval_engine

    model, tok = loaded or load_policy(replace(cfg.model, name=str(model_dir or run_dir / "final"),
                                               gguf_file=None))
    out: dict[str, dict[str, Any]] = {}
    for name, records, index_dir in sets:
        retriever = load_retriever(cfg.retrieval, index_dir)
        engine = eval_engine(cfg, model, tok, retriever)
        res = evaluate(engine, {name: records}, out_dir=run_dir / "eval" / f"test-{name}{tag}",
                       batch_size=cfg.eval.batch_size)
        out.update(eval_numbers(res, [name]))
    return out


def _starting_point(base_cfg: Any, out_dir: Path, mini: str | None, test_limit: int | None,
                    mini_limit: int | None, probe: int, log: Any, states: int = 0) -> str | None:
    """Every run's initial model (the shared warm-up, else None: the preset's), once the evaluation
    sets load (the mini index built) and, with ``probe``, the start is probed."""
    from hindsearch.models import torch_threads

    # the start's weights depend on the thread count: one count, any machine
    with torch_threads(START_THREADS):
        init = shared_warmup(base_cfg, out_dir, log)
    # fail fast (and build the mini index) here
    eval_sets(base_cfg, mini, test_limit, mini_limit or base_cfg.eval.limit)
    if probe > 0 and not (out_dir / "probe.json").exists():
        from hindsearch.study.probe import probe_checkpoint

        probe_checkpoint(base_cfg, init, n=probe, out=out_dir, log=log)
    if states > 0 and not (out_dir / STATES_NAME).exists():
        from hindsearch.study.sampled import save_states

        save_states(base_cfg, init, eval_sets(base_cfg, None, None, None)[0],
                    out_dir / STATES_NAME, states, log)
    return init


STATES_NAME = "states.json"
START_THREADS = 1
"""Torch threads the shared start (the warm-up) is built with, whatever the machine: with another
count the same preset gives other weights (``models.torch_threads``); ``init.json`` records the
count and the weights' digest."""


def _runs_to_do(out_dir: Path, methods: Sequence[str],
                seeds: Sequence[int], log: Any) -> Iterator[tuple[str, int, Path, str]]:
    """``(method, seed, run dir, run_state)`` of each unfinished run in order, its state read when
    its turn comes (a finished run is logged as skipped)."""
    for m in methods:
        for s in seeds:
            rd = out_dir / run_name(m, s)
            state = run_state(rd)
            if state == "done":
                log(f"{rd.name}: finished, skipped")
                continue
            yield m, s, rd, state


def run_compare(config: str, methods: Sequence[str], seeds: Sequence[int], out: str | Path,
                steps: int | None = None, overrides: Sequence[str] = (), mini: str | None = None,
                test_limit: int | None = None, mini_limit: int | None = None, log: Any = print,
                isolate: bool = True, jobs: int = 1, probe: int = 0, sampled: int = 0,
                states: int = 0, eval_at: Sequence[int] = ()) -> str:
    """Train and evaluate every (method, seed), resumably; returns the results markdown.

    ``isolate`` (default) runs each (method, seed) in a fresh spawned process: models, trainer and
    framework state are freed when it exits (in one process, memory grew by ~1.5 GB per SmolLM2 run,
    to 12 GB after seven), and a crash names the run that failed. ``jobs > 1`` runs that many of
    them at once. Every run trains with the torch thread count recorded with the start
    (``run_threads``: 1), whatever ``jobs`` is. ``probe > 0`` first probes the starting checkpoint
    on that many failed training rollouts (``DIR/probe.json``, quoted in the results), and each
    run's final checkpoint after its evaluation (``RUN/probe.json``, summarised in the results).
    ``sampled > 0`` also draws that many samples per test question of each run, and ``states > 0``
    measures each run on that many held-out failed states of the start
    (``hindsearch.study.sampled``; the paired tables against GRPO and the matching controls).
    ``eval_at`` also evaluates each run greedily on the world test split after those steps
    (``train.keep_steps``): EM along the way, for sample efficiency.
    """
    from hindsearch.fsutil import FolderLock, guard_output

    # a comparison writes only into a new or empty folder or one of its own (compare.json: written
    # before markers)
    out_dir = guard_output(out, "compare")
    if eval_at:  # refused before the folder is made
        from hindsearch.config import Config

        check_eval_at(eval_at,
                      steps if steps is not None else Config.load(config, overrides).train.steps)
    args = (config, methods, seeds, out_dir, steps, overrides, mini, test_limit, mini_limit, log,
            isolate, jobs, probe, sampled, states, eval_at)
    # a second compare here: one line, before any run
    with FolderLock(out_dir, "comparison folder", log=log):
        return _compare(*args)


def _compare(config: str, methods: Sequence[str], seeds: Sequence[int], out_dir: Path,
             steps: int | None, overrides: Sequence[str], mini: str | None, test_limit: int | None,
             mini_limit: int | None, log: Any, isolate: bool, jobs: int, probe: int, sampled: int,
             states: int, eval_at: Sequence[int]) -> str:
    """``run_compare`` in its folder, once it holds the folder's lock."""
    from hindsearch.config import Config

    from hindsearch.fsutil import claim_output, output_kind

    base_ov = list(overrides) + ([f"train.steps={steps}"] if steps is not None else [])
    if eval_at:
        base_ov.append(f"train.keep_steps=[{', '.join(str(int(x)) for x in sorted(set(eval_at)))}]")
    # the shared start (warm-up, held-out states, probe) is the preset's, built with its own
    # train.seed whichever seeds are listed: '--seeds 1,2' must extend a '--seeds 0' comparison, not
    # start from another checkpoint
    from hindsearch.hindsight.registry import resolve_methods

    base_cfg = resolve_methods(Config.load(config, base_ov))
    check_model_built(config, base_cfg.model.name)
    for m in methods:  # every run's config validates before anything trains
        for s in seeds:
            ov = run_overrides(m, s, out_dir / run_name(m, s), None, base_ov)
            resolve_methods(Config.load(config, ov))
    if output_kind(out_dir) is None:
        claim_output(out_dir, "compare")
    (out_dir / "compare.json").write_text(json.dumps(
        {"config": config, "methods": list(methods), "seeds": list(seeds), "steps": steps,
         "overrides": base_ov, "mini": mini, "test_limit": test_limit, "mini_limit": mini_limit},
        indent=1))
    init = _starting_point(base_cfg, out_dir, mini, test_limit, mini_limit, probe, log, states)
    threads = run_threads(out_dir)
    if isolate and jobs > 1:
        pending = [((config, m, s, str(rd), init, list(base_ov), mini, test_limit, mini_limit,
                     sampled, list(eval_at), probe), rd.name)
                   for m, s, rd, _ in _runs_to_do(out_dir, methods, seeds, log)]
        failed = _run_parallel(
            _one_run, pending, jobs,
            lambda: write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg)), log,
            threads)
        if failed:
            raise RuntimeError(f"{', '.join(failed)} failed (tracebacks above). Rerun the same "
                               f"command to resume: finished runs are kept.")
        return write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg))
    for m, s, rd, state in _runs_to_do(out_dir, methods, seeds, log):
        cfg = Config.load(config, run_overrides(m, s, rd, init, base_ov))
        log(f"{rd.name}: resuming from its last checkpoint" if state == "partial" else
            f"{rd.name}: training {cfg.train.steps} steps" if state == "new"
            else f"{rd.name}: evaluating")
        job = (config, m, s, str(rd), init, list(base_ov), mini, test_limit, mini_limit, sampled,
               list(eval_at), probe, threads)
        if isolate:
            code = run_isolated(_one_run, job, rd.name)
            if code != 0:
                raise RuntimeError(f"{rd.name} failed (exit code {code}; its traceback is printed "
                                   "above). Rerun the same command to resume: finished runs are "
                                   "kept.")
        else:
            _one_run(*job)
        write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg))
    return write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg))


def check_model_built(config: str, name: str) -> None:
    """Refuse, in one line that says how to build it, a preset whose ``model.name`` is a local
    folder that does not exist yet (a research rig's model, built by a ``build.py`` beside the
    preset, e.g. ``recipes/micro``)."""
    from hindsearch.models import SMOLLM2_ALIAS, TINY_ALIAS

    p = Path(name)
    # org/model: the loader says what it is
    hub_like = len(p.parts) == 2 and not name.startswith((".", "/"))
    if name in (SMOLLM2_ALIAS, TINY_ALIAS) or p.exists() or hub_like or len(p.parts) < 2:
        return
    build = Path(config).parent / "build.py"
    how = (f"build it first: python {build} --config {config} --out {name}" if build.is_file()
           else "train or download it there first, or name another model")
    raise FileNotFoundError(f"model.name = {name!r} (from {config}) is a model folder that does "
                            f"not exist yet; {how}")


def run_threads(out_dir: Path) -> int:
    """Torch threads every run of a comparison trains with: the count recorded with its start
    (``init.json``), whatever ``--jobs`` is, so a run's weights do not depend on the machine's core
    count or on how many ran beside it."""
    rec = out_dir / "init.json"
    if rec.exists():
        n = json.loads(rec.read_text()).get("threads")
        if isinstance(n, int) and n > 0:
            return n
    return START_THREADS


def _run_parallel(target: Any, pending: Sequence[tuple[tuple, str]], jobs: int, finished: Any,
                  log: Any, threads: int = START_THREADS) -> list[str]:
    """``target(*args, threads=...)`` (``_one_run``) of every ``(args, name)``, ``jobs`` at a time,
    each in a fresh spawned process with ``threads`` torch threads; ``finished()`` after each run
    that succeeds (results.md stays current). Returns the names that failed, each reported with its
    traceback as it fails. Stopping the parent (Ctrl-C, SIGTERM) stops every run (they resume from
    their checkpoints next time)."""
    import multiprocessing as mp
    import traceback
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = mp.get_context("spawn")
    queue, running, failed = list(pending), {}, []
    with stopped_on_exit() as procs:
        try:
            while queue or running:
                while queue and len(running) < jobs:  # a run starts when a slot is free
                    args, name = queue.pop(0)
                    # a pool of one per run: a worker killed from outside (out of memory) breaks its
                    # own run only
                    pool = ProcessPoolExecutor(1, mp_context=ctx)
                    running[pool.submit(target, *args, threads=threads)] = (name, pool)
                    log(f"{name}: started ({threads} thread{'s' if threads > 1 else ''})")
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    name, pool = running.pop(fut)
                    pool.shutdown()
                    if (exc := fut.exception()) is not None:
                        failed.append(name)
                        traceback.print_exception(exc)  # with the run's own traceback (its cause)
                        log(f"{name}: failed ({type(exc).__name__}: {exc})")
                    else:
                        log(f"{name}: done")
                        finished()
        except BaseException:
            # the runs' workers: terminated on leaving stopped_on_exit
            procs.extend(mp.active_children())
            for _, pool in running.values():
                pool.shutdown(wait=False, cancel_futures=True)
            raise
    return failed


def _one_run(config: str, method: str, seed: int, run_dir: str, init: str | None,
             base_ov: list[str], mini: str | None, test_limit: int | None, mini_limit: int | None,
             sampled: int = 0, eval_at: Sequence[int] = (), probe: int = 0,
             threads: int | None = None) -> None:
    """Train (or resume, or only evaluate) one (method, seed) and write its ``results.json`` and
    ``done.json``; ``probe > 0`` also probes its final checkpoint (``run_dir/probe.json``, as the
    start's)."""
    from hindsearch.config import Config
    from hindsearch.train.run import run_train

    if threads:
        import torch

        torch.set_num_threads(threads)

    rd = Path(run_dir)
    cfg = Config.load(config, run_overrides(method, seed, rd, init, base_ov))
    state = run_state(rd)
    t0 = time.time()
    # the count compare chose (threads) stays: run_train would choose its own without it
    if state == "partial":
        run_train(None, resume=rd, threads=threads)
    elif state == "new":
        run_train(cfg, threads=threads)
    sets = eval_sets(Config.load(config, base_ov), mini, test_limit, mini_limit or cfg.eval.limit)
    from dataclasses import replace

    from hindsearch.models import load_policy

    # once, for every measurement
    final = load_policy(replace(cfg.model, name=str(rd / "final"), gguf_file=None))
    numbers = evaluate_run(rd, cfg, sets, loaded=final)
    if sampled > 0 or (rd.parent / STATES_NAME).exists():
        from hindsearch.study.sampled import measure_run

        measure_run(rd, cfg, sets[0], sampled, seed, rd.parent / STATES_NAME, loaded=final)
    curve = {str(n): evaluate_run(rd, cfg, sets[:1], rd / "steps" / f"step-{n}",
                                  f"-step-{n}")[WORLD]
             for n in sorted(set(eval_at)) if n < cfg.train.steps
             and (rd / "steps" / f"step-{n}" / "config.json").exists()}
    if eval_at and WORLD in numbers:
        curve[str(cfg.train.steps)] = numbers[WORLD]
    if probe > 0 and not (rd / "probe.json").exists():
        from hindsearch.study.probe import probe_checkpoint

        probe_checkpoint(cfg, str(rd / "final"), n=probe, out=rd, log=lambda *_: None, loaded=final)
    from hindsearch.provenance import provenance

    start = rd.parent / "init.json"
    res = {"method": method, "seed": seed, "steps": cfg.train.steps, "benchmarks": numbers,
           "curve": curve, "step_s": median_step_time(rd), "zero_adv": zero_advantage_share(rd),
           "init_model": init, "train_seconds": time.time() - t0,
           # what rebuilds this run: the code and the start it trained from (a lost seed is rerun,
           # never dropped)
           "hindsearch": provenance()["hindsearch"],
           "start_sha256": json.loads(start.read_text()).get("sha256") if start.exists() else None,
           "threads": threads}
    (rd / "results.json").write_text(json.dumps(res, indent=1))
    (rd / "done.json").write_text(json.dumps({"finished": time.strftime("%Y-%m-%dT%H:%M:%S")}))


def _title(config: str, cfg: Any) -> str:
    judge = f", judge {cfg.hindsearch.judge_kind}"
    return (f"hindsearch compare: {Path(config).name} (model {Path(cfg.model.name).name}{judge}, "
            f"{cfg.train.steps} steps)")
