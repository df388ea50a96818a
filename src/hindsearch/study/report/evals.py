"""The page of an evaluation folder (``hindsearch eval --out DIR``): header, the benchmark table
with each EM's 95% interval (and the macro average's), EM bars with those intervals, the data
evaluated, and the trajectories.

Read from ``summary.json`` (``eval.evaluate``'s result: ``benchmarks``, ``order``, ``avg``,
``overall``, ``data``), the folder's marker (model, decoding, retriever, QA files, ``provenance``)
and ``trajectories.jsonl``. The trajectories are streamed: every row is counted, and the first
``EVAL_SHOWN`` failed and succeeded rows of each benchmark are shown (the heavy token arrays
dropped), grouped by outcome and benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hindsearch.study.report.browse import grouped, bench_key, read_qa
from hindsearch.study.report.header import eval_header
from hindsearch.study.report.plots import bar_plot
from hindsearch.study.report.runs import (MARKER, MAX_BAD_SHOWN, finite, is_value, read_json,
                                          run_rows, scaled, text)
from hindsearch.study.report.views import guarded, retrieval_note, sample_views

EVAL_SHOWN = 12
"""Rollouts shown per (benchmark, outcome) of an evaluation page."""

HEAVY = ("prompt_ids", "completion_ids", "gen_mask", "query_mask", "logprobs")
"""Token arrays of a trajectory row the page does not show (dropped as rows are read)."""

EVAL_COLUMNS = ["benchmark", "n", "EM", "EM 95% CI", "F1", "1-hop EM", "2-hop EM", "searches / q",
                "invalid turns %", "valid questions %", "answered %", "retrieval errors"]


def short_name(name: str) -> str:
    """The papers' name of a benchmark (``nq`` -> NQ, ``2wikimultihopqa`` -> 2Wiki), else the
    name."""
    from hindsearch.eval import DISPLAY, canonical

    return DISPLAY.get(canonical(name) or "", name)


def display_name(name: str) -> str:
    label = short_name(name)
    return label if label == name else f"{label} ({name})"


def pct(v: Any) -> str:
    return scaled(v, 100, ".1f") if is_value(v) else "-"


def interval(ci: Any) -> str:
    if isinstance(ci, list) and len(ci) == 2 and all(finite(x) is not None for x in ci):
        return f"{100 * ci[0]:.1f} – {100 * ci[1]:.1f}"
    return "-"


def bench_rows(summary: dict[str, Any], order: list[str]) -> list[list[str]]:
    """One row per benchmark (``eval.summarize``'s numbers; rates in %), then the macro average."""
    benches = summary.get("benchmarks") if isinstance(summary.get("benchmarks"), dict) else {}
    rows = []
    for name in order:
        b = benches.get(name)
        if not isinstance(b, dict):
            continue
        hops = b.get("em_by_hops") if isinstance(b.get("em_by_hops"), dict) else {}
        searches = b.get("searches_per_question")
        rows.append([display_name(name), text(b.get("n", "-")), pct(b.get("em")),
                     interval(b.get("em_ci95")), pct(b.get("f1")), pct(hops.get("1")),
                     pct(hops.get("2")), scaled(searches, 1, ".2f") if is_value(searches) else "-",
                     pct(b.get("invalid_rate")), pct(b.get("validity_rate")),
                     pct(b.get("answered_rate")), text(b.get("errors", "-"))])
    avg = summary.get("avg")
    if isinstance(avg, dict) and rows:
        k = avg.get("n_benchmarks", len(rows))
        rows.append([f"Avg of {text(k)}", "-", pct(avg.get("em")), interval(avg.get("em_ci95")),
                     pct(avg.get("f1"))]
                    + ["-"] * (len(EVAL_COLUMNS) - 5))
    return rows


def em_bars(summary: dict[str, Any], order: list[str]) -> str | None:
    """EM per benchmark (and the macro average) in %, with the 95% interval as the error bar."""
    benches = summary.get("benchmarks") if isinstance(summary.get("benchmarks"), dict) else {}
    groups, bars = [], []

    def bar(e: Any) -> tuple[float, float, float] | None:
        em, ci = finite(e.get("em")), e.get("em_ci95")
        if em is None:
            return None
        if isinstance(ci, list) and len(ci) == 2 and all(finite(x) is not None for x in ci):
            return 100 * em, 100 * min(ci[0], em), 100 * max(ci[1], em)
        return 100 * em, 100 * em, 100 * em

    for name in order:
        if isinstance(benches.get(name), dict):
            groups.append(short_name(name))
            bars.append(bar(benches[name]))
    avg = summary.get("avg")
    if isinstance(avg, dict) and groups:
        groups.append(f"Avg of {text(avg.get('n_benchmarks', len(groups)))}")
        bars.append(bar(avg))
    return bar_plot(groups, {"EM": bars}, "EM per benchmark (95% interval)", "EM %",
                    show_legend=False)


def data_lines(summary: dict[str, Any], order: list[str]) -> list[str]:
    """Each benchmark's QA file, its rows, the questions evaluated and whether it is a mini-wiki
    subset."""
    from hindsearch.eval import data_lines as md_lines

    data = summary.get("data")
    if not isinstance(data, dict):
        return []
    return [text(line.removeprefix("- ").replace("`", "")) for line in md_lines(data, order)]


def read_trajectories(path: Path, bad: list[str], per_group: int = EVAL_SHOWN
                      ) -> tuple[list[dict[str, Any]], dict[tuple[str, str], int], int]:
    """The first ``per_group`` failed and succeeded rows of each benchmark (without ``HEAVY``),
    every row's count per ``(outcome, benchmark)``, and the number of rows read. A bad line is named
    in ``bad`` and skipped."""
    kept: list[dict[str, Any]] = []
    counts: dict[tuple[str, str], int] = {}
    n = 0
    # one row at a time: an eval's file can be large
    for row in run_rows(path, bad, name=path.name):
        n += 1
        key = ("ok" if (finite(row.get("em")) or 0.0) > 0 else "fail",
               text(row.get("benchmark", "?")))
        counts[key] = counts.get(key, 0) + 1
        if counts[key] <= per_group:
            kept.append({k: v for k, v in row.items() if k not in HEAVY})
    return kept, counts, n


def qa_files(marker: dict[str, Any]) -> dict[str, Path]:
    """``{benchmark: QA file}`` the marker records (``eval.qa_file_record``), those that still
    exist."""
    data = marker.get("data")
    out = {}
    for name, rec in (data.items() if isinstance(data, dict) else []):
        p = rec.get("path") if isinstance(rec, dict) else None
        if isinstance(p, str) and Path(p).is_file():
            out[text(name)] = Path(p)
    return out


def eval_trajectories(path: Path, marker: dict[str, Any], order: list[str],
                      bad: list[str]) -> dict[str, Any]:
    rows, counts, n = read_trajectories(path / "trajectories.jsonl", bad)
    qa: dict[str, Any] = {}
    files = qa_files(marker)
    used = None
    for name in sorted(
            {text(r.get("benchmark")) for r in rows if not r.get("evidence")} & set(files)):
        # ids of two benchmarks may collide: keyed by (benchmark, id) below
        recs = read_qa(files[name], bad)
        qa.update({f"{name}\x00{k}": v for k, v in recs.items()})
        used = files[name] if used is None else used
    keyed = [{**r, "qid": f"{text(r.get('benchmark'))}\x00{text(r.get('qid'))}"} if qa else r
             for r in rows]
    views, scored, sources = sample_views(keyed, qa, ok=lambda r: (finite(r.get("em")) or 0.0) > 0)
    outcomes = (("fail", "failed"), ("ok", "succeeded"))
    # the groups are labelled by display name (NQ, 2Wiki ...), in the table's order
    names = [text(b) for b in order]
    totals: dict[tuple[str, str], int] = {}
    # two names of one benchmark (nq, naturalquestions) count together
    for (o, b), c in counts.items():
        totals[(o, short_name(b))] = totals.get((o, short_name(b)), 0) + c
    return {"total": n, "shown": len(views), "per_group": EVAL_SHOWN,
            "browser": grouped(views, "eval", "benchmark", bench_key(names, short_name),
                               outcomes, totals),
            "retrieval_note": retrieval_note(scored, len(views), sources,
                                             used if len(files) == 1 else None,
                                             "their QA files name none")}


def eval_view(path: Path) -> dict[str, Any]:
    """Everything the page shows of an evaluation folder (each part guarded: a damaged file costs
    its part)."""
    bad: list[str] = []
    summary = read_json(path / "summary.json", bad)
    marker = read_json(path / MARKER, bad)
    order = summary.get("order")
    benches = summary.get("benchmarks") if isinstance(summary.get("benchmarks"), dict) else {}
    order = [b for b in order if b in benches] if isinstance(order, list) else list(benches)
    order += [b for b in benches if b not in order]
    overall = summary.get("overall") if isinstance(summary.get("overall"), dict) else {}
    view = {
        "name": text(path.resolve().name),
        "header": guarded("header", bad, lambda: eval_header(summary, marker), []),
        "head": EVAL_COLUMNS,
        "rows": guarded("benchmark table", bad, lambda: bench_rows(summary, order), []),
        "note": text(summary.get("table_note") or ""),
        "bars": guarded("EM bars", bad, lambda: em_bars(summary, order), None),
        "data": guarded("data", bad, lambda: data_lines(summary, order), []),
        "overall": [[k, v] for k, v in (
            ("questions", text(overall.get("n", "-"))),
            ("valid questions %", pct(overall.get("validity_rate"))),
            ("invalid turns %", pct(overall.get("invalid_rate"))),
            ("trajectories with a retrieval error", text(overall.get("errors", "-"))),
            ("stop reasons",
             ", ".join(f"{text(k)} {text(v)}" for k, v in overall["stop_reasons"].items())
             if isinstance(overall.get("stop_reasons"), dict) else "-"))] if overall else [],
        "trajectories": guarded("trajectories", bad,
                                lambda: eval_trajectories(path, marker, order, bad), None),
    }
    if not summary:
        bad.insert(0, "summary.json: not written yet (the evaluation has not finished): no table")
    return {**view, "bad_count": len(bad), "bad_lines": bad[:MAX_BAD_SHOWN]}
