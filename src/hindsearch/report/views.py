"""Plain data the templates render: metrics, evaluation and probe tables, the trajectory browser (turns,
critiques, per-token teacher log-probs, IGSD pairs) and a comparison's results, bars and differences."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hindsearch.report.env import environment
from hindsearch.report.plots import bar_plot, plot_lines, time_plot
from hindsearch.report.runs import (Run, is_number, metric_groups, read_json, series, sub_runs, summary_rows,
                                   time_keys)

MAX_SAMPLES = 200
"""Rollouts shown per run (the most recent steps first are kept when there are more)."""


MAX_SAMPLES_COMPARED = 40
"""Rollouts shown per run of a comparison page (one section per (method, seed) run keeps the page a few MB)."""


SHADES = 10
"""Opacity steps of the per-token colours (CSS classes ``g0..g9`` and ``r0..r9``)."""


def metrics_view(run: Run) -> dict[str, Any]:
    """Summary rows and plot panels (``{"title", "img"}``, img None when not recorded) of one run."""
    from hindsearch.results import dev_curve

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
def turns_of(sample: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The turns the trainer wrote with the sample (``Turn.record``: ``action``, ``content``, ``doc_ids``,
    ``doc_titles``, ``error``), as ``{"action", "content", "titles", "error"}``; None when the sample has no
    ``turns`` (runs from before samples carried them: the page says "turns not recorded")."""
    turns = sample.get("turns")
    if not isinstance(turns, list):
        return None
    return [{"action": str(t.get("action")), "content": str(t.get("content")),
             "titles": [str(x) for x in t.get("doc_titles") or []], "error": t.get("error")}
            for t in turns if isinstance(t, dict)]


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
    """A HindSearch sample's critique, judge flags and per-token teacher log-probs on the distilled tokens
    (``lT_minus_neutral`` with the neutral control, else the teacher's own ``lT``)."""
    if not isinstance(h, dict):
        return None
    crit = h.get("critique")
    extras = [[k, str(h[k])] for k in ("judge_kind", "critique_usable", "redactions", "judge_error", "judge_truncation")
              if h.get(k) not in (None, "", [], {})]
    toks = h.get("distill_tokens")
    label, diffs = "critique teacher − neutral-feedback teacher log-prob on distilled tokens", _floats(h.get("lT_minus_neutral"))
    if diffs is None:  # runs without the neutral control: the teacher's own log-probs
        label, diffs = "teacher log-prob on distilled tokens", _floats(h.get("lT"))
    tokens = token_colours([str(t) for t in toks], diffs) if isinstance(toks, list) and toks and diffs else None
    return {"critique": None if crit is None else str(crit), "extras": extras, "label": label, "tokens": tokens}


def igsd_pairs(g: Any) -> list[dict[str, Any]]:
    """The verified pairs of a sample's IGSD record (``{"igsd_pairs": [...]}``, ``igsd.driver.pair_record``)."""
    pairs = g.get("igsd_pairs") if isinstance(g, dict) else None
    return [p for p in pairs if isinstance(p, dict)] if isinstance(pairs, list) else []


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
        gate = p.get("gate")
        rows.append({"open": is_number(gate) and gate > 0.5, "cells": [
            cell(p.get("q_S")), cell(p.get("titles_S")), cell(p.get("q_T")), cell(p.get("titles_T")),
            f"{p.get('student_token', '?')} / {p.get('teacher_token', '?')}",
            cell(p.get("ig_S")), cell(p.get("ig_T")), cell(p.get("delta")), cell(gate)]})
    return {"head": IGSD_HEAD, "rows": rows}


def sample_reward(s: dict[str, Any]) -> float:
    r = s.get("reward")
    return float(r) if is_number(r) else 0.0


def sample_view(s: dict[str, Any]) -> dict[str, Any]:
    """One rollout of the trajectory browser (the fields ``rollout_adapter.sample_records`` writes)."""
    reward = sample_reward(s)
    ok = reward > 0
    comp = s.get("completion")
    gold = s.get("golden_answers")
    return {"ok": ok, "reward": f"{reward:g}", "step": str(s.get("step", "?")), "question": str(s.get("question", "?")),
            "hops": str(s.get("hops", "?")), "gold": [str(a) for a in gold] if isinstance(gold, list) else [],
            "turns": turns_of(s), "answer": str(s.get("answer")), "stop": str(s.get("stop_reason", "")),
            "hind": None if ok else hind_view(s.get("hind")), "igsd": igsd_view(s.get("igsd")),
            "completion": None if comp is None else str(comp)}


def trajectories_view(run: Run, max_samples: int = MAX_SAMPLES) -> dict[str, Any]:
    samples = run.samples[-max_samples:]
    return {"total": len(run.samples), "shown": len(samples),
            "failed": sum(1 for s in samples if sample_reward(s) <= 0),
            "critiques": sum(1 for s in samples if isinstance(s.get("hind"), dict)),
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
    from hindsearch.results import run_name

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


def compare_view(path: Path) -> dict[str, Any]:
    """The comparison's results table and bars (mean ± std over seeds per method), the paired bootstrap
    against GRPO (table and bars with the 95% interval), ``curves.png`` and the probe table."""
    from hindsearch.results import RESULTS_NOTE, aggregate, bench_names, columns, load_results, results_rows, run_name
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
