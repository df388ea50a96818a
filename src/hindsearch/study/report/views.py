"""Plain data the templates render: metrics, evaluation and probe tables, the trajectory browser
(turns, critiques, per-token teacher log-probs, IGSD pairs) and a comparison's results, bars and
differences."""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hindsearch.study.report.browse import (Evidence, evidence_of, grouped, hops_key, read_qa,
                                            train_qa_path, turn_quality)
from hindsearch.study.report.env import environment
from hindsearch.study.report.header import run_header
from hindsearch.study.report.plots import bar_plot, plot_lines, time_plot
from hindsearch.study.report.runs import (MAX_BAD_SHOWN, MAX_DOC_BYTES, Run, finite, health_groups,
                                          is_number, is_value, left_out, metric_groups, plottable,
                                          read_json, run_rows, scaled, series, show_number,
                                          sub_runs, summary_rows, text, time_keys)

MAX_SAMPLES = 200
"""Rollouts shown per run (the most recent steps first are kept when there are more)."""


MAX_SAMPLES_COMPARED = 40
"""Rollouts shown per run of a comparison page (one section per (method, seed) run keeps the page a
few MB)."""


T = TypeVar("T")

MAX_SERIES = 12
"""Lines drawn per panel (a folder logging thousands of ``loss/*`` keys gets the first ones and a
note naming how many were not drawn, not a minute of legend layout)."""

SHADES = 10
"""Opacity steps of the per-token colours (CSS classes ``g0..g9`` and ``r0..r9``)."""


def guarded(what: str, bad: list[str], fn: Callable[[], T], default: T) -> T:
    """``fn()``, or ``default`` with ``what`` and the reason added to ``bad``: one value no part of
    the view foresaw costs that part, never the page."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the page is always written; the reason is shown on it
        bad.append(f"{what}: could not be shown ({type(e).__name__}: {text(str(e))[:200]})")
        return default


def dev_points(run: Run) -> tuple[list[tuple[float, float]], list[str]]:
    """Dev EM against step (``results.dev_curve``'s points, read tolerantly): the base evaluation
    (step 0), ``dev_curve.jsonl`` and the evaluation after RL (at ``summary.json``'s ``steps``); the
    values that cannot be plotted are returned as ``"<value> (step N)"``."""
    pts: dict[float, float] = {}
    skipped: list[str] = []

    def add(step: Any, em: Any) -> None:
        if em is None:
            return
        if plottable(step) and plottable(em):
            pts[float(step)] = float(em)
        elif is_value(em) or is_value(step):
            skipped.append(f"{show_number(em)} (step {show_number(step)})")

    dev = run.summary.get("dev")
    dev = dev if isinstance(dev, dict) else {}
    base, rl = dev.get("base"), dev.get("rl")
    if isinstance(base, dict):
        add(0, base.get("em"))
    for row in run_rows(run.path / "dev_curve.jsonl", run.bad_lines):
        add(row.get("step"), row.get("em"))
    if isinstance(rl, dict) and run.summary.get("steps") is not None:
        add(run.summary.get("steps"), rl.get("em"))
    return sorted(pts.items()), skipped


def not_plotted(parts: Sequence[tuple[str, list[str]]], limit: int = 6) -> str | None:
    """The note under a panel naming the values left out of its plot (None when none was)."""
    items = [f"{text(k)} = {v}" for k, vs in parts for v in vs]
    if not items:
        return None
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return (f"not plotted ({len(items)} NaN, infinite or out-of-range values): "
            + "; ".join(items[:limit]) + more)


def panel(title: str, plot: Callable[[], str | None], left: Sequence[tuple[str, list[str]]],
          extra: str | None = None) -> dict[str, Any]:
    """One plot panel: ``{"title", "img", "error", "note"}`` (img None when nothing plottable was
    recorded)."""
    errs: list[str] = []
    img = guarded("plot", errs, plot, None)
    note = "; ".join(n for n in (extra, not_plotted(left)) if n) or None
    return {"title": title, "img": img, "error": errs[0] if errs else None, "note": note}


def capped(keys: list[str]) -> tuple[list[str], str | None]:
    """The first ``MAX_SERIES`` keys, and the note naming how many more were not drawn."""
    if len(keys) <= MAX_SERIES:
        return keys, None
    return keys[:MAX_SERIES], f"{MAX_SERIES} of {len(keys)} series drawn (the first by name)"


def metrics_view(run: Run) -> dict[str, Any]:
    """Summary rows and plot panels (``panel``) of one run."""
    keys = {k for r in run.metrics for k, v in r.items() if is_value(v)}
    panels = []
    for title, ks in metric_groups(keys).items():
        ks, extra = capped(ks)
        data = [(k, *series(run.metrics, k)) for k in ks]
        left = [(k, left_out(run.metrics, k)) for k in ks]
        if title.startswith("Exact match"):
            dev, skipped = dev_points(run)
            data.append(("dev EM (greedy)", [s for s, _ in dev], [v for _, v in dev]))
            left.append(("dev EM (greedy)", skipped))
        panels.append(panel(title, lambda data=data, title=title: plot_lines(data, title), left,
                            extra))
        if title.startswith("Exact match"):  # the headline: reward, EM, step time
            tks, extra_t = capped(time_keys(keys))
            panels.append(panel("Step time split", lambda tks=tks: time_plot(run.metrics, tks),
                                [(k, left_out(run.metrics, k)) for k in tks], extra_t))
    health = []
    for title, ks in health_groups(keys).items():
        data = [(k, *series(run.metrics, k)) for k in ks]
        why = "; ".join(n for n in (health_note(title, ks, run.config), constant_note(data))
                        if n) or None
        health.append(panel(title, lambda data=data, title=title: plot_lines(data, title),
                            [(k, left_out(run.metrics, k)) for k in ks], why))
    cut = next((i + 1 for i, p in enumerate(panels) if p["title"] == "Step time split"), 0)
    return {"steps": len(run.metrics), "summary": summary_rows(run.metrics),
            "headline": panels[:cut], "health": health, "panels": panels[cut:]}


def constant_note(data: Sequence[tuple[str, list[float], list[float]]]) -> str | None:
    """The series that hold one value at every logged step (their lines lie on top of each other):
    named, with the value, so a flat line at 0 is not read as missing."""
    same: dict[float, list[str]] = {}
    for k, xs, ys in data:
        if len(ys) > 1 and min(ys) == max(ys):
            same.setdefault(ys[0], []).append(text(k))
    if not same:
        return None
    if len(same) == 1 and len(next(iter(same.values()))) == len(data) > 3:
        return f"all {len(data)} lines = {next(iter(same)):.3g} at every step"
    return "; ".join(f"{', '.join(ks)} = {v:.3g} at every step" for v, ks in same.items())


def health_note(title: str, keys: list[str], cfg: dict[str, Any]) -> str | None:
    """Why a training-health panel is empty, where the config says (no KL is computed when
    ``train.kl_coef = 0``)."""
    if title.startswith("KL") and not keys:
        beta = cfg.get("train", {}).get("kl_coef") if isinstance(cfg.get("train"), dict) else None
        if is_number(beta) and beta == 0:
            return ("train.kl_coef = 0: TRL computes no KL to the reference model (it is not in "
                    "the loss)")
    return None


# --------------------------------------------------------------------------- evaluation and probes
EVAL_HEAD = ["", "EM", "1-hop EM", "2-hop EM", "n", "searches / q", "validity"]


def eval_cells(name: str, r: dict[str, Any]) -> list[str]:
    """One row of the evaluation table from a ``bench_row`` dict (rates in %)."""
    def pct(k: str) -> str:
        return scaled(r[k], 100, ".1f") if is_value(r.get(k)) else "-"

    searches = r.get("searches")
    return [text(name), pct("em"), pct("em_1hop"), pct("em_2hop"), text(r.get("n", "-")),
            scaled(searches, 1, ".2f") if is_value(searches) else "-", pct("validity")]


def evaluation_view(run: Run) -> list[list[str]]:
    """Rows of the evaluation table: dev EM per stage (``summary.json``), then each benchmark
    (``results.json``)."""
    rows = []
    dev = run.summary.get("dev")
    if isinstance(dev, dict):
        rows += [eval_cells(f"dev, {stage}", r) for stage, r in dev.items() if isinstance(r, dict)]
    benches = run.results.get("benchmarks")
    if isinstance(benches, dict):
        rows += [eval_cells(name, r) for name, r in benches.items() if isinstance(r, dict)]
    return rows


PROBE_HEAD = ["context", "usable", "rerun EM", "evidence recall", "searches/q", "search again",
              "hit missed", "u(D)", "EM from state", "P(search) 2-hop", "query lT-lS",
              "query lT-lN", "action lT-lS", "action lT-lN"]


PROBE_GAPS = ("query_lT_minus_lS", "query_lT_minus_neutral", "action_lT_minus_lS",
              "action_lT_minus_neutral")


def probe_view(path: Path) -> dict[str, Any] | None:
    """The teacher-probe table of ``path/probe.json`` (``hindsearch probe``; the columns of
    ``study.probe.format_probe``), ``{"error"}`` when unreadable, None when absent."""
    p = Path(path) / "probe.json"
    if not p.exists():
        return None

    def num(v: Any, scale: float, spec: str) -> str:
        if not is_value(v):
            raise TypeError(f"expected a number, got {type(v).__name__}")
        return scaled(v, scale, spec)

    def row(name: str, e: dict[str, Any], usable: Any) -> list[str]:
        r, s, g = e["rerun"], e["state"], e.get("gap", {})
        return [text(name), text(usable), num(r["em"], 100, ".1f"),
                num(r["evidence_recall"], 100, ".1f"), num(r["searches"], 1, ".2f"),
                num(s["search_again"], 100, ".1f"), num(s["hit_missed"], 100, ".1f"),
                num(s["u_D"], 1, ".2f"), num(s["em_from_state"], 100, ".1f"),
                num(e["p_search_two_hop"], 100, ".1f"),
                *(num(g[k], 1, "+.3f") if k in g else "-" for k in PROBE_GAPS)]

    bad: list[str] = []
    res = read_json(p, bad)
    if bad:
        return {"error": bad[0], "head": [], "rows": [], "note": ""}
    try:
        rows = [row("student (no hint)", res["student"], res["n_failed"])]
        rows += [row(name, e, e["usable"]) for name, e in res["hints"].items()]
        note = (f"On {text(res['n_failed'])} failed greedy training rollouts (of "
                f"{text(res['n_questions'])}; student EM {num(res['student_em'], 100, '.1f')}), "
                f"judge: {text(res['judge_kind'])}. Rates in %, u(D) and "
                "gaps in nats per token.")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return {"error": f"{text(str(p))}: unreadable ({type(e).__name__}: {text(str(e))[:200]})",
                "head": [], "rows": [], "note": ""}
    return {"error": None, "head": PROBE_HEAD, "rows": rows, "note": note}


# --------------------------------------------------------------------------- trajectories
def turns_of(sample: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The turns the trainer wrote with the sample (``Turn.record``: ``action``, ``content``,
    ``doc_ids``, ``doc_titles``, ``error``), as ``{"action", "content", "titles", "error"}``; None
    when the sample has no ``turns`` (runs from before samples carried them: the page says "turns
    not recorded")."""
    turns = sample.get("turns")
    if not isinstance(turns, list):
        return None
    return [{"action": text(t.get("action")), "content": text(t.get("content")),
             "titles": texts(t.get("doc_titles")),
             "error": None if not t.get("error") else text(t.get("error"))}
            for t in turns if isinstance(t, dict)]


def texts(v: Any) -> list[str]:
    """A list field as display texts: a list item by item, a lone value of the wrong type
    (``doc_titles = 5``) as itself, nothing as []."""
    if v is None or v == "" or v == [] or v == {}:
        return []
    return [text(x) for x in v] if isinstance(v, list) else [text(v)]


def token_colours(tokens: Sequence[str], diffs: Sequence[float]) -> list[dict[str, str]]:
    """``{"tok", "shade", "diff"}`` per token: shade ``g<k>`` (green) when the log-prob difference
    is > 0, ``r<k>`` (red) when not, ``k`` in ``0..SHADES-1`` growing with ``|diff|`` (saturating at
    2 nats; the CSS gives ``k`` the opacity ``0.05 + 0.6 k / (SHADES - 1)``, light enough to read
    the token); ``diff`` is the signed value for the tooltip."""
    out = []
    for tok, d in zip(tokens, diffs):
        f = finite(d)
        # NaN, an infinity or an out-of-range integer: uncoloured, the value shown as such
        if f is None:
            out.append({"tok": text(tok), "shade": "nf", "diff": show_number(d)})
            continue
        k = round(min(abs(f) / 2.0, 1.0) * (SHADES - 1))
        out.append({"tok": text(tok), "shade": f"{'g' if f > 0 else 'r'}{k}", "diff": f"{f:+.3f}"})
    return out


def shade_css() -> list[dict[str, str]]:
    """The shade classes of ``token_colours``: ``{"name", "rgba"}``."""
    return [{"name": f"{c}{k}", "rgba": f"rgba({rgb},{0.05 + 0.6 * k / (SHADES - 1):.2f})"}
            for c, rgb in (("g", "0,160,60"), ("r", "210,40,40")) for k in range(SHADES)]


def token_spans(tokens: list[str], diffs: list[float]) -> str:
    """The tokens as coloured ``<span class=tok>`` (``token_colours``; the value is in the ``title``
    tooltip)."""
    return str(environment().get_template("macros.html.j2").module.token_spans(
        token_colours(tokens, diffs)))


def _floats(xs: Any) -> list[Any] | None:
    """A list of numbers as it was logged (NaN, infinities, out-of-range integers kept:
    ``token_colours`` shows them uncoloured), None when it is not a list of numbers."""
    if isinstance(xs, list) and all(is_value(x) for x in xs):
        return xs
    return None


def hind_view(h: Any) -> dict[str, Any] | None:
    """A HindSearch sample's critique, judge flags and per-token teacher log-probs on the distilled
    tokens (``lT_minus_neutral`` with the neutral control, else the teacher's own ``lT``)."""
    if not isinstance(h, dict):
        return None
    crit = h.get("critique")
    extras = [[k, text(h[k])] for k in ("judge_kind", "critique_usable", "redactions",
                                        "judge_error", "judge_truncation")
              if h.get(k) not in (None, "", [], {})]
    toks = h.get("distill_tokens")
    label = "critique teacher − neutral-feedback teacher log-prob on distilled tokens"
    diffs = _floats(h.get("lT_minus_neutral"))
    if diffs is None:  # runs without the neutral control: the teacher's own log-probs
        label, diffs = "teacher log-prob on distilled tokens", _floats(h.get("lT"))
    tokens = (token_colours([text(t) for t in toks], diffs) if isinstance(toks, list) and toks
              and diffs else None)
    return {"critique": None if crit is None else text(crit), "extras": extras, "label": label,
            "tokens": tokens}


def igsd_pairs(g: Any) -> list[dict[str, Any]]:
    """The verified pairs of a sample's IGSD record (``{"igsd_pairs": [...]}``,
    ``igsd.pair_record``)."""
    pairs = g.get("igsd_pairs") if isinstance(g, dict) else None
    return [p for p in pairs if isinstance(p, dict)] if isinstance(pairs, list) else []


def cell(v: Any) -> str | None:
    """A table cell: floats signed to 3 decimals, lists joined by ``; ``, None stays None ("not
    recorded")."""
    if isinstance(v, float):
        return scaled(v, 1, "+.3f")
    if isinstance(v, list):
        return "; ".join(text(x) for x in v) or "(none)"
    return None if v is None else text(v)


IGSD_HEAD = ["student query", "student retrieved", "teacher query", "teacher retrieved",
             "token S / T", "IG_S", "IG_T", "delta", "gate"]


def igsd_view(g: Any) -> dict[str, Any] | None:
    """IGSD verified pairs as table rows (``{"cells", "open"}``; open = gate > 0.5); None when the
    sample has no IGSD record."""
    if not g:
        return None
    rows = []
    for p in igsd_pairs(g):
        gate = p.get("gate")
        rows.append({"open": (finite(gate) or 0.0) > 0.5, "cells": [
            cell(p.get("q_S")), cell(p.get("titles_S")), cell(p.get("q_T")),
            cell(p.get("titles_T")),
            f"{text(p.get('student_token', '?'))} / {text(p.get('teacher_token', '?'))}",
            cell(p.get("ig_S")), cell(p.get("ig_T")), cell(p.get("delta")), cell(gate)]})
    return {"head": IGSD_HEAD, "rows": rows}


def sample_reward(s: dict[str, Any]) -> float:
    """The reward as a finite float (0 when missing, not a number, NaN or infinite: such a rollout
    counts as failed)."""
    return finite(s.get("reward")) or 0.0


def sample_view(s: dict[str, Any], ev: Evidence | None = None,
                ok: bool | None = None) -> dict[str, Any]:
    """One rollout of the trajectory browser (the fields ``rollout_adapter.sample_records`` writes,
    or a row of an evaluation's ``trajectories.jsonl``: its ``benchmark`` and ``completion_text``).
    ``ok``: whether it succeeded (default: reward > 0); ``ev``: the evidence its searches are scored
    against (``browse.turn_quality``)."""
    reward = sample_reward(s)
    ok = reward > 0 if ok is None else ok
    comp = s.get("completion", s.get("completion_text"))
    raw = s.get("reward")
    turns = turns_of(s)
    recall = share = None
    if turns is not None:
        quality, recall, share = turn_quality([t for t in s["turns"] if isinstance(t, dict)],
                                              ev or Evidence())
        turns = [{**t, **q, "marked": list(zip(t["titles"], q["hits"]
                                               + [False] * (len(t["titles"]) - len(q["hits"]))))}
                 for t, q in zip(turns, quality)]
    bench = s.get("benchmark")
    return {"ok": ok, "reward": show_number(raw, "g") if is_value(raw) else f"{reward:g}",
            "step": None if "step" not in s and bench is not None else text(s.get("step", "?")),
            "benchmark": None if bench is None else text(bench),
            "question": text(s.get("question", "?")),
            "hops": "?" if s.get("hops") is None else text(s["hops"]),
            "gold": texts(s.get("golden_answers")), "turns": turns, "answer": text(s.get("answer")),
            "stop": text(s.get("stop_reason", "")),
            "hind": None if ok else hind_view(s.get("hind")),
            "igsd": igsd_view(s.get("igsd")), "completion": None if comp is None else text(comp),
            "recall": recall, "recall_share": share}


def broken_sample(s: dict[str, Any], reason: str) -> dict[str, Any]:
    """A rollout ``sample_view`` could not show: its step and question (as far as they show) and the
    reason."""
    bench = s.get("benchmark")
    return {"ok": False, "reward": "?", "step": text(s.get("step", "?")),
            "question": text(s.get("question", "?")),
            "benchmark": None if bench is None else text(bench),
            "hops": "?", "gold": [], "turns": [], "answer": f"(not shown: {reason})", "stop": "",
            "hind": None, "igsd": None, "completion": None, "recall": None, "recall_share": None}


def sample_views(samples: Sequence[dict[str, Any]], qa: dict[str, Any] | None = None,
                 ok: Callable[[dict[str, Any]], bool] | None = None
                 ) -> tuple[list[dict[str, Any]], int, set[str]]:
    """``sample_view`` of each sample (a sample that cannot be shown says why), how many had
    evidence to score their searches against, and where that evidence came from."""
    views, scored, sources = [], 0, set()
    for s in samples:
        errs: list[str] = []

        def one(s: dict[str, Any] = s) -> dict[str, Any]:
            nonlocal scored
            ev = evidence_of(s, qa)
            if ev:
                scored += 1
                sources.add(ev.source)
            return sample_view(s, ev, None if ok is None else ok(s))

        views.append(guarded("sample", errs, one, None) or broken_sample(s, errs[0]))
    return views, scored, sources


def retrieval_note(scored: int, shown: int, sources: set[str], qa_path: Path | None,
                   missing: str = "the training QA file was not found") -> str:
    """What the per-search retrieval quality of the browser is measured against, or why there is
    none."""
    if not shown:
        return ""
    if not scored:
        return ("Retrieval quality per search: not recorded (the rollouts carry no evidence"
                + (f", and {missing}" if qa_path is None else
                   f", and {text(str(qa_path))} names none for these questions") + ").")
    where = "; ".join(sorted(sources))
    if qa_path is not None and "the question's row of its QA file" in sources:
        where = where.replace("its QA file", text(str(qa_path)))
    return (f"Retrieval quality per search ({scored} of {shown} rollouts; evidence from {where}): "
            "the share of the question's evidence retrieved so far; retrieved passages that are "
            "evidence are marked ✓.")


def trajectories_view(run: Run, max_samples: int = MAX_SAMPLES,
                      anchor: str = "run") -> dict[str, Any]:
    samples = list(reversed(run.samples[-max_samples:]))
    qa_path, qa = None, None
    if any(not s.get("evidence") and s.get("qid") is not None for s in samples):
        qa_path = train_qa_path(run)
        qa = read_qa(qa_path, run.bad_lines)
    views, scored, sources = sample_views(samples, qa)
    return {"total": len(run.samples), "shown": len(samples),
            "failed": sum(1 for s in samples if sample_reward(s) <= 0),
            "critiques": sum(1 for s in samples if isinstance(s.get("hind"), dict)),
            "igsd_pairs": sum(len(igsd_pairs(s.get("igsd"))) for s in samples),
            "browser": grouped(views, anchor, "hops", hops_key),
            "retrieval_note": retrieval_note(scored, len(samples), sources, qa_path)}


NO_TRAJECTORIES = {"total": 0, "shown": 0, "failed": 0, "critiques": 0, "igsd_pairs": 0,
                   "browser": None, "retrieval_note": ""}


def run_view(run: Run, max_samples: int = MAX_SAMPLES, anchor: str = "run") -> dict[str, Any]:
    """Everything the template shows of one run: the header (``header.run_header``), metrics
    (headline, training health, the rest), evaluation, probes, trajectories (the last
    ``max_samples``, grouped), config, and the lines and parts that could not be read (all counted,
    the first ``MAX_BAD_SHOWN`` named). ``anchor``: the prefix of the page's ids for this run
    (unique on a page of several runs)."""
    bad = run.bad_lines
    view = {"name": text(run.path.name), "anchor": anchor,
            "header": guarded("header", bad, lambda: run_header(run), []),
            "metrics": guarded("metrics", bad, lambda: metrics_view(run), None) if run.metrics
            else None, "evaluation": guarded("evaluation", bad, lambda: evaluation_view(run), []),
            "probe": guarded("probe.json", bad, lambda: probe_view(run.path), None),
            "trajectories": guarded("trajectories", bad,
                                    lambda: trajectories_view(run, max_samples, anchor),
                                    NO_TRAJECTORIES),
            "config_text": run.config_text}
    return {**view, "bad_count": len(bad), "bad_lines": bad[:MAX_BAD_SHOWN]}


# --------------------------------------------------------------------------- compare dirs
def compare_plan(path: Path) -> tuple[list[str], list[int]]:
    """Methods and seeds of a comparison: ``compare.json`` when readable, else the ``results.json``
    of its runs."""
    from hindsearch.study.results import run_name

    plan = read_json(path / "compare.json", [])
    if isinstance(plan.get("methods"), list) and isinstance(plan.get("seeds"), list):
        return ([m for m in plan["methods"] if isinstance(m, str)],
                [int(s) for s in plan["seeds"] if finite(s) is not None and float(s).is_integer()])
    methods: list[str] = []
    seeds: set[int] = set()
    for d in sub_runs(path):
        r = read_json(d / "results.json", [])
        seed = r.get("seed")
        if (isinstance(r.get("method"), str) and finite(seed) is not None
            and float(seed).is_integer()
                and d.name == run_name(r["method"], int(seed))):
            methods += [] if r["method"] in methods else [r["method"]]
            seeds.add(int(r["seed"]))
    methods.sort(key=lambda m: (m != "grpo", m))
    return methods, sorted(seeds)


def read_png(path: Path) -> bytes:
    """An image file's bytes: a regular file of at most ``MAX_DOC_BYTES`` (else ``OSError`` naming
    why)."""
    from hindsearch.fsutil import open_regular

    with open_regular(path, MAX_DOC_BYTES) as f:
        return f.read(MAX_DOC_BYTES)


def compare_view(path: Path) -> dict[str, Any]:
    """The comparison's results table and bars (mean ± std over seeds per method), the paired
    bootstrap against GRPO (table and bars with the 95% interval), ``curves.png`` and the probe
    table."""
    from hindsearch.study.results import RESULTS_NOTE, load_results

    bad: list[str] = []
    methods, seeds = guarded("compare.json", bad, lambda: compare_plan(path), ([], []))
    results = [clean_result(r, bad) for r in guarded(
        "results.json", bad, lambda: load_results(path, methods, seeds, bad), [])]
    view: dict[str, Any] = {"methods": methods, "seeds": seeds, "results": None, "bars": None,
                            "boot": None, "boot_bars": None, "note": RESULTS_NOTE, "curves": None,
                            "bad": bad,
                            "probe": guarded("probe.json", bad, lambda: probe_view(path), None)}
    guarded("results table", bad, lambda: results_view(view, results, methods), None)
    guarded("paired bootstrap", bad, lambda: bootstrap_view(view, path, methods, seeds), None)
    if (path / "curves.png").exists():
        view["curves"] = guarded("curves.png", bad,
                                 lambda: base64.b64encode(read_png(path / "curves.png")).decode(),
                                 None)
    return view


def clean_result(r: dict[str, Any], bad: list[str]) -> dict[str, Any]:
    """A run's ``results.json`` with only what the table can aggregate: ``method`` and ``seed`` as
    logged, ``step_s`` and each benchmark's numbers when finite (a value of another type, NaN, an
    infinity is dropped and named in ``bad``)."""
    name = f"{text(r.get('method'))}-s{text(r.get('seed'))}/results.json"
    out: dict[str, Any] = {"method": r.get("method")}
    seed = r.get("seed")
    # counted only
    out["seed"] = int(seed) if finite(seed) is not None and float(seed).is_integer() else math.nan
    step = r.get("step_s")
    out["step_s"] = float(step) if plottable(step) else None
    if step is not None and out["step_s"] is None:
        bad.append(f"{name}: step_s = {text(step)} left out (not a number in range)")
    benches = r.get("benchmarks")
    if benches is not None and not isinstance(benches, dict):
        bad.append(f"{name}: benchmarks is a {type(benches).__name__}, not an object; left out")
    out["benchmarks"] = {}
    for b, nums in (benches.items() if isinstance(benches, dict) else []):
        if not isinstance(nums, dict):
            bad.append(f"{name}: benchmark {text(b)} is a {type(nums).__name__}, not an object; "
                       "left out")
            continue
        keep = {}
        for k, v in nums.items():
            if plottable(v):
                keep[k] = float(v)
            elif v is not None:
                bad.append(f"{name}: {text(b)}.{text(k)} = {text(v)} left out (not a number in "
                           "range)")
        out["benchmarks"][b] = keep
    return out


def results_view(view: dict[str, Any], results: list[dict[str, Any]], methods: list[str]) -> None:
    """Fill the comparison's results table and its bars (mean ± std over seeds per method) into
    ``view``."""
    from hindsearch.study.results import aggregate, bench_names, columns, results_rows

    if results:
        agg, benches = aggregate(results, methods), bench_names(results)
        head, rows = results_rows(agg, benches)
        view["results"] = {"head": head, "rows": rows}
        cols = [c[0] for c in columns(benches)]

        def bar(v: Any) -> tuple[float, float, float] | None:
            return None if v is None else (100 * v[0], 100 * (v[0] - v[1]), 100 * (v[0] + v[1]))

        view["bars"] = guarded("bars", view["bad"], lambda: bar_plot(
            cols, {m: [bar(agg[m].get(c)) for c in cols] for m in methods},
            "EM per method (mean ± std over seeds)",
            "EM %"), None)


def bootstrap_view(view: dict[str, Any], path: Path, methods: list[str], seeds: list[int]) -> None:
    """Fill the paired bootstrap against GRPO (table and bars with the 95% interval) into
    ``view``."""
    from hindsearch.study.paired import bootstrap_rows
    from hindsearch.study.results import run_name

    try:
        boot = bootstrap_rows(lambda m, s: path / run_name(m, s), methods, seeds)
    # a damaged test trajectories file: say so, show the rest
    except (ValueError, KeyError, TypeError) as e:
        view["bad"].append(f"paired bootstrap: unreadable test trajectories ({type(e).__name__}: "
                           f"{text(str(e))[:200]})")
        boot = []
    if boot:
        keys = (("EM", "em"), ("EM 2-hop", "em_2hop"), ("evidence recall", "recall"))
        view["boot"] = {"head": ["method", "seeds", "questions"] + [k[0] for k in keys],
                        "rows": [[r["method"], str(r["seeds"]), str(r["questions"])]
                                 + [f"{100 * r[k][0]:+.1f} [{100 * r[k][1]:+.1f}, "
                                    f"{100 * r[k][2]:+.1f}]" for _, k in keys]
                                 for r in boot]}
        view["boot_bars"] = guarded("bootstrap bars", view["bad"], lambda: bar_plot(
            [k[0] for k in keys],
            {r["method"]: [tuple(100 * x for x in r[k]) for _, k in keys] for r in boot},
            "each method minus GRPO (paired bootstrap, 95% interval)", "points", zero_line=True),
                                    None)
