"""Paired comparison of finished runs against GRPO: per-question results and a paired bootstrap.

``per_question`` reads a run's greedy test trajectories; ``bootstrap_rows`` averages each question
over the seeds both methods finished and resamples questions (``paired_bootstrap``) for each method
minus GRPO on EM, two-hop EM and evidence recall; ``bootstrap_markdown`` is the section ``hindsearch
compare`` appends to ``results.md``. ``pair_rows`` pairs each method with GRPO and its matching
controls on the sampled measures, ``curve_pair_rows`` on greedy EM at every evaluated step, and
``seeds_markdown`` shows each pair seed by seed. ``run_dir(method, seed)`` names a run's folder, so
nothing here depends on ``compare``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hindsearch.fsutil import read_jsonl
from hindsearch.tables import markdown_table


def paired_bootstrap(diffs: Sequence[float], n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-question differences and its 95% percentile interval over ``n_boot`` resamples of
    questions."""
    import random

    xs = list(diffs)
    if not xs:
        return 0.0, 0.0, 0.0
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    return sum(xs) / n, means[int(0.025 * n_boot)], means[min(n_boot - 1, int(0.975 * n_boot))]


def per_question(run_dir: Path, bench: str = "world", tag: str = "") -> dict[str, dict[str, float]]:
    """``{question id: {em, recall, hops}}`` of a run's greedy test trajectories
    (``eval/test-<bench><tag>``; ``tag`` ``-step-N``: the checkpoint of step N, ``compare
    --eval-at``)."""
    from hindsearch.records import Trajectory

    path = run_dir / "eval" / f"test-{bench}{tag}" / "trajectories.jsonl"
    out: dict[str, dict[str, float]] = {}
    if not path.exists():
        return out
    for row in read_jsonl(path):
        t = Trajectory.from_dict(row)
        out[t.qid] = {"em": float(t.em or 0.0), "recall": t.evidence_recall,
                      "hops": float(t.hops or 0)}
    return out


def bootstrap_rows(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                   seeds: Sequence[int], base: str = "grpo",
                   n_boot: int = 2000) -> list[dict[str, Any]]:
    """Each method minus ``base`` on world test EM, two-hop EM and evidence recall: per question,
    the mean over the seeds both have finished, then a paired bootstrap over questions (95%
    interval)."""
    def means(method: str, ok: list[int]) -> dict[str, dict[str, float]]:
        runs = [per_question(run_dir(method, s)) for s in ok]
        qids = set.intersection(*(set(r) for r in runs)) if runs else set()
        return {q: {k: sum(r[q][k] for r in runs) / len(runs) for k in ("em", "recall", "hops")}
                for q in qids}

    rows = []
    for m in methods:
        if m == base:
            continue
        ok = [s for s in seeds if (run_dir(m, s) / "done.json").exists()
              and (run_dir(base, s) / "done.json").exists()]
        if not ok:
            continue
        a, b = means(m, ok), means(base, ok)
        qs = sorted(set(a) & set(b))
        row: dict[str, Any] = {"method": m, "seeds": len(ok), "questions": len(qs)}
        for key, sel, metric in (("em", lambda q: True, "em"),
                                 ("em_2hop", lambda q: b[q]["hops"] == 2, "em"),
                                 ("recall", lambda q: True, "recall")):
            d = [a[q][metric] - b[q][metric] for q in qs if sel(q)]
            row[key] = paired_bootstrap(d, n_boot)
        rows.append(row)
    return rows


def bootstrap_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                       seeds: Sequence[int]) -> str:
    """The markdown section of ``bootstrap_rows`` ('' when no method has a finished seed beside
    GRPO's)."""
    rows = bootstrap_rows(run_dir, methods, seeds)
    if not rows:
        return ""
    table = markdown_table(
        ["method", "seeds", "questions", "EM", "EM 2-hop", "evidence recall"],
        [[r["method"], r["seeds"], r["questions"],
          *(f"{100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
            for m, lo, hi in (r["em"], r["em_2hop"], r["recall"]))]
         for r in rows])
    lines = ["### Each method minus GRPO, world test (paired bootstrap over questions, 95% "
             "interval)", "", table, "", "Points (percentage points); per question the mean over "
                                         "the seeds both methods finished. An interval "
              "that excludes 0 separates the method from GRPO."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------- sampled behaviour and matching controls (issue 21)
CONTROLS: dict[str, tuple[str, ...]] = {"hindsearch": ("hindsearch-nogold", "hindsearch-shuffled"),
                                        "hindsearch-onesided": ("hindsearch-onesided-nogold",
                                                                "hindsearch-onesided-shuffled"),
                                        "hindsearch-onesided-answer": (
                                            "hindsearch-onesided-answer-nogold",),
                                        "hindsearch-ready": ("hindsearch",
                                                             "hindsearch-ready-shuffled"),
                                        "hindsearch-ready-line": ("hindsearch-ready", "hindsearch"),
                                        "igsd": ("igsd-nogate", "igsd-paper"),
                                        "igsd-group": ("igsd-nogate", "igsd"),
                                        "igsd-critique": ("igsd-nogate", "igsd")}
"""Each method's matching controls: a gain over them is the teacher's information (or the gate), not
an extra gradient at the same positions."""


def _greedy(run_dir: Path) -> dict[str, dict[str, float]]:
    return per_question(run_dir)


def _sampled(run_dir: Path) -> dict[str, dict[str, Any]]:
    from hindsearch.study.sampled import SAMPLED_FILE, read_rows

    return read_rows(run_dir / SAMPLED_FILE)


def _states(run_dir: Path) -> dict[str, dict[str, Any]]:
    from hindsearch.study.sampled import STATES_FILE, read_rows

    return read_rows(run_dir / STATES_FILE)


def _two_hop(row: dict[str, Any]) -> bool:
    return row.get("hops") == 2


PairedMetric = tuple[str, Callable[[Path], dict[str, dict[str, Any]]], str,
                     Callable[[dict[str, Any]], bool]]
"""``(label, per-question rows of a run folder, the row's key, which rows count)``."""
PAIRED_METRICS: tuple[PairedMetric, ...] = (
    ("greedy EM 2-hop", _greedy, "em", _two_hop),
    ("sampled EM 2-hop", _sampled, "em", _two_hop),
    ("pass@k 2-hop", _sampled, "pass_k", _two_hop),
    ("sampled evidence recall", _sampled, "recall", lambda r: True),
    ("P(search again), held-out states", _states, "p_search", lambda r: True),
    ("bridge hit, held-out states", _states, "hit_missed", lambda r: True),
)
"""``(label, reader(run_dir) -> {id: row}, key, selector)``: what ``pair_rows`` pairs item by
item."""


def comparison_pairs(methods: Sequence[str], base: str = "grpo") -> list[tuple[str, str]]:
    """``(method, against)``: every method against ``base``, and each method against its matching
    controls."""
    pairs = [(m, base) for m in methods if m != base and base in methods]
    pairs += [(m, c) for m in methods for c in CONTROLS.get(m, ()) if c in methods]
    return pairs


def _item_means(run_dir: Callable[[str, int], Path], method: str, ok: Sequence[int],
                read: Callable[[Path], dict[str, dict[str, Any]]],
                key: str) -> dict[str, dict[str, Any]]:
    """``{item id: {"v": mean of key over the seeds ok, "row": the first seed's row}}``, the items
    every seed has."""
    runs = [read(run_dir(method, s)) for s in ok]
    ids = set.intersection(*(set(r) for r in runs)) if runs and all(runs) else set()
    return {i: {"v": sum(float(r[i][key]) for r in runs) / len(runs), "row": runs[0][i]}
            for i in ids}


def _paired(run_dir: Callable[[str, int], Path], a: str, b: str, ok: Sequence[int],
            metric: PairedMetric,
            n_boot: int) -> tuple[float, float, float, int] | None:
    """``(mean, lo, hi, n items)`` of ``a`` minus ``b`` on one metric over the seeds ``ok`` (None:
    no item)."""
    _, read, key, sel = metric
    x, y = _item_means(run_dir, a, ok, read, key), _item_means(run_dir, b, ok, read, key)
    ids = sorted(i for i in set(x) & set(y) if sel(y[i]["row"]))
    if not ids:
        return None
    return (*paired_bootstrap([x[i]["v"] - y[i]["v"] for i in ids], n_boot), len(ids))


def _both_done(run_dir: Callable[[str, int], Path], a: str, b: str,
               seeds: Sequence[int]) -> list[int]:
    return [s for s in seeds if (run_dir(a, s) / "done.json").exists()
            and (run_dir(b, s) / "done.json").exists()]


def pair_rows(run_dir: Callable[[str, int], Path], methods: Sequence[str], seeds: Sequence[int],
              n_boot: int = 2000, metrics: Sequence[tuple] = PAIRED_METRICS,
              per_seed: bool = False) -> list[dict[str, Any]]:
    """Per pair of ``comparison_pairs`` and per metric of ``metrics``: the paired bootstrap of the
    per-item difference (each item the mean over the seeds both runs finished). ``per_seed``: one
    row per pair and seed instead, each over that seed's items alone (``row["seed"]``)."""
    rows = []
    for a, b in comparison_pairs(methods):
        ok = _both_done(run_dir, a, b, seeds)
        for group in ([[s] for s in ok] if per_seed else [ok] if ok else []):
            row: dict[str, Any] = {"method": a, "against": b, "seeds": len(group)}
            if per_seed:
                row["seed"] = group[0]
            for metric in metrics:
                got = _paired(run_dir, a, b, group, metric, n_boot)
                if got is not None:
                    row[metric[0]] = got
            rows.append(row)
    return rows


def pairs_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                   seeds: Sequence[int]) -> str:
    """The markdown section of ``pair_rows`` ('' when no pair has a finished seed)."""
    rows = pair_rows(run_dir, methods, seeds)
    labels = [m[0] for m in PAIRED_METRICS if any(m[0] in r for r in rows)]
    if not rows or not labels:
        return ""
    table = markdown_table(
        ["method", "against", "seeds", *labels],
        [[r["method"], r["against"], r["seeds"],
          *(f"{100 * r[k][0]:+.1f} [{100 * r[k][1]:+.1f}, {100 * r[k][2]:+.1f}] (n={r[k][3]})"
            if k in r else "-"
            for k in labels)] for r in rows])
    lines = ["### Sampled behaviour, each method against GRPO and its matching controls (paired "
             "bootstrap, 95% interval)", "", table,
             "", "Points; items are test questions (EM, pass@k, recall) or held-out failed states "
                 "of the starting "
              "checkpoint (P(search again), bridge hit), each the mean over the seeds both runs "
              "finished."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------- per seed, and along the way (issue 21)
GREEDY_EM = ("greedy EM", _greedy, "em", lambda r: True)
SEED_METRICS = (GREEDY_EM,) + PAIRED_METRICS
"""What the per-seed table pairs: greedy world EM, then every metric of ``PAIRED_METRICS``."""


def _cell(v: tuple[float, float, float, int]) -> str:
    return f"{100 * v[0]:+.1f} [{100 * v[1]:+.1f}, {100 * v[2]:+.1f}]"


def seeds_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                   seeds: Sequence[int]) -> str:
    """Each pair's paired difference seed by seed ('' with fewer than two seeds): whether the pooled
    tables' sign holds in every seed, or comes from one."""
    rows = pair_rows(run_dir, methods, seeds, metrics=SEED_METRICS, per_seed=True)
    done = sorted({r["seed"] for r in rows})
    if len(done) < 2:
        return ""
    body = []
    for a, b in comparison_pairs(methods):
        got = {r["seed"]: r for r in rows if r["method"] == a and r["against"] == b}
        for label, *_ in SEED_METRICS:
            if any(label in r for r in got.values()):
                body.append([a, b, label,
                             *(_cell(got[s][label]) if s in got and label in got[s] else "-"
                                            for s in done)])
    lines = ["### Per seed: each method against GRPO and its matching controls (paired bootstrap, "
             "95% interval)", "",
             markdown_table(["method", "against", "metric", *(f"seed {s}" for s in done)], body),
             "", "Points; within one seed, items are resampled (test questions, or held-out failed "
                 "states), so "
              "each interval measures the questions' spread in that seed, not the seeds' spread."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ intervals that count seeds (issue 38)
def seed_t_interval(seed_means: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of per-seed mean differences and its Student-t interval over seeds (``n - 1`` degrees of
    freedom); ``(m, nan, nan)`` with one seed. The seed is the unit: questions only enter through
    each seed's mean."""
    import math
    import statistics

    from scipy.stats import t as student_t

    xs = [float(x) for x in seed_means]
    if not xs:
        return 0.0, float("nan"), float("nan")
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    half = float(student_t.ppf(0.5 + level / 2, len(xs) - 1)) * statistics.stdev(xs) / math.sqrt(
        len(xs))
    return m, m - half, m + half


def two_level_bootstrap(per_seed: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0
                        ) -> tuple[float, float, float]:
    """Mean difference and its 95% percentile interval when each resample draws seeds with
    replacement, then questions with replacement within each drawn seed (``per_seed[s]`` = that
    seed's per-question differences). With few seeds it is narrower than ``seed_t_interval``: it
    cannot see seed spread beyond the seeds run."""
    import random

    groups = [list(g) for g in per_seed if len(g)]
    if not groups:
        return 0.0, 0.0, 0.0
    rng = random.Random(seed)
    k = len(groups)
    stats = []
    for _ in range(n_boot):
        tot = 0.0
        for _ in range(k):
            g = groups[rng.randrange(k)]
            n = len(g)
            tot += sum(g[rng.randrange(n)] for _ in range(n)) / n
        stats.append(tot / k)
    stats.sort()
    point = sum(sum(g) / len(g) for g in groups) / k
    return point, stats[int(0.025 * n_boot)], stats[min(n_boot - 1, int(0.975 * n_boot))]


def seed_level_rows(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                    seeds: Sequence[int], metrics: Sequence[tuple] = (),
                    n_boot: int = 2000) -> list[dict[str, Any]]:
    """Per pair of ``comparison_pairs`` and metric (``SEED_METRICS`` by default): the per-seed mean
    differences, the t-interval over them and the two-level bootstrap, over the seeds both runs
    finished."""
    rows = []
    for a, b in comparison_pairs(methods):
        ok = _both_done(run_dir, a, b, seeds)
        for label, read, key, sel in metrics or SEED_METRICS:
            diffs: dict[int, list[float]] = {}
            for s in ok:
                x = _item_means(run_dir, a, [s], read, key)
                y = _item_means(run_dir, b, [s], read, key)
                d = [x[i]["v"] - y[i]["v"] for i in sorted(set(x) & set(y)) if sel(y[i]["row"])]
                if d:
                    diffs[s] = d
            if not diffs:
                continue
            means = [sum(d) / len(d) for d in diffs.values()]
            rows.append({"method": a, "against": b, "metric": label, "seeds": sorted(diffs),
                         "per_seed": {s: sum(diffs[s]) / len(diffs[s]) for s in sorted(diffs)},
                         "t": seed_t_interval(means),
                         "boot2": two_level_bootstrap(list(diffs.values()), n_boot)})
    return rows


def _starts(run_dir: Callable[[str, int], Path], methods: Sequence[str],
            seeds: Sequence[int]) -> dict[str, list[str]]:
    """Start weight digest -> the runs that recorded it in ``results.json`` (runs without one are
    left out)."""
    out: dict[str, list[str]] = {}
    for m in methods:
        for s in seeds:
            p = run_dir(m, s) / "results.json"
            try:
                digest = json.loads(p.read_text()).get("start_sha256") if p.is_file() else None
            except ValueError:
                digest = None
            if isinstance(digest, str):
                out.setdefault(digest, []).append(run_dir(m, s).name)
    return out


def seed_level_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                        seeds: Sequence[int]) -> str:
    """The headline section: each difference with an interval over seeds, next to the per-seed means
    ('' with fewer than two seeds finished by some pair)."""
    rows = [r for r in seed_level_rows(run_dir, methods, seeds) if len(r["seeds"]) >= 2]
    if not rows:
        return ""
    done = sorted({s for r in rows for s in r["seeds"]})
    body = []
    for r in rows:
        m, lo, hi = r["t"]
        _, blo, bhi = r["boot2"]
        body.append([r["method"], r["against"], r["metric"], len(r["seeds"]), f"{100 * m:+.1f}",
                     f"[{100 * lo:+.1f}, {100 * hi:+.1f}]", f"[{100 * blo:+.1f}, {100 * bhi:+.1f}]",
                     *(f"{100 * r['per_seed'][s]:+.1f}" if s in r["per_seed"] else "-"
                       for s in done)])
    head = ["method", "against", "metric", "seeds", "mean", "95% t over seed means",
            "two-level bootstrap", *(f"seed {s}" for s in done)]
    lines = ["### Intervals over seeds: each method against GRPO and its matching controls", "",
             markdown_table(head, body)]
    starts = _starts(run_dir, methods, done)
    if len(starts) > 1:
        lines += ["", f"**Warning: these runs trained from {len(starts)} different starts** ("
                  + ", ".join(f"{d[:8]}...: {', '.join(r)}" for d, r in sorted(starts.items()))
                  + "); a difference "
                  "over seeds assumes one start."]
    lines += ["", "Points. The headline interval is the Student-t interval over the seeds' mean "
                  "differences (seed = "
              "unit, n - 1 degrees of freedom): it counts seed variance, which a bootstrap over "
              "questions pooled over seeds does not. The two-level bootstrap (seeds, then "
              "questions within each) is shown beside "
              "it; with 2-3 seeds it is too narrow, so claims use the t-interval."]
    return "\n".join(lines) + "\n"


def evaluated_steps(rd: Path, bench: str = "world") -> dict[int, str]:
    """``{step: tag}`` of a run's greedy test evaluations: ``-step-N`` for each ``compare
    --eval-at`` checkpoint, ``""`` for the final one (its step from ``results.json``)."""
    out: dict[int, str] = {}
    ev = rd / "eval"
    prefix = f"test-{bench}-step-"
    if ev.is_dir():
        for d in ev.iterdir():
            n = d.name[len(prefix):]
            if d.name.startswith(prefix) and n.isdigit() and (d / "trajectories.jsonl").exists():
                out[int(n)] = f"-step-{n}"
    res = rd / "results.json"
    if res.exists() and (ev / f"test-{bench}" / "trajectories.jsonl").exists():
        try:
            steps = json.loads(res.read_text()).get("steps")
        except ValueError as e:
            raise ValueError(f"{res}: not JSON ({e})") from None
        if isinstance(steps, int) and steps > 0:
            out[steps] = ""
    return out


def curve_pair_rows(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                    seeds: Sequence[int], n_boot: int = 2000) -> list[dict[str, Any]]:
    """Per pair of ``comparison_pairs`` and per evaluated step (``evaluated_steps`` of both runs):
    the paired bootstrap of greedy world EM and two-hop EM at that step, each question the mean over
    the seeds where both runs have it: a difference at some step budget, not only at the end."""
    metrics = {"EM": ("em", lambda r: True), "EM 2-hop": ("em", _two_hop)}
    rows = []
    for a, b in comparison_pairs(methods):
        ok = _both_done(run_dir, a, b, seeds)
        steps = {s: (evaluated_steps(run_dir(a, s)), evaluated_steps(run_dir(b, s))) for s in ok}
        # each run's own tag for a step: a 100-step run's final eval is step 100 of a 200-step run's
        # curve
        tags = {run_dir(m, s): steps[s][i] for s in ok for i, m in enumerate((a, b))}
        for n in sorted({n for x, y in steps.values() for n in set(x) & set(y)}):
            group = [s for s in ok if n in steps[s][0] and n in steps[s][1]]
            row: dict[str, Any] = {"method": a, "against": b, "step": n, "seeds": len(group)}
            read = lambda rd, n=n: per_question(rd, tag=tags[rd][n])  # noqa: E731
            for label, (key, sel) in metrics.items():
                got = _paired(run_dir, a, b, group, (label, read, key, sel), n_boot)
                if got is not None:
                    row[label] = got
            rows.append(row)
    return rows


def curve_pairs_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str],
                         seeds: Sequence[int]) -> str:
    """The markdown section of ``curve_pair_rows`` ('' when no pair has two evaluated steps)."""
    rows = curve_pair_rows(run_dir, methods, seeds)
    steps = sorted({r["step"] for r in rows})
    if len(steps) < 2:
        return ""
    body = []
    for a, b in comparison_pairs(methods):
        got = {r["step"]: r for r in rows if r["method"] == a and r["against"] == b}
        for label in ("EM 2-hop", "EM"):
            if any(label in r for r in got.values()):
                cells = [_cell(got[n][label])
                         + ("" if got[n]["seeds"] == max(r["seeds"] for r in got.values())
                                                 else f" ({got[n]['seeds']} seeds)") if n in got
                         and label in got[n]
                         else "-" for n in steps]
                body.append([a, b, label, *cells])
    lines = ["### Along the way: each method against GRPO and its matching controls, greedy "
             "(paired bootstrap, 95% interval)", "",
             markdown_table(["method", "against", "metric", *(f"step {n}" for n in steps)], body),
             "", "Points, world test split; per question the mean over the seeds both runs "
                 "evaluated at that step. "
              "Many steps are read, so one interval that excludes 0 is weaker evidence than the "
              "same interval fixed in advance."]
    return "\n".join(lines) + "\n"
