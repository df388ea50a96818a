"""``hindsearch compare``: GRPO vs HindSearch (with / without gold) vs IGSD, side by side.

Protocol (only the method differs between runs):

1. one protocol warm-up of the preset's model (``warmup.ensure_warmup`` with the warm-up seed,
   cached), whose checkpoint is the **same initial model** of every (method, seed) run;
2. each (method, seed) trains ``train.steps`` RL steps with ``train.seed = seed`` (same questions in
   the same order for every method of a seed) into ``DIR/<method>-s<seed>/`` via ``run_train``;
3. each trained model is evaluated greedily on the world's test split (EM overall and by hop
   count) and, with ``--mini DIR``, on the seven mini benchmarks (their own BM25 index over the
   mini-wiki); the numbers go to ``<run>/results.json`` and a ``<run>/done.json`` marks it finished;
4. ``DIR/results.md``: method x benchmark, mean ± std over seeds (n seeds), the median step time
   and its ratio to GRPO; ``DIR/curves.png``: training reward (moving average) and dev EM (before
   and after RL) against steps, one line per method (mean over seeds).

Resumable: finished runs (``done.json``) are skipped; an interrupted run resumes from its last
checkpoint (``run_train(resume=...)``); a run trained but not yet evaluated is only evaluated.

Method aliases: ``hindsearch-nogold`` = ``hindsearch`` with ``hindsearch.judge_sees_gold = false``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

METHOD_ALIASES: dict[str, list[str]] = {
    "grpo": ["method=grpo"],
    "hindsearch": ["method=hindsearch", "hindsearch.judge_sees_gold=true"],
    "hindsearch-nogold": ["method=hindsearch", "hindsearch.judge_sees_gold=false"],
    "igsd": ["method=igsd"],
    "hindsearch+igsd": ["method=hindsearch+igsd"],
}
MINI_BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
WORLD = "world"


# --------------------------------------------------------------------------- planning
def parse_methods(text: str) -> list[str]:
    """Comma list of method names (aliases allowed); raises ``ValueError`` naming the bad one."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if not methods:
        raise ValueError("--methods is empty")
    for m in methods:
        if m not in METHOD_ALIASES:
            raise ValueError(f"--methods: unknown method {m!r}; choose from {', '.join(METHOD_ALIASES)}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--methods lists a method twice: {text!r}")
    return methods


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as e:
        raise ValueError(f"--seeds must be a comma list of integers, got {text!r}") from e
    if not seeds:
        raise ValueError("--seeds is empty")
    return seeds


def run_name(method: str, seed: int) -> str:
    return f"{method}-s{seed}"


def run_overrides(method: str, seed: int, run_dir: Path, init_model: str | None, base: Sequence[str]) -> list[str]:
    """Config overrides of one run: the user's, the method's, the seed, the folder and the shared initial model."""
    ov = list(base) + METHOD_ALIASES[method] + [f"train.seed={seed}", f'out="{run_dir.as_posix()}"']
    if init_model is not None:
        ov += [f'model.name="{Path(init_model).as_posix()}"', "warmup.enabled=false"]
    return ov


def run_state(run_dir: Path) -> str:
    """``done`` (evaluated), ``trained`` (summary written, not evaluated), ``partial`` (has a checkpoint) or ``new``."""
    if (run_dir / "done.json").exists():
        return "done"
    if (run_dir / "summary.json").exists() and (run_dir / "final").is_dir():
        return "trained"
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("checkpoint-*")):
        return "partial"
    return "new"


# --------------------------------------------------------------------------- evaluation numbers
def bench_numbers(res: Any) -> dict[str, Any]:
    """``{"em", "em_1hop", "em_2hop", "n"}`` from one benchmark's entry of an ``evaluate`` result (tolerant)."""
    if not isinstance(res, dict):
        return {}
    from hindsearch.eval import bench_row

    return bench_row(res)


def eval_numbers(result: dict[str, Any], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-benchmark numbers from ``evaluate``'s return value (``{name: {...}}`` or ``{"benchmarks": {...}}``)."""
    table = result.get("benchmarks", result) if isinstance(result, dict) else {}
    return {n: bench_numbers(table.get(n)) for n in names if n in table}


def median_step_time(run_dir: Path) -> float | None:
    """Median ``time/step`` (seconds) over the run's metrics rows."""
    vals = []
    p = run_dir / "metrics.jsonl"
    if p.exists():
        for line in p.read_text().splitlines():
            if line.strip():
                v = json.loads(line).get("time/step")
                if isinstance(v, (int, float)):
                    vals.append(float(v))
    return statistics.median(vals) if vals else None


# --------------------------------------------------------------------------- aggregation
def columns(benchmarks: Sequence[str]) -> list[tuple[str, str, str]]:
    """Table columns ``(header, benchmark, key)``: world EM, 1-hop, 2-hop, then each mini benchmark, then the mini average."""
    cols = []
    if WORLD in benchmarks:
        cols += [("world EM", WORLD, "em"), ("world 1-hop", WORLD, "em_1hop"), ("world 2-hop", WORLD, "em_2hop")]
    cols += [(b, b, "em") for b in benchmarks if b != WORLD]
    if any(b != WORLD for b in benchmarks):
        cols.append(("mini avg", "__mini_avg__", "em"))
    return cols


def mean_spread(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def aggregate(results: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: ``{column header: (mean, std, n)}`` over seeds plus ``step_s``; ``results`` are ``results.json`` dicts."""
    benches = bench_names(results)
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        rs = [r for r in results if r.get("method") == m]
        row: dict[str, Any] = {"seeds": sorted(r.get("seed") for r in rs)}
        for header, bench, key in columns(benches):
            vals = []
            for r in rs:
                b = r.get("benchmarks", {})
                if bench == "__mini_avg__":
                    ems = [b[x]["em"] for x in b if x != WORLD and b[x].get("em") is not None]
                    v = sum(ems) / len(ems) if ems else None
                else:
                    v = b.get(bench, {}).get(key)
                if v is not None:
                    vals.append(float(v))
            row[header] = (*mean_spread(vals), len(vals)) if vals else None
        steps = [r["step_s"] for r in rs if r.get("step_s") is not None]
        row["step_s"] = statistics.median(steps) if steps else None
        out[m] = row
    return out


def _bench_order(b: str) -> tuple[int, str]:
    if b == WORLD:
        return (0, b)
    return (1 + MINI_BENCHMARKS.index(b), b) if b in MINI_BENCHMARKS else (99, b)


def results_rows(agg: dict[str, dict[str, Any]], benches: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table: EM x100 as ``mean ± std`` over seeds (one seed: the mean alone),
    the median step time and its ratio to GRPO (``-`` where not recorded)."""
    cols = columns(sorted(benches, key=_bench_order))
    heads = ["method", "seeds"] + [c[0] for c in cols] + ["step s", "vs GRPO"]
    base = agg.get("grpo", {}).get("step_s")
    rows = []
    for m, row in agg.items():
        cells = [m, str(len(row["seeds"]))]
        for header, _, _ in cols:
            v = row.get(header)
            # one seed has no spread: print the mean alone rather than a misleading "± 0.0"
            cells.append("-" if v is None else f"{100 * v[0]:.1f} ± {100 * v[1]:.1f}" if v[2] > 1 else f"{100 * v[0]:.1f}")
        st = row.get("step_s")
        cells.append("-" if st is None else f"{st:.1f}")
        cells.append("-" if st is None or not base else f"{st / base:.2f}x")
        rows.append(cells)
    return heads, rows


RESULTS_NOTE = ("EM in %, mean ± sample std over seeds (the seeds column gives n; one seed: the mean alone). Step time: "
                "median seconds per optimizer step (rollout + reward + hindsight prepare + update), ratio to GRPO.")


def results_markdown(agg: dict[str, dict[str, Any]], benches: Sequence[str], title: str = "") -> str:
    """The results table (``results_rows``) as markdown."""
    heads, rows = results_rows(agg, benches)
    lines = ([f"# {title}", ""] if title else []) + ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines + ["", RESULTS_NOTE]) + "\n"


def load_results(out_dir: Path, methods: Sequence[str], seeds: Sequence[int],
                 bad: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``results.json`` of every finished (method, seed) run of a comparison folder. An unreadable one
    raises ``ValueError`` naming it, or with ``bad`` given is skipped and reported there as ``file: reason``."""
    out = []
    for p in (out_dir / run_name(m, s) / "results.json" for m in methods for s in seeds):
        if not p.exists():
            continue
        try:
            res = json.loads(p.read_text())
            if not isinstance(res, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if bad is None:
                raise ValueError(f"{p}: unreadable ({e}); delete it and its done.json to evaluate the run again") from e
            bad.append(f"{p}: {e}")
            continue
        out.append(res)
    return out


def bench_names(results: Sequence[dict[str, Any]]) -> list[str]:
    """The benchmarks any of ``results`` evaluated, world first, then the mini benchmarks in their order."""
    return sorted({b for r in results for b in r.get("benchmarks", {})}, key=_bench_order)


def pick_reward(row: dict[str, Any]) -> float:
    """Mean rollout reward of a metrics row (our ``rollout/reward_mean``, else TRL's ``reward``)."""
    for k in ("rollout/reward_mean", "reward_mean", "reward"):
        if isinstance(row.get(k), (int, float)):
            return float(row[k])
    return 0.0


def moving_average(xs: Sequence[float], w: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= w:
            acc -= xs[i - w]
        out.append(acc / min(i + 1, w))
    return out


def dev_curve(run_dir: Path) -> list[tuple[int, float]]:
    """Dev EM against step of one run: the base evaluation (step 0), ``dev_curve.jsonl`` (every
    ``train.eval_steps``) and the evaluation after RL (at ``steps``); missing parts are left out."""
    pts: dict[int, float] = {}
    summ = run_dir / "summary.json"
    d = json.loads(summ.read_text()) if summ.exists() else {}
    dev = d.get("dev", {})
    if (dev.get("base") or {}).get("em") is not None:
        pts[0] = float(dev["base"]["em"])
    cur = run_dir / "dev_curve.jsonl"
    for line in cur.read_text().splitlines() if cur.exists() else []:
        if line.strip():
            row = json.loads(line)
            if row.get("em") is not None:
                pts[int(row["step"])] = float(row["em"])
    if (dev.get("rl") or {}).get("em") is not None and d.get("steps") is not None:
        pts[int(d["steps"])] = float(dev["rl"]["em"])
    return sorted(pts.items())


def plot_curves(out_dir: Path, methods: Sequence[str], seeds: Sequence[int], path: Path, window: int = 10) -> Path:
    """``curves.png``: training reward (moving average) and dev EM (``dev_curve``) vs step, mean over seeds
    (dev EM at the steps every seed evaluated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for m in methods:
        per_seed, curves = [], []
        for s in seeds:
            rd = out_dir / run_name(m, s)
            rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines() if x.strip()] \
                if (rd / "metrics.jsonl").exists() else []
            rew = [float(pick_reward(r)) for r in rows]
            if rew:
                per_seed.append(rew)
            c = dict(dev_curve(rd))
            if c:
                curves.append(c)
        if per_seed:
            n = min(len(r) for r in per_seed)
            mean = [sum(r[i] for r in per_seed) / len(per_seed) for i in range(n)]
            ax1.plot(range(1, n + 1), moving_average(mean, window), label=m)
        if curves:
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            ax2.plot(steps, [sum(c[t] for c in curves) / len(curves) for t in steps], marker="o", label=m)
    ax1.set(title=f"training reward (moving avg {window})", xlabel="step", ylabel="reward")
    ax2.set(title="dev EM (greedy)", xlabel="step", ylabel="EM")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_outputs(out_dir: Path, methods: Sequence[str], seeds: Sequence[int], title: str = "") -> str:
    """Aggregate the finished runs of ``out_dir`` into ``results.md`` and ``curves.png``; returns the markdown."""
    results = load_results(out_dir, methods, seeds)
    md = results_markdown(aggregate(results, methods), bench_names(results), title)
    from hindsearch.paired import bootstrap_markdown

    boot = bootstrap_markdown(lambda m, seed: out_dir / run_name(m, seed), methods, seeds)
    if boot:
        md += "\n" + boot
    if (out_dir / "probe.json").exists():
        from hindsearch.hindsight.probe import format_probe

        md += "\n### Teacher probes of the starting checkpoint\n\n" + format_probe(json.loads((out_dir / "probe.json").read_text())) + "\n"
    (out_dir / "results.md").write_text(md)
    plot_curves(out_dir, methods, seeds, out_dir / "curves.png")
    return md


# --------------------------------------------------------------------------- running
def shared_warmup(cfg: Any, out_dir: Path, log: Any = print) -> str | None:
    """Warm the preset's model up once (cached) and return the checkpoint every run starts from.

    Returns None when the preset disables the warm-up (runs then start from the preset's model).
    """
    if not cfg.warmup.enabled:
        return None
    rec = out_dir / "init.json"
    if rec.exists():
        path = json.loads(rec.read_text())["init_model"]
        if Path(path, "config.json").exists():
            return path
    from hindsearch.models import cache_dir, load_policy
    from hindsearch.retrieval.factory import load_retriever
    from hindsearch.train.run import load_records, resolve_data
    from hindsearch.train.warmup import ensure_warmup

    paths = resolve_data(cfg)
    train, _ = load_records(cfg, paths)
    retriever = load_retriever(cfg.retrieval, paths["index_dir"])
    model, tok = load_policy(cfg.model)
    t0 = time.time()
    wdir = ensure_warmup(cfg, model, tok, retriever, train, cache_dir() / "warmup")
    log(f"shared warm-up checkpoint: {wdir} ({time.time() - t0:.0f}s)")
    rec.write_text(json.dumps({"init_model": str(wdir), "model": cfg.model.name, "warmup_seed": cfg.train.seed}))
    return str(wdir)


def eval_sets(cfg: Any, mini: str | None, test_limit: int | None, mini_limit: int | None) -> list[tuple[str, list, Any]]:
    """``[(name, records, index_dir)]``: the world test split and, with ``mini``, the seven mini benchmarks."""
    from hindsearch.data.qa import load_qa
    from hindsearch.train.run import resolve_data

    paths = resolve_data(cfg)
    test_path = Path(cfg.data.test) if cfg.data.test else Path(paths["world"]) / "test.jsonl"
    sets = [(WORLD, load_qa(test_path)[:test_limit] if test_limit else load_qa(test_path), paths["index_dir"])]
    if mini:
        from hindsearch.retrieval.factory import ensure_index

        md = Path(mini)
        if not (md / "corpus.jsonl").exists():
            raise FileNotFoundError(f"--mini {md}: no corpus.jsonl (build it with: hindsearch data mini --out {md})")
        index = ensure_index(md / "corpus.jsonl", md / f"index-{cfg.retrieval.kind}", kind=cfg.retrieval.kind)
        for b in MINI_BENCHMARKS:
            f = md / f"{b}.jsonl"
            if not f.exists():
                raise FileNotFoundError(f"--mini {md}: {f.name} missing")
            recs = load_qa(f)
            sets.append((b, recs[:mini_limit] if mini_limit else recs, index))
    return sets


def evaluate_run(run_dir: Path, cfg: Any, sets: Sequence[tuple[str, list, Any]]) -> dict[str, dict[str, Any]]:
    """Greedy evaluation of ``run_dir/final`` on every set (each with its own retriever)."""
    from dataclasses import replace

    from hindsearch.agent.rollout import HFBackend, RolloutEngine
    from hindsearch.eval import evaluate
    from hindsearch.models import load_policy
    from hindsearch.retrieval.factory import load_retriever

    model, tok = load_policy(replace(cfg.model, name=str(run_dir / "final"), gguf_file=None))
    out: dict[str, dict[str, Any]] = {}
    for name, records, index_dir in sets:
        retriever = load_retriever(cfg.retrieval, index_dir)
        engine = RolloutEngine(model, tok, retriever, replace(cfg.rollout, backend="hf"), topk=cfg.retrieval.topk,
                               backend=HFBackend(model, tok))
        res = evaluate(engine, {name: records}, out_dir=run_dir / "eval" / f"test-{name}", batch_size=cfg.eval.batch_size)
        out.update(eval_numbers(res, [name]))
    return out


def run_compare(config: str, methods: Sequence[str], seeds: Sequence[int], out: str | Path, steps: int | None = None,
                overrides: Sequence[str] = (), mini: str | None = None, test_limit: int | None = None,
                mini_limit: int | None = None, log: Any = print, isolate: bool = True, jobs: int = 1,
                probe: int = 0) -> str:
    """Train and evaluate every (method, seed), resumably; returns the results markdown.

    ``isolate`` (default) runs each (method, seed) in a fresh spawned process: models, trainer and
    framework state are freed when it exits (in one process, memory grew by ~1.5 GB per SmolLM2 run,
    to 12 GB after seven), and a crash names the run that failed. ``jobs > 1`` runs that many of
    them at once, each with ``cpu_count // jobs`` torch threads (small models on a few cores: two
    one-thread runs do more steps per second than one two-thread run). ``probe > 0`` first probes the
    starting checkpoint on that many failed training rollouts (``DIR/probe.json``, quoted in the results).
    """
    from hindsearch.config import Config

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    base_ov = list(overrides) + ([f"train.steps={steps}"] if steps is not None else [])
    base_cfg = Config.load(config, base_ov + [f"train.seed={seeds[0]}"])
    for m in methods:  # every run's config validates before anything trains
        for s in seeds:
            Config.load(config, run_overrides(m, s, out_dir / run_name(m, s), None, base_ov))
    (out_dir / "compare.json").write_text(json.dumps(
        {"config": config, "methods": list(methods), "seeds": list(seeds), "steps": steps, "overrides": base_ov,
         "mini": mini, "test_limit": test_limit, "mini_limit": mini_limit}, indent=1))
    from hindsearch.micro import MICRO_ALIAS, resolve_alias

    alias = base_cfg.model.name == MICRO_ALIAS
    resolve_alias(base_cfg)  # the micro model is built (cached) before the warm-up
    init = shared_warmup(base_cfg, out_dir, log) or (base_cfg.model.name if alias else None)
    eval_sets(base_cfg, mini, test_limit, mini_limit or base_cfg.eval.limit)  # fail fast (and build the mini index) here
    if probe > 0 and not (out_dir / "probe.json").exists():
        from hindsearch.train.probe_cli import probe_checkpoint

        probe_checkpoint(base_cfg, init, n=probe, out=out_dir, log=log)
    if isolate and jobs > 1:
        pending = []
        for m in methods:
            for s in seeds:
                rd = out_dir / run_name(m, s)
                if run_state(rd) == "done":
                    log(f"{rd.name}: finished, skipped")
                    continue
                pending.append(((config, m, s, str(rd), init, list(base_ov), mini, test_limit, mini_limit), rd.name))
        failed = run_parallel(pending, jobs, log=log)
        if failed:
            raise RuntimeError(f"{', '.join(failed)} failed (tracebacks above). Rerun the same command to resume: "
                               f"finished runs are kept.")
        return write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg))
    for m in methods:
        for s in seeds:
            rd = out_dir / run_name(m, s)
            state = run_state(rd)
            if state == "done":
                log(f"{rd.name}: finished, skipped")
                continue
            cfg = Config.load(config, run_overrides(m, s, rd, init, base_ov))
            log(f"{rd.name}: resuming from its last checkpoint" if state == "partial" else
                f"{rd.name}: training {cfg.train.steps} steps" if state == "new" else f"{rd.name}: evaluating")
            job = (config, m, s, str(rd), init, list(base_ov), mini, test_limit, mini_limit)
            if isolate:
                code = run_isolated(_one_run, job, rd.name)
                if code != 0:
                    raise RuntimeError(f"{rd.name} failed (exit code {code}; its traceback is printed above). "
                                       f"Rerun the same command to resume: finished runs are kept.")
            else:
                _one_run(*job)
            write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg))
    return write_outputs(out_dir, methods, seeds, title=_title(config, base_cfg))


@contextmanager
def stopped_on_exit():
    """Yields a list to put child processes in; on leaving (normally, on an exception, or on SIGTERM, which
    is turned into ``SystemExit`` while inside) every child still alive is terminated, then killed after 30 s."""
    import signal

    def _term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        prev = signal.signal(signal.SIGTERM, _term)
    except ValueError:  # not the main thread: signals stay as they are
        prev = None
    procs: list[Any] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def run_isolated(target: Any, args: tuple, name: str, on_start: Any = None) -> int | None:
    """Run ``target(*args)`` in a spawned process and wait; returns its exit code.

    Stopping the parent (Ctrl-C or SIGTERM) stops the child too, so an interrupted comparison
    leaves no orphan training on the CPU (the run resumes from its checkpoint next time).
    ``on_start(pid)`` is called once the child runs.
    """
    import multiprocessing as mp

    with stopped_on_exit() as procs:
        proc = mp.get_context("spawn").Process(target=target, args=args, name=name)
        procs.append(proc)
        proc.start()
        if on_start is not None:
            on_start(proc.pid)
        proc.join()
        return proc.exitcode


def run_parallel(pending: Sequence[tuple[tuple, str]], jobs: int, log: Any = print) -> list[str]:
    """Run ``_one_run(*args)`` for every ``(args, name)`` in spawned processes, ``jobs`` at a time; each
    child gets ``cpu_count // jobs`` torch threads. Returns the names that failed. Stopping the parent
    (Ctrl-C, SIGTERM) stops every child (runs resume from their checkpoints next time)."""
    import multiprocessing as mp
    import os

    threads = max(1, (os.cpu_count() or 1) // jobs)
    ctx = mp.get_context("spawn")
    queue, failed = list(pending), []
    with stopped_on_exit() as procs:
        running: list[Any] = []
        while queue or running:
            while queue and len(running) < jobs:
                args, name = queue.pop(0)
                proc = ctx.Process(target=_one_run, args=args, kwargs={"threads": threads}, name=name)
                procs.append(proc)
                proc.start()
                log(f"{name}: started (pid {proc.pid}, {threads} thread{'s' if threads > 1 else ''})")
                running.append(proc)
            for proc in list(running):
                proc.join(timeout=1.0)
                if proc.exitcode is None:
                    continue
                running.remove(proc)
                if proc.exitcode != 0:
                    failed.append(proc.name)
                    log(f"{proc.name}: failed (exit code {proc.exitcode})")
                else:
                    log(f"{proc.name}: done")
    return failed


def _one_run(config: str, method: str, seed: int, run_dir: str, init: str | None, base_ov: list[str],
             mini: str | None, test_limit: int | None, mini_limit: int | None, threads: int | None = None) -> None:
    """Train (or resume, or only evaluate) one (method, seed) and write its ``results.json`` and ``done.json``."""
    from hindsearch.config import Config
    from hindsearch.train.run import run_train

    if threads:
        import torch

        torch.set_num_threads(threads)

    rd = Path(run_dir)
    cfg = Config.load(config, run_overrides(method, seed, rd, init, base_ov))
    state = run_state(rd)
    t0 = time.time()
    if state == "partial":
        run_train(None, resume=rd)
    elif state == "new":
        run_train(cfg)
    from hindsearch.micro import resolve_alias

    sets = eval_sets(resolve_alias(Config.load(config, base_ov)), mini, test_limit, mini_limit or cfg.eval.limit)
    numbers = evaluate_run(rd, cfg, sets)
    res = {"method": method, "seed": seed, "steps": cfg.train.steps, "benchmarks": numbers,
           "step_s": median_step_time(rd), "init_model": init, "train_seconds": time.time() - t0}
    (rd / "results.json").write_text(json.dumps(res, indent=1))
    (rd / "done.json").write_text(json.dumps({"finished": time.strftime("%Y-%m-%dT%H:%M:%S")}))


def _title(config: str, cfg: Any) -> str:
    judge = f", judge {cfg.hindsearch.judge_kind}"
    return f"hindsearch compare: {Path(config).name} (model {Path(cfg.model.name).name}{judge}, {cfg.train.steps} steps)"


def main_compare(args: argparse.Namespace) -> int:
    """Entry point of ``hindsearch compare`` (arguments defined in ``hindsearch.report.register``)."""
    from hindsearch.train.cli import find_config

    methods, seeds = parse_methods(args.methods), parse_seeds(args.seeds)
    config = str(find_config(args.config))  # a TOML file or a shipped preset name, as for ``hindsearch train``
    md = run_compare(config, methods, seeds, args.out, steps=args.steps, overrides=args.overrides,
                     mini=args.mini, test_limit=args.test_limit, mini_limit=args.mini_limit,
                     jobs=getattr(args, "jobs", 1), probe=getattr(args, "probe", 0))
    print(md)
    if not args.no_report:
        from hindsearch.report import write_report

        print(f"report: {write_report(args.out)}")
    return 0
