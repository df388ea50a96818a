"""Paired comparison of finished runs against GRPO: per-question results and a paired bootstrap.

``per_question`` reads a run's greedy test trajectories; ``bootstrap_rows`` averages each question over the
seeds both methods finished and resamples questions (``paired_bootstrap``) for each method minus GRPO on EM,
two-hop EM and evidence recall; ``bootstrap_markdown`` is the section ``hindsearch compare`` appends to
``results.md``. ``run_dir(method, seed)`` names a run's folder, so nothing here depends on ``compare``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def paired_bootstrap(diffs: Sequence[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-question differences and its 95% percentile interval over ``n_boot`` resamples of questions."""
    import random

    xs = list(diffs)
    if not xs:
        return 0.0, 0.0, 0.0
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    return sum(xs) / n, means[int(0.025 * n_boot)], means[min(n_boot - 1, int(0.975 * n_boot))]


def per_question(run_dir: Path, bench: str = "world") -> dict[str, dict[str, float]]:
    """``{question id: {em, recall, hops}}`` of a run's greedy test trajectories (``eval/test-<bench>``)."""
    from hindsearch.records import Trajectory

    path = run_dir / "eval" / f"test-{bench}" / "trajectories.jsonl"
    out: dict[str, dict[str, float]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if line.strip():
            t = Trajectory.from_dict(json.loads(line))
            out[t.qid] = {"em": float(t.em or 0.0), "recall": t.evidence_recall, "hops": float(t.hops or 0)}
    return out


def bootstrap_rows(run_dir: Callable[[str, int], Path], methods: Sequence[str], seeds: Sequence[int],
                   base: str = "grpo", n_boot: int = 2000) -> list[dict[str, Any]]:
    """Each method minus ``base`` on world test EM, two-hop EM and evidence recall: per question, the mean
    over the seeds both have finished, then a paired bootstrap over questions (95% interval)."""
    def means(method: str, ok: list[int]) -> dict[str, dict[str, float]]:
        runs = [per_question(run_dir(method, s)) for s in ok]
        qids = set.intersection(*(set(r) for r in runs)) if runs else set()
        return {q: {k: sum(r[q][k] for r in runs) / len(runs) for k in ("em", "recall", "hops")} for q in qids}

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
        for key, sel, metric in (("em", lambda q: True, "em"), ("em_2hop", lambda q: b[q]["hops"] == 2, "em"),
                                 ("recall", lambda q: True, "recall")):
            d = [a[q][metric] - b[q][metric] for q in qs if sel(q)]
            row[key] = paired_bootstrap(d, n_boot)
        rows.append(row)
    return rows


def bootstrap_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str], seeds: Sequence[int]) -> str:
    """The markdown section of ``bootstrap_rows`` ('' when no method has a finished seed beside GRPO's)."""
    rows = bootstrap_rows(run_dir, methods, seeds)
    if not rows:
        return ""
    lines = ["### Each method minus GRPO, world test (paired bootstrap over questions, 95% interval)", "",
             "| method | seeds | questions | EM | EM 2-hop | evidence recall |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{100 * m:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" for m, lo, hi in (r["em"], r["em_2hop"], r["recall"])]
        lines.append(f"| {r['method']} | {r['seeds']} | {r['questions']} | " + " | ".join(cells) + " |")
    lines += ["", "Points (percentage points); per question the mean over the seeds both methods finished. An interval "
              "that excludes 0 separates the method from GRPO."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ sampled behaviour and matching controls (issue 21)
CONTROLS: dict[str, tuple[str, ...]] = {"hindsearch": ("hindsearch-nogold", "hindsearch-shuffled"), "igsd": ("igsd-nogate",)}
"""Each method's matching controls: a gain over them is the teacher's information (or the gate), not an extra
gradient at the same positions."""


def _greedy(run_dir: Path) -> dict[str, dict[str, float]]:
    return per_question(run_dir)


def _sampled(run_dir: Path) -> dict[str, dict[str, Any]]:
    from hindsearch.sampled import SAMPLED_FILE, read_rows

    return read_rows(run_dir / SAMPLED_FILE)


def _states(run_dir: Path) -> dict[str, dict[str, Any]]:
    from hindsearch.sampled import STATES_FILE, read_rows

    return read_rows(run_dir / STATES_FILE)


def _two_hop(row: dict[str, Any]) -> bool:
    return row.get("hops") == 2


PAIRED_METRICS: tuple[tuple[str, Callable[[Path], dict[str, dict[str, Any]]], str, Callable[[dict[str, Any]], bool]], ...] = (
    ("greedy EM 2-hop", _greedy, "em", _two_hop),
    ("sampled EM 2-hop", _sampled, "em", _two_hop),
    ("pass@k 2-hop", _sampled, "pass_k", _two_hop),
    ("sampled evidence recall", _sampled, "recall", lambda r: True),
    ("P(search again), held-out states", _states, "p_search", lambda r: True),
    ("bridge hit, held-out states", _states, "hit_missed", lambda r: True),
)
"""``(label, reader(run_dir) -> {id: row}, key, selector)``: what ``pair_rows`` pairs item by item."""


def comparison_pairs(methods: Sequence[str], base: str = "grpo") -> list[tuple[str, str]]:
    """``(method, against)``: every method against ``base``, and each method against its matching controls."""
    pairs = [(m, base) for m in methods if m != base and base in methods]
    pairs += [(m, c) for m in methods for c in CONTROLS.get(m, ()) if c in methods]
    return pairs


def pair_rows(run_dir: Callable[[str, int], Path], methods: Sequence[str], seeds: Sequence[int],
              n_boot: int = 2000) -> list[dict[str, Any]]:
    """Per pair of ``comparison_pairs`` and per metric of ``PAIRED_METRICS``: the paired bootstrap of the
    per-item difference (each item the mean over the seeds both runs finished)."""
    def means(method: str, ok: list[int], read: Callable[[Path], dict[str, dict[str, Any]]], key: str):
        runs = [read(run_dir(method, s)) for s in ok]
        ids = set.intersection(*(set(r) for r in runs)) if runs and all(runs) else set()
        return {i: {"v": sum(float(r[i][key]) for r in runs) / len(runs), "row": runs[0][i]} for i in ids}

    rows = []
    for a, b in comparison_pairs(methods):
        ok = [s for s in seeds if (run_dir(a, s) / "done.json").exists() and (run_dir(b, s) / "done.json").exists()]
        if not ok:
            continue
        row: dict[str, Any] = {"method": a, "against": b, "seeds": len(ok)}
        for label, read, key, sel in PAIRED_METRICS:
            x, y = means(a, ok, read, key), means(b, ok, read, key)
            ids = sorted(i for i in set(x) & set(y) if sel(y[i]["row"]))
            if ids:
                row[label] = (*paired_bootstrap([x[i]["v"] - y[i]["v"] for i in ids], n_boot), len(ids))
        rows.append(row)
    return rows


def pairs_markdown(run_dir: Callable[[str, int], Path], methods: Sequence[str], seeds: Sequence[int]) -> str:
    """The markdown section of ``pair_rows`` ('' when no pair has a finished seed)."""
    rows = pair_rows(run_dir, methods, seeds)
    labels = [m[0] for m in PAIRED_METRICS if any(m[0] in r for r in rows)]
    if not rows or not labels:
        return ""
    lines = ["### Sampled behaviour, each method against GRPO and its matching controls (paired bootstrap, 95% interval)",
             "", "| method | against | seeds | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
    for r in rows:
        cells = [f"{100 * r[k][0]:+.1f} [{100 * r[k][1]:+.1f}, {100 * r[k][2]:+.1f}] (n={r[k][3]})" if k in r else "-"
                 for k in labels]
        lines.append(f"| {r['method']} | {r['against']} | {r['seeds']} | " + " | ".join(cells) + " |")
    lines += ["", "Points; items are test questions (EM, pass@k, recall) or held-out failed states of the starting "
              "checkpoint (P(search again), bridge hit), each the mean over the seeds both runs finished."]
    return "\n".join(lines) + "\n"
