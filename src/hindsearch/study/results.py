"""The results of a comparison folder (``hindsearch compare --out DIR``): read, aggregate, tabulate,
plot.

Pure functions over the files the runs wrote (``<method>-s<seed>/results.json``, ``metrics.jsonl``,
``summary.json``, ``dev_curve.jsonl``). ``hindsearch.study.compare`` (which trains and evaluates the
runs) and ``hindsearch.study.report`` (which renders them) both read them from here; neither imports
the other's command.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hindsearch.fsutil import open_regular, read_jsonl
from hindsearch.tables import markdown_table

MINI_BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
WORLD = "world"


def run_name(method: str, seed: int) -> str:
    """The run folder name of one (method, seed) of a comparison."""
    return f"{method}-s{seed}"


# --------------------------------------------------------------------------- evaluation numbers
def bench_numbers(res: Any) -> dict[str, Any]:
    """``{"em", "em_1hop", "em_2hop", "multi_1hop", "n", ...}`` from one benchmark's entry of an
    ``evaluate`` result (tolerant)."""
    if not isinstance(res, dict):
        return {}
    from hindsearch.eval import bench_row

    return bench_row(res)


def eval_numbers(result: dict[str, Any], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-benchmark numbers from ``evaluate``'s return value (``{name: {...}}`` or ``{"benchmarks":
    {...}}``)."""
    table = result.get("benchmarks", result) if isinstance(result, dict) else {}
    return {n: bench_numbers(table.get(n)) for n in names if n in table}


def metric_values(run_dir: Path, key: str) -> list[float]:
    """The numeric values of ``key`` over the run's metrics rows, in order (rows without it
    skipped)."""
    vals = []
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        v = row.get(key)
        if isinstance(v, (int, float)):
            vals.append(float(v))
    return vals


def median_step_time(run_dir: Path) -> float | None:
    """Median ``time/step`` (seconds) over the run's metrics rows."""
    vals = metric_values(run_dir, "time/step")
    return statistics.median(vals) if vals else None


ZERO_ADV_KEY = "rollout/frac_zero_std_groups"
"""The metric of the share of a step's groups whose rewards are all equal: zero advantage, no GRPO
signal."""


def zero_advantage_share(run_dir: Path) -> float | None:
    """Mean over the run's steps of the share of groups with all rewards equal (None when not
    logged)."""
    vals = metric_values(run_dir, ZERO_ADV_KEY)
    return statistics.fmean(vals) if vals else None


# --------------------------------------------------------------------------- aggregation
def columns(benchmarks: Sequence[str]) -> list[tuple[str, str, str]]:
    """Table columns ``(header, benchmark, key)``: world EM, 1-hop, 2-hop, the share of one-hop
    questions searched at least twice (over-search), then each mini benchmark, then the mini
    average."""
    cols = []
    if WORLD in benchmarks:
        cols += [("world EM", WORLD, "em"), ("world 1-hop", WORLD, "em_1hop"),
                 ("world 2-hop", WORLD, "em_2hop"), ("1-hop searched 2+", WORLD, "multi_1hop")]
    cols += [(b, b, "em") for b in benchmarks if b != WORLD]
    if any(b != WORLD for b in benchmarks):
        cols.append(("mini avg", "__mini_avg__", "em"))
    return cols


def mean_spread(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def aggregate(results: Sequence[dict[str, Any]],
              methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: ``{column header: (mean, std, n)}`` over seeds plus ``step_s``; ``results`` are
    ``results.json`` dicts."""
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
        zero = [float(r["zero_adv"]) for r in rs if isinstance(r.get("zero_adv"), (int, float))]
        row["zero_adv"] = statistics.fmean(zero) if zero else None
        out[m] = row
    return out


def _bench_order(b: str) -> tuple[int, str]:
    if b == WORLD:
        return (0, b)
    return (1 + MINI_BENCHMARKS.index(b), b) if b in MINI_BENCHMARKS else (99, b)


def results_rows(agg: dict[str, dict[str, Any]],
                 benches: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table: EM x100 as ``mean ± std`` over seeds (one seed: the
    mean alone), the median step time and its ratio to GRPO (``-`` where not recorded)."""
    cols = columns(sorted(benches, key=_bench_order))
    heads = ["method", "seeds"] + [c[0] for c in cols] + ["zero-adv groups", "step s", "vs GRPO"]
    base = agg.get("grpo", {}).get("step_s")
    rows = []
    for m, row in agg.items():
        cells = [m, str(len(row["seeds"]))]
        for header, _, _ in cols:
            v = row.get(header)
            # one seed has no spread: print the mean alone rather than a misleading "± 0.0"
            cells.append("-" if v is None else f"{100 * v[0]:.1f} ± {100 * v[1]:.1f}" if v[2] > 1
                         else f"{100 * v[0]:.1f}")
        z = row.get("zero_adv")
        cells.append("-" if z is None else f"{100 * z:.0f}%")
        st = row.get("step_s")
        cells.append("-" if st is None else f"{st:.1f}")
        cells.append("-" if st is None or not base else f"{st / base:.2f}x")
        rows.append(cells)
    return heads, rows


RESULTS_NOTE = ("EM in %, mean ± sample std over seeds (the seeds column gives n; one seed: the "
                "mean alone). 1-hop searched 2+: the share of one-hop world questions the policy "
                "searched at least twice (%), over-search that a learned 'search again' can cost. "
                "Zero-adv groups: the share of training groups whose rewards were all equal (no "
                "GRPO signal), mean over steps and seeds. Step time: median seconds per optimizer "
                "step (rollout + reward + hindsight prepare + update), ratio to GRPO.")


def results_markdown(agg: dict[str, dict[str, Any]], benches: Sequence[str],
                     title: str = "") -> str:
    """The results table (``results_rows``) as markdown."""
    heads, rows = results_rows(agg, benches)
    lines = ([f"# {title}", ""] if title else []) + [markdown_table(heads, rows)]
    return "\n".join(lines + ["", RESULTS_NOTE]) + "\n"


def load_results(out_dir: Path, methods: Sequence[str], seeds: Sequence[int],
                 bad: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``results.json`` of every finished (method, seed) run of a comparison folder. An
    unreadable one raises ``ValueError`` naming it, or with ``bad`` given is skipped and reported
    there as ``file: reason``."""
    out = []
    for p in (out_dir / run_name(m, s) / "results.json" for m in methods for s in seeds):
        if not p.exists():
            continue
        try:
            with open_regular(p, 64 << 20) as f:  # never a FIFO or a device behind the name
                res = json.loads(f.read())
            if not isinstance(res, dict):
                raise ValueError("not a JSON object")
        except (ValueError, OSError) as e:
            if bad is None:
                raise ValueError(f"{p}: unreadable ({e}); delete it and its done.json to evaluate "
                                 "the run again") from e
            bad.append(f"{p}: {e}")
            continue
        out.append(res)
    return out


def bench_names(results: Sequence[dict[str, Any]]) -> list[str]:
    """The benchmarks any of ``results`` evaluated, world first, then the mini benchmarks in their
    order."""
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
    for row in read_jsonl(run_dir / "dev_curve.jsonl"):
        if row.get("em") is not None:
            pts[int(row["step"])] = float(row["em"])
    if (dev.get("rl") or {}).get("em") is not None and d.get("steps") is not None:
        pts[int(d["steps"])] = float(dev["rl"]["em"])
    return sorted(pts.items())


def plot_curves(out_dir: Path, methods: Sequence[str], seeds: Sequence[int], path: Path,
                window: int = 10) -> Path:
    """``curves.png``: training reward (moving average) and dev EM (``dev_curve``) vs step, mean
    over seeds (dev EM at the steps every seed evaluated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for m in methods:
        per_seed, curves = [], []
        for s in seeds:
            rd = out_dir / run_name(m, s)
            rew = [float(pick_reward(r)) for r in read_jsonl(rd / "metrics.jsonl")]
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
            ax2.plot(steps, [sum(c[t] for c in curves) / len(curves) for t in steps],
                     marker="o", label=m)
    ax1.set(title=f"training reward (moving avg {window})", xlabel="step", ylabel="reward")
    ax2.set(title="dev EM (greedy)", xlabel="step", ylabel="EM")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def curve_markdown(results: Sequence[dict[str, Any]], methods: Sequence[str]) -> str:
    """EM along the way (``compare --eval-at``): per method and evaluated step, the world test EM
    and two-hop EM, mean ± standard deviation over the seeds ('' when no run has a curve)."""
    steps = sorted({int(k) for r in results for k in (r.get("curve") or {})})
    if not steps:
        return ""
    body = []
    for m in methods:
        runs = [r for r in results if r.get("method") == m and r.get("curve")]
        if not runs:
            continue
        cells = []
        for n in steps:
            got = [r["curve"][str(n)] for r in runs if str(n) in r["curve"]]
            if not got:
                cells.append("-")
                continue
            em, e2 = (mean_spread([100 * float(g.get(k, 0.0)) for g in got])
                      for k in ("em", "em_2hop"))
            cells.append(f"{em[0]:.1f} ± {em[1]:.1f} / {e2[0]:.1f} ± {e2[1]:.1f} (n={len(got)})")
        body.append([m, *cells])
    return ("### EM along the way (world test split, greedy; EM / two-hop EM, mean ± sd over "
            "seeds)\n\n"
            + markdown_table(["method", *(f"step {n}" for n in steps)], body) + "\n")


def probes_markdown(out_dir: Path, methods: Sequence[str], seeds: Sequence[int]) -> str:
    """The probes of the start (``DIR/probe.json``) and of each run's final checkpoint
    (``RUN/probe.json``): per method the mean over seeds of ``probe.PROBE_SUMMARY``, rates in % (''
    when no run was probed)."""
    from hindsearch.study.probe import PROBE_SUMMARY, probe_summary

    rows: list[tuple[str, int, dict[str, float | None]]] = []

    def read(p: Path) -> dict[str, float | None] | None:
        try:
            return probe_summary(json.loads(p.read_text())) if p.exists() else None
        except ValueError:
            return None  # a torn probe file: left out (the run's own probe.json names it)

    start = read(out_dir / "probe.json")
    for m in methods:
        got = [x for x in (read(out_dir / run_name(m, s) / "probe.json") for s in seeds)
               if x is not None]
        if got:
            rows.append((m, len(got),
                         {k: (statistics.fmean(v) if (v := [g[k] for g in got if g[k] is not None])
                              else None)
                                       for k, _ in PROBE_SUMMARY}))
    if not rows:
        return ""
    labels = [k for k, _ in PROBE_SUMMARY]
    def cells(d: dict[str, float | None]) -> list[str]:
        return ["-" if d[k] is None else f"{100 * d[k]:.1f}" for k in labels]

    body = ([["start", "-", *cells(start)]] if start is not None else [])
    body += [[m, n, *cells(d)] for m, n, d in rows]
    return ("### Probes of the start and of the final checkpoints (failed greedy training "
            "rollouts; %, mean over seeds)\n\n"
            + markdown_table(["checkpoint", "seeds", *labels], body) + "\n")


def write_outputs(out_dir: Path, methods: Sequence[str], seeds: Sequence[int],
                  title: str = "") -> str:
    """Aggregate the finished runs of ``out_dir`` into ``results.md`` and ``curves.png``; returns
    the markdown."""
    results = load_results(out_dir, methods, seeds)
    md = results_markdown(aggregate(results, methods), bench_names(results), title)
    from hindsearch.study.paired import bootstrap_markdown

    boot = bootstrap_markdown(lambda m, seed: out_dir / run_name(m, seed), methods, seeds)
    if boot:
        md += "\n" + boot
    curve = curve_markdown(results, methods)
    if curve:
        md += "\n" + curve
    from hindsearch.study.paired import (curve_pairs_markdown, pairs_markdown, seed_level_markdown,
                                         seeds_markdown)
    from hindsearch.study.sampled import summary_markdown

    for section in (seed_level_markdown, summary_markdown, pairs_markdown, curve_pairs_markdown,
                    seeds_markdown):
        text = section(lambda m, seed: out_dir / run_name(m, seed), methods, seeds)
        if text:
            md += "\n" + text
    probes = probes_markdown(out_dir, methods, seeds)
    if probes:
        md += "\n" + probes
    if (out_dir / "probe.json").exists():
        from hindsearch.study.probe import format_probe

        probe = format_probe(json.loads((out_dir / "probe.json").read_text()))
        md += "\n### Teacher probes of the starting checkpoint\n\n" + probe + "\n"
    (out_dir / "results.md").write_text(md)
    plot_curves(out_dir, methods, seeds, out_dir / "curves.png")
    return md
