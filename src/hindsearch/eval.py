"""Evaluation: batched (greedy by default) rollouts over QA sets, EM/F1 per benchmark, resumable.

``evaluate(engine, datasets, out_dir)`` rolls out every question once, in batches, and
returns (and writes to ``summary.json``) per benchmark: ``n``, ``em``, ``f1``,
``searches_per_question``, ``invalid_rate`` (invalid turns / all model turns),
``gen_tokens_per_question`` (tokens the model produced), ``validity_rate`` (fraction of
trajectories with at least one well-formed search or answer), ``errors`` (trajectories with a
recorded retrieval error), ``stop_reasons`` and ``em_by_hops`` (when records have ``hops``);
plus the macro average of EM/F1 over benchmarks and a markdown table in the papers' column
order (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle, then other names in the
given order, then Avg).

Resume: each finished batch is appended to ``trajectories.jsonl`` (one row per question, with
its ``benchmark``); a rerun skips every (benchmark, question id) already there, except rows that
recorded an error (e.g. the retrieval server was down): those are removed from the file and
redone, and the rerun says how many (``redo_errors=False``, ``hindsearch eval --keep-errors``,
keeps them). A torn last line (a crash mid-write) is dropped and redone; any other bad line is an
error naming it. One writer per folder: ``OUT/.hindsearch.lock`` holds the evaluating process'
PID and a second evaluation into the same folder is refused (a stale lock is taken over).
``OUT/results.md`` holds the markdown table.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hindsearch.records import QARecord, Trajectory

PAPER_BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
DISPLAY = {"nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA", "2wiki": "2Wiki",
           "musique": "MuSiQue", "bamboogle": "Bamboogle"}
_ALIASES = {"2wikimultihopqa": "2wiki", "2wikimultihop": "2wiki", "wikimultihopqa": "2wiki", "hotpot": "hotpotqa",
            "trivia": "triviaqa", "tqa": "triviaqa", "naturalquestions": "nq"}


def canonical(name: str) -> str | None:
    """The paper benchmark a dataset name refers to (``NQ``, ``2wikimultihopqa`` ...), or None."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    key = _ALIASES.get(key, key)
    return key if key in PAPER_BENCHMARKS else None


def column_order(names: Iterable[str]) -> list[str]:
    """Paper benchmarks first in the papers' order, then the other names in the given order."""
    names = list(names)
    paper = sorted((n for n in names if canonical(n)), key=lambda n: PAPER_BENCHMARKS.index(canonical(n)))
    return paper + [n for n in names if not canonical(n)]


def is_valid(t: Trajectory) -> bool:
    """At least one well-formed search or answer action."""
    return any(tr.action in ("search", "answer") for tr in t.turns)


def summarize(trajs: list[Trajectory]) -> dict[str, Any]:
    """Metrics of one benchmark's trajectories (see the module docstring)."""
    n = len(trajs)
    if n == 0:
        return {"n": 0}
    turns = sum(len(t.turns) for t in trajs)
    res: dict[str, Any] = {
        "n": n,
        "em": sum(t.em for t in trajs) / n,
        "f1": sum(t.f1 for t in trajs) / n,
        "searches_per_question": sum(t.num_searches for t in trajs) / n,
        "invalid_rate": sum(t.num_invalid for t in trajs) / turns if turns else 0.0,
        "gen_tokens_per_question": sum(sum(t.gen_mask) for t in trajs) / n,
        "validity_rate": sum(is_valid(t) for t in trajs) / n,
        "answered_rate": sum(t.answer is not None for t in trajs) / n,
        "errors": sum(1 for t in trajs if t.errors),
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
    }
    hops = sorted({t.hops for t in trajs if t.hops is not None})
    if hops:
        res["em_by_hops"] = {str(h): sum(t.em for t in trajs if t.hops == h) / sum(1 for t in trajs if t.hops == h)
                             for h in hops}
        res["n_by_hops"] = {str(h): sum(1 for t in trajs if t.hops == h) for h in hops}
    return res


def format_table(benchmarks: dict[str, dict[str, Any]], order: list[str]) -> str:
    """Markdown table: one column per benchmark (+ Avg), rows EM, F1 (x100), searches/q, invalid %, tokens/q, n."""
    cols = [DISPLAY.get(canonical(n) or "", n) for n in order] + ["Avg"]
    avg = {k: sum(benchmarks[n][k] for n in order) / len(order) for k in ("em", "f1")} if order else {}

    def row(label: str, key: str, scale: float, fmt: str, with_avg: bool) -> str:
        vals = [format(benchmarks[n][key] * scale, fmt) for n in order]
        vals.append(format(avg[key] * scale, fmt) if with_avg and order else "")
        return f"| {label} | " + " | ".join(vals) + " |"

    lines = ["| metric | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [row("EM", "em", 100, ".1f", True), row("F1", "f1", 100, ".1f", True),
              row("searches/q", "searches_per_question", 1, ".2f", False),
              row("invalid %", "invalid_rate", 100, ".1f", False),
              row("gen tokens/q", "gen_tokens_per_question", 1, ".1f", False)]
    lines.append("| n | " + " | ".join(str(benchmarks[n]["n"]) for n in order) + " | " + str(sum(benchmarks[n]["n"] for n in order)) + " |")
    return "\n".join(lines)


def drop_error_rows(path: Path) -> int:
    """Remove the rows of ``path`` that recorded an error (they are redone); returns how many.

    The file is rewritten through a temporary file and an atomic rename, so a crash keeps either
    the old or the new file.
    """
    if not path.exists():
        return 0
    keep, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            keep.append(line)  # read_done reports it
            continue
        if isinstance(row, dict) and row.get("errors"):
            dropped += 1
        else:
            keep.append(line)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")
        tmp.replace(path)
    return dropped


def read_done(path: Path) -> dict[tuple[str, str], Trajectory]:
    """Finished trajectories of an earlier run, keyed by (benchmark, question id)."""
    done: dict[tuple[str, str], Trajectory] = {}
    if not path.exists():
        return done
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 (byte {e.start}): not the trajectories.jsonl of an evaluation; "
                         "give eval another --out") from None
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:
            if i == len(lines) - 1 and isinstance(e, json.JSONDecodeError):  # torn last line: drop it, it is redone
                path.write_text("".join(ln + "\n" for ln in lines[:i]), encoding="utf-8")
                break
            raise ValueError(f"{path}:{i + 1}: not valid JSON ({type(e).__name__}: {str(e)[:200]}); remove the line "
                             "or the file to redo it") from None
        if not isinstance(row, dict) or "benchmark" not in row or "qid" not in row:
            raise ValueError(f"{path}:{i + 1}: not an evaluation row (no 'benchmark' and 'qid'): this trajectories.jsonl "
                             "was not written by hindsearch eval; give eval another --out")
        try:
            done[(row["benchmark"], row["qid"])] = Trajectory.from_dict(row)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{path}:{i + 1}: not an evaluation row ({type(e).__name__}: {str(e)[:200]}): this "
                             "trajectories.jsonl was not written by hindsearch eval; give eval another --out") from None
    return done


def evaluate(
    engine: Any,
    datasets: dict[str, list[QARecord]],
    out_dir: str | Path | None = None,
    batch_size: int = 16,
    greedy: bool = True,
    seed: int = 0,
    progress: bool = True,
    redo_errors: bool = True,
    log: Any = print,
) -> dict[str, Any]:
    """Evaluate ``engine`` on ``{benchmark: records}``; returns the summary (also ``out_dir/summary.json``).

    Batches may mix benchmarks. ``seed`` seeds sampling when ``greedy`` is False (batch ``b``
    uses ``seed + b``). With ``out_dir``, finished questions are appended to
    ``trajectories.jsonl`` after every batch and skipped on a rerun (rows with an error are redone
    unless ``redo_errors`` is False); the folder is locked against a second writer.
    """
    for name, recs in datasets.items():
        seen: set[str] = set()
        for r in recs:
            if r.id in seen:
                raise ValueError(f"benchmark {name!r}: duplicate question id {r.id!r} (ids key the resume)")
            seen.add(r.id)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out}: is a file, not a folder; choose a folder for the evaluation")
    if out is None:
        return _evaluate(engine, datasets, None, batch_size, greedy, seed, progress, redo_errors, log)
    from hindsearch.fsutil import FolderLock

    with FolderLock(out, "evaluation folder", log=log):
        return _evaluate(engine, datasets, out, batch_size, greedy, seed, progress, redo_errors, log)


def _evaluate(engine: Any, datasets: dict[str, list[QARecord]], out: Path | None, batch_size: int, greedy: bool,
              seed: int, progress: bool, redo_errors: bool, log: Any) -> dict[str, Any]:
    traj_path = out / "trajectories.jsonl" if out else None
    if traj_path and redo_errors:
        n = drop_error_rows(traj_path)
        if n:
            log(f"{traj_path}: redoing {n} question(s) whose earlier rows recorded an error "
                "(--keep-errors keeps such rows)")
    done = read_done(traj_path) if traj_path else {}
    todo = [(name, r) for name, recs in datasets.items() for r in recs if (name, r.id) not in done]
    total = sum(len(v) for v in datasets.values())
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=total - len(todo), desc="eval", unit="q", dynamic_ncols=True)
    for b, start in enumerate(range(0, len(todo), batch_size)):
        batch = todo[start : start + batch_size]
        trajs = engine.rollout([r for _, r in batch], num_generations=1, greedy=greedy, seed=None if greedy else seed + b)
        rows = []
        for (name, _), t in zip(batch, trajs):
            done[(name, t.qid)] = t
            rows.append(json.dumps({"benchmark": name, **t.to_dict()}, ensure_ascii=False))
        if traj_path:
            with traj_path.open("a", encoding="utf-8") as f:
                f.write("".join(r + "\n" for r in rows))
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    order = column_order(datasets)
    benchmarks = {n: summarize([done[(n, r.id)] for r in datasets[n]]) for n in datasets}
    scored = [n for n in order if benchmarks[n]["n"]]
    result: dict[str, Any] = {
        "benchmarks": benchmarks,
        "order": order,
        "avg": {k: sum(benchmarks[n][k] for n in scored) / len(scored) if scored else 0.0 for k in ("em", "f1")},
        "overall": summarize([done[(n, r.id)] for n in datasets for r in datasets[n]]),
        "greedy": greedy,
        "seed": seed,
        "table": format_table(benchmarks, scored),
    }
    if out:
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        (out / "results.md").write_text(results_markdown(result), encoding="utf-8")
    return result


def results_markdown(result: dict[str, Any]) -> str:
    """``results.md``: the EM/F1 table and the overall validity, errors and stop reasons."""
    o = result.get("overall", {})
    mode = "greedy" if result.get("greedy") else f"sampled (seed {result.get('seed')})"
    return (f"# Evaluation results\n\n{result['table']}\n\n"
            f"- decoding: {mode}\n"
            f"- questions: {o.get('n', 0)}\n"
            f"- valid protocol: {100 * o.get('validity_rate', 0):.1f}%\n"
            f"- trajectories with a retrieval error: {o.get('errors', 0)}\n"
            f"- stop reasons: {o.get('stop_reasons', {})}\n")


def bench_row(r: dict[str, Any]) -> dict[str, Any]:
    """EM overall and by hop count, n, searches per question and validity from one benchmark's entry
    of an ``evaluate`` result (the row of the before/after and comparison tables)."""
    by_hops = r.get("em_by_hops") or {}
    return {
        "em": r.get("em"),
        "em_1hop": by_hops.get("1"),
        "em_2hop": by_hops.get("2"),
        "n": r.get("n"),
        "searches": r.get("searches_per_question"),
        "validity": r.get("validity_rate"),
    }
