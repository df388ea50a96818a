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
