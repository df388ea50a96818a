"""``hindsearch report RUN_DIR``: one static HTML page per training run or comparison.

The page is rendered by jinja2 (autoescape on) from the templates in ``hindsearch/templates``;
every value read from a run folder is escaped, so markup in a question, critique or metric name
shows as text. It needs no server and no network (a Content-Security-Policy forbids scripts and
any fetch): plots are matplotlib PNGs inlined as base64 and styles are inline. It holds

- **curves** from ``metrics.jsonl`` and ``dev_curve.jsonl``: reward, EM (training rollouts and
  greedy dev EM), step time split first, then searches per rollout, validity, loss parts, the
  HindSearch weights, IGSD gate statistics and lengths; a metric that was not logged shows
  "not recorded";
- the **evaluation** table (``summary.json``'s dev EM before/after RL, ``results.json``'s benchmarks)
  and the **teacher probes** (``probe.json``) as tables;
- a **trajectory browser** over ``samples.jsonl`` (one collapsible ``<details>`` per rollout):
  question, gold answers, each turn (query and retrieved titles), the answer and reward; for failed
  rollouts the judge's critique and the per-token teacher log-probs on the distilled tokens (coloured
  spans: green = the critique teacher prefers the token, red = less; the value is the tooltip); for
  IGSD the verified pairs (student vs teacher query, what each retrieved, IG_S, IG_T, delta, gate).

A *compare dir* (``hindsearch compare --out DIR``: one run folder per (method, seed) with its
``results.json``) gets, from those numbers, the results table, bars per method with error bars
(mean ± sample std over seeds; each method minus GRPO with the paired-bootstrap 95% interval),
``curves.png``, then one section per run.

Field names are read tolerantly (several spellings); whatever is missing is reported as "not
recorded" rather than failing, so the page works for runs of every method and version.

``register(sub)`` adds both ``report`` and ``compare`` (the latter implemented in
``hindsearch.compare``, imported lazily).
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACTION_OR_INFO_RE = re.compile(r"<(search|answer)>(.*?)</\1>|<information>(.*?)(?:</information>|$)", re.DOTALL)
"""Actions and information blocks of a completion (a block cut by the length budget has no closing tag)."""
DOC_TITLE_RE = re.compile(r"Doc \d+\(Title: (.*?)\) ")
MAX_SAMPLES = 200
"""Rollouts shown per run (the most recent steps first are kept when there are more)."""
MAX_SAMPLES_COMPARED = 40
"""Rollouts shown per run of a comparison page (one section per (method, seed) run keeps the page a few MB)."""
SHADES = 10
"""Opacity steps of the per-token colours (CSS classes ``g0..g9`` and ``r0..r9``)."""
TEMPLATES = Path(__file__).parent / "templates"
"""The jinja2 templates of the page (shipped as package data)."""


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
def pick(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    """The value of the first key of ``names`` present in ``d`` (and not None)."""
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_to_b64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    _pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plot_lines(data: Sequence[tuple[str, list[float], list[float]]], title: str) -> str | None:
    """Base64 PNG of ``(label, steps, values)`` lines (None when none has a value)."""
    data = [d for d in data if d[1]]
    if not data:
        return None
    fig, ax = _pyplot().subplots(figsize=(4.2, 2.6))
    for k, xs, ys in data:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=k)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, framealpha=0.6)
    ax.grid(alpha=0.3)
    return fig_to_b64(fig)


def line_plot(rows: list[dict[str, Any]], keys: list[str], title: str) -> str | None:
    """Base64 PNG of the ``keys`` against step (None when none has a value)."""
    return plot_lines([(k, *series(rows, k)) for k in keys], title)


def time_plot(rows: list[dict[str, Any]], keys: list[str]) -> str | None:
    """Base64 PNG: stacked bars of the step time split (seconds) per step."""
    if not keys or not rows:
        return None
    steps = [float(r["step"]) if is_number(r.get("step")) else float(i + 1) for i, r in enumerate(rows)]
    fig, ax = _pyplot().subplots(figsize=(4.2, 2.6))
    bottom = [0.0] * len(rows)
    for k in keys:
        vals = [float(r[k]) if is_number(r.get(k)) else 0.0 for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=k.removeprefix("time/"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("Step time split (s)", fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    return fig_to_b64(fig)


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


def metrics_view(run: Run) -> dict[str, Any]:
    """Summary rows and plot panels (``{"title", "img"}``, img None when not recorded) of one run."""
    from hindsearch.compare import dev_curve

    keys = {k for r in run.metrics for k, v in r.items() if is_number(v)}
    panels = []
    for title, ks in metric_groups(keys).items():
        data = [(k, *series(run.metrics, k)) for k in ks]
        if title.startswith("Exact match"):
            dev = dev_curve(run.path)
            data.append(("dev EM (greedy)", [float(s) for s, _ in dev], [v for _, v in dev]))
        panels.append({"title": title, "img": plot_lines(data, title)})
        if title.startswith("Exact match"):  # the headline: reward, EM, step time
            panels.append({"title": "Step time split", "img": time_plot(run.metrics, time_keys(keys))})
    return {"steps": len(run.metrics), "summary": summary_rows(run.metrics), "panels": panels}


# --------------------------------------------------------------------------- evaluation and probes
EVAL_HEAD = ["", "EM", "1-hop EM", "2-hop EM", "n", "searches / q", "validity"]


def eval_cells(name: str, r: dict[str, Any]) -> list[str]:
    """One row of the evaluation table from a ``bench_row`` dict (rates in %)."""
    def pct(k: str) -> str:
        return f"{100 * r[k]:.1f}" if is_number(r.get(k)) else "-"

    searches = r.get("searches")
    return [name, pct("em"), pct("em_1hop"), pct("em_2hop"), str(r.get("n", "-")),
            f"{searches:.2f}" if is_number(searches) else "-", pct("validity")]


def evaluation_view(run: Run) -> list[list[str]]:
    """Rows of the evaluation table: dev EM per stage (``summary.json``), then each benchmark (``results.json``)."""
    rows = []
    dev = run.summary.get("dev")
    if isinstance(dev, dict):
        rows += [eval_cells(f"dev, {stage}", r) for stage, r in dev.items() if isinstance(r, dict)]
    benches = run.results.get("benchmarks")
    if isinstance(benches, dict):
        rows += [eval_cells(name, r) for name, r in benches.items() if isinstance(r, dict)]
    return rows


PROBE_HEAD = ["context", "usable", "rerun EM", "evidence recall", "searches/q", "search again", "hit missed", "u(D)",
              "EM from state", "P(search) 2-hop", "query lT-lS", "query lT-lN", "action lT-lS", "action lT-lN"]
PROBE_GAPS = ("query_lT_minus_lS", "query_lT_minus_neutral", "action_lT_minus_lS", "action_lT_minus_neutral")


def probe_view(path: Path) -> dict[str, Any] | None:
    """The teacher-probe table of ``path/probe.json`` (``hindsearch probe``; the columns of
    ``hindsight.probe.format_probe``), ``{"error"}`` when unreadable, None when absent."""
    p = Path(path) / "probe.json"
    if not p.exists():
        return None

    def row(name: str, e: dict[str, Any], usable: Any) -> list[str]:
        r, s, g = e["rerun"], e["state"], e.get("gap", {})
        return [name, str(usable), f"{100 * r['em']:.1f}", f"{100 * r['evidence_recall']:.1f}", f"{r['searches']:.2f}",
                f"{100 * s['search_again']:.1f}", f"{100 * s['hit_missed']:.1f}", f"{s['u_D']:.2f}",
                f"{100 * s['em_from_state']:.1f}", f"{100 * e['p_search_two_hop']:.1f}",
                *(f"{g[k]:+.3f}" if k in g else "-" for k in PROBE_GAPS)]

    try:
        res = json.loads(p.read_text())
        rows = [row("student (no hint)", res["student"], res["n_failed"])]
        rows += [row(name, e, e["usable"]) for name, e in res["hints"].items()]
        note = (f"On {res['n_failed']} failed greedy training rollouts (of {res['n_questions']}; student EM "
                f"{100 * res['student_em']:.1f}), judge: {res['judge_kind']}. Rates in %, u(D) and gaps in nats per token.")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return {"error": f"{p}: unreadable ({type(e).__name__}: {e})", "head": [], "rows": [], "note": ""}
    return {"error": None, "head": PROBE_HEAD, "rows": rows, "note": note}


# --------------------------------------------------------------------------- trajectories
def bare_title(title: str) -> str:
    from hindsearch.records import bare_title as bare

    return bare(title)


def turns_of(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The turns of a sample as ``{"action", "content", "titles"}``.

    From ``turns`` (``Trajectory.to_dict``) when present, else parsed from the completion text:
    each ``<search>``/``<answer>`` action, with the titles of the ``<information>`` block after it.
    """
    if isinstance(sample.get("turns"), list) and sample["turns"]:
        return [{"action": str(t.get("action", "?")), "content": str(t.get("content", "")),
                 "titles": [bare_title(str(x)) for x in t.get("doc_titles") or []]} for t in sample["turns"] if isinstance(t, dict)]
    text = str(pick(sample, "completion", "completion_text", default="") or "")
    turns: list[dict[str, Any]] = []
    for m in ACTION_OR_INFO_RE.finditer(text):
        if m.group(1):
            turns.append({"action": m.group(1), "content": m.group(2).strip(), "titles": []})
        elif turns and turns[-1]["action"] == "search":
            turns[-1]["titles"] = [bare_title(t) for t in DOC_TITLE_RE.findall(m.group(3))]
    if not turns and isinstance(sample.get("queries"), list):
        turns = [{"action": "search", "content": str(q), "titles": []} for q in sample["queries"]]
    return turns


def token_colours(tokens: Sequence[str], diffs: Sequence[float]) -> list[dict[str, str]]:
    """``{"tok", "shade", "diff"}`` per token: shade ``g<k>`` (green) when the log-prob difference is > 0,
    ``r<k>`` (red) when not, ``k`` in ``0..SHADES-1`` growing with ``|diff|`` (saturating at 2 nats; the CSS
    gives ``k`` the opacity ``0.05 + 0.6 k / (SHADES - 1)``, light enough to read the token); ``diff`` is the signed value for the tooltip."""
    out = []
    for tok, d in zip(tokens, diffs):
        k = round(min(abs(d) / 2.0, 1.0) * (SHADES - 1))
        out.append({"tok": str(tok), "shade": f"{'g' if d > 0 else 'r'}{k}", "diff": f"{d:+.3f}"})
    return out


def shade_css() -> list[dict[str, str]]:
    """The shade classes of ``token_colours``: ``{"name", "rgba"}``."""
    return [{"name": f"{c}{k}", "rgba": f"rgba({rgb},{0.05 + 0.6 * k / (SHADES - 1):.2f})"}
            for c, rgb in (("g", "0,160,60"), ("r", "210,40,40")) for k in range(SHADES)]


def token_spans(tokens: list[str], diffs: list[float]) -> str:
    """The tokens as coloured ``<span class=tok>`` (``token_colours``; the value is in the ``title`` tooltip)."""
    return str(environment().get_template("macros.html.j2").module.token_spans(token_colours(tokens, diffs)))


def _floats(xs: Any) -> list[float] | None:
    if isinstance(xs, list) and all(is_number(x) for x in xs):
        return [float(x) for x in xs]
    return None


def hind_view(h: Any) -> dict[str, Any] | None:
    """A HindSearch sample's critique, judge flags and per-token teacher log-probs on the distilled tokens."""
    if not isinstance(h, dict):
        return None
    crit = pick(h, "critique", "critique_text", "text")
    extras = [[k, str(h[k])] for k in ("judge_kind", "critique_usable", "redactions", "judge_error", "judge_truncation")
              if h.get(k) not in (None, "", [], {})]
    toks = pick(h, "distill_tokens", "query_tokens", "tokens", "query_token_strs")
    label, diffs = "critique teacher − neutral-feedback teacher log-prob on distilled tokens", _floats(pick(h, "lT_minus_neutral"))
    if diffs is None:  # runs without the neutral control: the teacher's own log-probs (older runs: lT_minus_lS)
        label, diffs = "teacher log-prob on distilled tokens", _floats(pick(h, "lT"))
    if diffs is None:
        label, diffs = "teacher − student log-prob on query tokens", _floats(pick(h, "lT_minus_lS", "teacher_minus_student"))
    tokens = token_colours([str(t) for t in toks], diffs) if isinstance(toks, list) and toks and diffs else None
    return {"critique": None if crit is None else str(crit), "extras": extras, "label": label, "tokens": tokens}


def igsd_pairs(g: Any) -> list[dict[str, Any]]:
    if isinstance(g, list):
        return [p for p in g if isinstance(p, dict)]
    if isinstance(g, dict):
        inner = pick(g, "igsd_pairs", "pairs", "verified_pairs", "positions")
        if isinstance(inner, list):
            return [p for p in inner if isinstance(p, dict)]
        if any(k in g for k in ("delta", "gate")):
            return [g]
    return []


def cell(v: Any) -> str | None:
    """A table cell: floats signed to 3 decimals, lists joined by ``; ``, None stays None ("not recorded")."""
    if isinstance(v, float):
        return f"{v:+.3f}"
    if isinstance(v, list):
        return "; ".join(str(x) for x in v) or "(none)"
    return None if v is None else str(v)


IGSD_HEAD = ["student query", "student retrieved", "teacher query", "teacher retrieved", "token S / T", "IG_S", "IG_T",
             "delta", "gate"]


def igsd_view(g: Any) -> dict[str, Any] | None:
    """IGSD verified pairs as table rows (``{"cells", "open"}``; open = gate > 0.5); None when the sample has no IGSD record."""
    if not g:
        return None
    rows = []
    for p in igsd_pairs(g):
        gate = pick(p, "gate", "g")
        rows.append({"open": is_number(gate) and gate > 0.5, "cells": [
            cell(pick(p, "q_S", "student_query", "q_s")), cell(pick(p, "titles_S", "student_titles", "titles_s")),
            cell(pick(p, "q_T", "teacher_query", "q_t")), cell(pick(p, "titles_T", "teacher_titles", "titles_t")),
            f"{p.get('student_token', '?')} / {p.get('teacher_token', '?')}",
            cell(pick(p, "ig_S", "ig_s", "IG_S")), cell(pick(p, "ig_T", "ig_t", "IG_T")), cell(pick(p, "delta")), cell(gate)]})
    return {"head": IGSD_HEAD, "rows": rows}


def sample_reward(s: dict[str, Any]) -> float:
    r = pick(s, "reward", "em", default=0.0)
    return float(r) if is_number(r) else 0.0


def sample_view(s: dict[str, Any]) -> dict[str, Any]:
    """One rollout of the trajectory browser."""
    reward = sample_reward(s)
    ok = reward > 0
    comp = pick(s, "completion", "completion_text")
    gold = s.get("golden_answers")
    return {"ok": ok, "reward": f"{reward:g}", "step": str(s.get("step", "?")), "question": str(s.get("question", "?")),
            "hops": str(s.get("hops", "?")), "gold": [str(a) for a in gold] if isinstance(gold, list) else [],
            "turns": turns_of(s), "answer": str(s.get("answer")), "stop": str(s.get("stop_reason", "")),
            "hind": None if ok else hind_view(pick(s, "hind", "hindsearch")), "igsd": igsd_view(s.get("igsd")),
            "completion": None if comp is None else str(comp)}


def trajectories_view(run: Run, max_samples: int = MAX_SAMPLES) -> dict[str, Any]:
    samples = run.samples[-max_samples:]
    return {"total": len(run.samples), "shown": len(samples),
            "failed": sum(1 for s in samples if sample_reward(s) <= 0),
            "critiques": sum(1 for s in samples if isinstance(pick(s, "hind", "hindsearch"), dict)),
            "igsd_pairs": sum(len(igsd_pairs(s.get("igsd"))) for s in samples),
            "samples": [sample_view(s) for s in reversed(samples)]}


def run_view(run: Run, max_samples: int = MAX_SAMPLES) -> dict[str, Any]:
    """Everything the template shows of one run: metrics, evaluation, probes, trajectories (the last ``max_samples``), config."""
    return {"name": run.path.name, "bad_lines": run.bad_lines[:10],
            "metrics": metrics_view(run) if run.metrics else None, "evaluation": evaluation_view(run),
            "probe": probe_view(run.path), "trajectories": trajectories_view(run, max_samples), "config_text": run.config_text}


# --------------------------------------------------------------------------- compare dirs
def compare_plan(path: Path) -> tuple[list[str], list[int]]:
    """Methods and seeds of a comparison: ``compare.json`` when readable, else the ``results.json`` of its runs."""
    from hindsearch.compare import run_name

    plan = read_json(path / "compare.json", [])
    if isinstance(plan.get("methods"), list) and isinstance(plan.get("seeds"), list):
        return [str(m) for m in plan["methods"]], [int(s) for s in plan["seeds"] if is_number(s)]
    methods: list[str] = []
    seeds: set[int] = set()
    for d in sub_runs(path):
        r = read_json(d / "results.json", [])
        if isinstance(r.get("method"), str) and is_number(r.get("seed")) and d.name == run_name(r["method"], int(r["seed"])):
            methods += [] if r["method"] in methods else [r["method"]]
            seeds.add(int(r["seed"]))
    methods.sort(key=lambda m: (m != "grpo", m))
    return methods, sorted(seeds)


def bar_plot(groups: Sequence[str], bars: dict[str, list[tuple[float, float, float] | None]], title: str,
             ylabel: str, zero_line: bool = False) -> str | None:
    """Base64 PNG of grouped bars: per group (x), one bar per key of ``bars`` at ``value`` with the error
    bar from ``low`` to ``high`` (``(value, low, high)``; None leaves the bar out). None when nothing to draw."""
    if not groups or not any(v for vals in bars.values() for v in vals):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(groups) * max(1, len(bars)) ** 0.5), 2.8))
    width = 0.8 / max(1, len(bars))
    for i, (name, vals) in enumerate(bars.items()):
        xs = [g + (i - (len(bars) - 1) / 2) * width for g, v in enumerate(vals) if v is not None]
        pts = [v for v in vals if v is not None]
        if pts:
            ax.bar(xs, [p[0] for p in pts], width, label=name,
                   yerr=[[p[0] - p[1] for p in pts], [p[2] - p[0] for p in pts]], capsize=3, error_kw={"lw": 1})
    if zero_line:
        ax.axhline(0, color="#444", lw=0.8)
    ax.set_xticks(range(len(groups)), list(groups), fontsize=7, rotation=20 if len(groups) > 4 else 0)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, framealpha=0.6)
    ax.grid(alpha=0.3, axis="y")
    return fig_to_b64(fig)


def compare_view(path: Path) -> dict[str, Any]:
    """The comparison's results table and bars (mean ± std over seeds per method), the paired bootstrap
    against GRPO (table and bars with the 95% interval), ``curves.png`` and the probe table."""
    from hindsearch.compare import RESULTS_NOTE, aggregate, bench_names, columns, load_results, results_rows, run_name
    from hindsearch.paired import bootstrap_rows

    methods, seeds = compare_plan(path)
    bad: list[str] = []
    results = load_results(path, methods, seeds, bad)
    view: dict[str, Any] = {"methods": methods, "seeds": seeds, "results": None, "bars": None, "boot": None,
                            "boot_bars": None, "note": RESULTS_NOTE, "probe": probe_view(path), "curves": None, "bad": bad}
    if results:
        agg, benches = aggregate(results, methods), bench_names(results)
        head, rows = results_rows(agg, benches)
        view["results"] = {"head": head, "rows": rows}
        cols = [c[0] for c in columns(benches)]

        def bar(v: Any) -> tuple[float, float, float] | None:
            return None if v is None else (100 * v[0], 100 * (v[0] - v[1]), 100 * (v[0] + v[1]))

        view["bars"] = bar_plot(cols, {m: [bar(agg[m].get(c)) for c in cols] for m in methods},
                                "EM per method (mean ± std over seeds)", "EM %")
    try:
        boot = bootstrap_rows(lambda m, s: path / run_name(m, s), methods, seeds)
    except (ValueError, KeyError, TypeError) as e:  # a damaged test trajectories file: say so, show the rest
        bad.append(f"paired bootstrap: unreadable test trajectories ({type(e).__name__}: {e})")
        boot = []
    if boot:
        keys = (("EM", "em"), ("EM 2-hop", "em_2hop"), ("evidence recall", "recall"))
        view["boot"] = {"head": ["method", "seeds", "questions"] + [k[0] for k in keys],
                        "rows": [[r["method"], str(r["seeds"]), str(r["questions"])]
                                 + [f"{100 * r[k][0]:+.1f} [{100 * r[k][1]:+.1f}, {100 * r[k][2]:+.1f}]" for _, k in keys]
                                 for r in boot]}
        view["boot_bars"] = bar_plot([k[0] for k in keys],
                                     {r["method"]: [tuple(100 * x for x in r[k]) for _, k in keys] for r in boot},
                                     "each method minus GRPO (paired bootstrap, 95% interval)", "points", zero_line=True)
    if (path / "curves.png").exists():
        view["curves"] = base64.b64encode((path / "curves.png").read_bytes()).decode()
    return view


# --------------------------------------------------------------------------- page
@functools.cache
def environment() -> Any:
    """The jinja2 environment of the templates: autoescape on, undefined names fail loudly."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def render(path: str | Path) -> str:
    """The HTML page of a run folder or a compare folder."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"run folder not found: {p}")
    compare, name = is_compare_dir(p), p.resolve().name
    if not compare and not any((p / f).exists() for f in ("metrics.jsonl", "summary.json", "config.toml")):
        raise ValueError(f"{p} is not a run or comparison folder (no metrics.jsonl, summary.json or config.toml)")
    if compare:
        title = f"hindsearch comparison: {name}"
        runs = [run_view(load_run(r), MAX_SAMPLES_COMPARED) for r in sub_runs(p)]
        cmp = compare_view(p)
    else:
        title = f"hindsearch run: {name}"
        runs, cmp = [run_view(load_run(p))], None
    return environment().get_template("report.html.j2").render(title=title, compare=cmp, runs=runs,
                                                                shades=shade_css())


def write_report(path: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) and return its path."""
    out_path = Path(out) if out else Path(path) / "report.html"
    text = render(path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text, encoding="utf-8")
    return out_path


# --------------------------------------------------------------------------- CLI
def _cmd_report(args: argparse.Namespace) -> int:
    out = write_report(args.run_dir, args.out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from hindsearch.compare import main_compare

    return main_compare(args)


def register(sub: Any) -> None:
    """Add the ``report`` and ``compare`` subcommands."""
    p = sub.add_parser("report", help="static HTML report of a run or comparison folder")
    p.add_argument("run_dir", help="run folder (metrics.jsonl, samples.jsonl) or compare folder")
    p.add_argument("--out", default=None, help="output file (default RUN_DIR/report.html)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=_cmd_report)

    from hindsearch.cli import positive_int

    c = sub.add_parser("compare", help="train and evaluate several methods x seeds from one warmed-up checkpoint")
    c.add_argument("--config", default="tiny-cpu",
                   help="base config: a TOML file or a shipped preset name, as for 'hindsearch train'")
    c.add_argument("--methods", default="grpo,hindsearch,hindsearch-nogold,igsd",
                   help="comma list of grpo, hindsearch, hindsearch-nogold, igsd, hindsearch+igsd")
    c.add_argument("--seeds", default="0,1", help="comma list of training seeds")
    c.add_argument("--steps", type=positive_int, default=None,
                   help="RL steps per run (default: the preset's train.steps)")
    c.add_argument("--mini", default=None, help="folder from 'hindsearch data mini' (adds the seven mini benchmarks)")
    c.add_argument("--mini-limit", type=positive_int, default=None,
                   help="questions per mini benchmark (default: the preset's eval.limit)")
    c.add_argument("--test-limit", type=positive_int, default=None, help="world test questions (default: all)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run (repeatable)")
    c.add_argument("--out", required=True, help="comparison folder (resumable)")
    c.add_argument("--no-report", action="store_true", help="do not write DIR/report.html")
    c.add_argument("--jobs", type=positive_int, default=1,
                   help="runs trained at once, each with cpu_count/jobs torch threads (2 on a 2-core CPU for micro)")
    c.add_argument("--probe", type=positive_int, default=0, metavar="N",
                   help="first probe the starting checkpoint on N failed training rollouts, into DIR/probe.json "
                        "(default: no probe)")
    c.add_argument("--debug", action="store_true", help="show tracebacks")
    c.set_defaults(func=_cmd_compare)
