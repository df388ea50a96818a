"""Reading a run folder for the report: ``metrics.jsonl``, ``samples.jsonl``, ``summary.json``, ``results.json``
(tolerant: a bad line is named and skipped), and the metric series and groups plotted from them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- loading
@dataclass
class Run:
    """What a run folder holds (anything missing is empty)."""

    path: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    config_text: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    bad_lines: list[str] = field(default_factory=list)


def read_jsonl(path: Path, bad: list[str]) -> list[dict[str, Any]]:
    """Rows of a JSONL file; unparsable lines are reported in ``bad`` as ``file:line: reason`` (not dropped silently)."""
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                bad.append(f"{path}:{i}: {e}")
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            else:
                bad.append(f"{path}:{i}: not a JSON object")
    return rows


def read_json(path: Path, bad: list[str]) -> dict[str, Any]:
    """A JSON object file ({} when absent; a parse error or a non-object is reported in ``bad``)."""
    if not path.exists():
        return {}
    try:
        obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        bad.append(f"{path}: {e}")
        return {}
    if not isinstance(obj, dict):
        bad.append(f"{path}: not a JSON object")
        return {}
    return obj


def load_run(path: str | Path) -> Run:
    """Read ``metrics.jsonl``, ``samples.jsonl``, ``config.toml``, ``results.json`` and ``summary.json`` of a run folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    run = Run(path=p)
    run.metrics = read_jsonl(p / "metrics.jsonl", run.bad_lines)
    run.samples = read_jsonl(p / "samples.jsonl", run.bad_lines)
    if (p / "config.toml").exists():
        run.config_text = (p / "config.toml").read_text()
    run.results = read_json(p / "results.json", run.bad_lines)
    run.summary = read_json(p / "summary.json", run.bad_lines)
    return run


def is_compare_dir(path: Path) -> bool:
    """A compare dir holds ``results.md`` or sub-folders that are runs (``metrics.jsonl``) and no metrics itself."""
    if (path / "metrics.jsonl").exists():
        return False
    return (path / "results.md").exists() or any((d / "metrics.jsonl").exists() for d in sub_runs(path))


def sub_runs(path: Path) -> list[Path]:
    return sorted(d for d in path.iterdir() if d.is_dir() and (d / "metrics.jsonl").exists())


# --------------------------------------------------------------------------- metrics
def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of a numeric metric over the rows that have it (step = ``step`` or row index + 1)."""
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = r.get(key)
        if is_number(v):
            step = r.get("step", i + 1)
            xs.append(float(step) if is_number(step) else float(i + 1))
            ys.append(float(v))
    return xs, ys


def metric_groups(keys: set[str]) -> dict[str, list[str]]:
    """Group logged metric names into the report's panels (a panel lists the keys it found); the
    headline panels (reward, EM) come first."""

    def first(*cands: str) -> list[str]:
        for c in cands:
            for k in (f"rollout/{c}", c):
                if k in keys:
                    return [k]
        return []

    def present(*cands: str) -> list[str]:
        return [x for c in cands for x in first(c)]

    numeric = sorted(keys)
    return {
        "Reward": first("reward_mean", "reward", "rewards/em_reward/mean") + first("reward_std"),
        "Exact match (training rollouts, greedy dev)": first("em", "train/em") + [k for k in numeric if k.startswith("dev") and "em" in k],
        "Searches per rollout": first("searches_per_rollout", "num_searches"),
        "Validity": present("validity_rate", "invalid_turn_rate", "answered_rate"),
        "Loss parts": [k for k in numeric if k == "loss" or k.startswith("loss/") or k in ("hind/L_hind", "igsd/L_igsd")],
        "HindSearch weights": present("hind/mean_w", "hind/frac_w_pos", "hind/mean_lT_minus_lS", "hind/critique_minus_neutral",
                                      "hind/failed_frac"),
        "Share of the update": present("hind/grad_share", "igsd/grad_share"),
        "IGSD gate statistics": [k for k in numeric if k.startswith("igsd/") and any(s in k for s in ("gate", "delta"))],
        "Lengths": present("completion_len", "generated_len", "prompt_len"),
    }


def time_keys(keys: set[str]) -> list[str]:
    """Step time parts (``time/*`` except the wall and CPU totals)."""
    return sorted(k for k in keys if k.startswith("time/") and k not in ("time/step", "time/step_cpu"))


def summary_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """``[metric, first, last, median]`` of the main metrics and the step time."""
    cands = ("reward_mean", "em", "searches_per_rollout", "validity_rate")
    keys = [x for c in cands for x in (c, f"rollout/{c}") if any(x in r for r in rows)]
    keys += ["time/step"] if any("time/step" in r for r in rows) else []
    out = []
    for k in keys:
        _, ys = series(rows, k)
        if ys:
            out.append([k, f"{ys[0]:.3g}", f"{ys[-1]:.3g}", f"{sorted(ys)[len(ys) // 2]:.3g}"])
    return out
