"""Evaluation: batched (greedy by default) rollouts over QA sets, EM/F1 per benchmark, resumable.

``evaluate`` writes ``summary.json``, ``results.md`` and ``trajectories.jsonl`` into a marked,
locked folder; a rerun reuses the finished rows only when the model, decoding, config, retriever and
QA files are the same, and redoes rows that recorded an error and a torn last line. The numbers and
the resume rules: docs/runs.md, "An evaluation folder".
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hindsearch.config import flat_keys
from hindsearch.fsutil import BadJsonl, drop_torn_tail, iter_jsonl
from hindsearch.records import QARecord, Trajectory
from hindsearch.tables import markdown_table

PAPER_BENCHMARKS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
DISPLAY = {"nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA",
           "2wiki": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle"}
_ALIASES = {"2wikimultihopqa": "2wiki", "2wikimultihop": "2wiki", "wikimultihopqa": "2wiki",
            "hotpot": "hotpotqa", "trivia": "triviaqa", "tqa": "triviaqa", "naturalquestions": "nq"}


def canonical(name: str) -> str | None:
    """The paper benchmark a dataset name refers to (``NQ``, ``2wikimultihopqa`` ...), or None."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    key = _ALIASES.get(key, key)
    return key if key in PAPER_BENCHMARKS else None


def column_order(names: Iterable[str]) -> list[str]:
    """Paper benchmarks first in the papers' order, then the other names in the given order."""
    names = list(names)
    paper = sorted((n for n in names if canonical(n)),
                   key=lambda n: PAPER_BENCHMARKS.index(canonical(n)))
    return paper + [n for n in names if not canonical(n)]


Z95 = 1.959963984540054
"""The two-sided 95% normal quantile."""


def wilson_interval(hits: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``hits / n``: unlike the normal one it stays inside [0,
    1] and is not empty at 0 or n hits (with 3 questions all wrong: [0, 0.56])."""
    if n <= 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return (0.0 if hits <= 0 else max(0.0, centre - half),
            1.0 if hits >= n else min(1.0, centre + half))


def macro_interval(parts: list[tuple[float, float, float]]) -> tuple[float, float]:
    """95% interval of the unweighted mean of K benchmarks' EM from each one's ``(em, lo, hi)`` (its
    Wilson interval), by MOVER (Zou & Donner 2008): mean -+ sqrt(sum(((em - lo) / K)^2)),
    sqrt(sum(((hi - em) / K)^2)). With many questions it is the normal interval of the mean; with
    few it stays as wide as the benchmarks' own intervals (a bootstrap over the questions would give
    0-0 when every answer is wrong)."""
    if not parts:
        return (0.0, 0.0)
    k = len(parts)
    mean = sum(p for p, _, _ in parts) / k
    down = sum(((p - lo) / k) ** 2 for p, lo, _ in parts) ** 0.5
    up = sum(((hi - p) / k) ** 2 for p, _, hi in parts) ** 0.5
    return (max(0.0, mean - down), min(1.0, mean + up))


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
        "em_ci95": list(wilson_interval(sum(t.em for t in trajs), n)),
        "f1": sum(t.f1 for t in trajs) / n,
        "searches_per_question": sum(t.num_searches for t in trajs) / n,
        "invalid_rate": sum(t.num_invalid for t in trajs) / turns if turns else 0.0,
        "gen_tokens_per_question": sum(sum(t.gen_mask) for t in trajs) / n,
        "validity_rate": sum(is_valid(t) for t in trajs) / n,
        "answered_rate": sum(t.answer is not None for t in trajs) / n,
        "errors": sum(1 for t in trajs if t.errors),
        "stop_reasons": dict(Counter(t.stop_reason for t in trajs)),
    }
    by: dict[int, list[Trajectory]] = {}
    for t in trajs:
        if t.hops is not None:
            by.setdefault(t.hops, []).append(t)
    # a one-hop question searched twice is over-search: a policy that learned "search again"
    # everywhere
    if by:
        res["em_by_hops"] = {str(h): sum(t.em for t in ts) / len(ts)
                             for h, ts in sorted(by.items())}
        res["n_by_hops"] = {str(h): len(ts) for h, ts in sorted(by.items())}
        res["searches_by_hops"] = {str(h): sum(t.num_searches for t in ts) / len(ts)
                                   for h, ts in sorted(by.items())}
        res["multi_search_by_hops"] = {str(h): sum(t.num_searches >= 2 for t in ts) / len(ts)
                                       for h, ts in sorted(by.items())}
    return res


def format_table(benchmarks: dict[str, dict[str, Any]], order: list[str],
                 avg: dict[str, Any] | None = None) -> str:
    """Markdown table: one column per benchmark (+ "Avg of K"), rows EM, its 95% interval, F1
    (x100), searches/q, invalid turns %, valid questions %, tokens/q, n. ``avg`` is ``evaluate``'s
    (with the macro EM interval); without it the Avg column is the plain mean and has no
    interval."""
    cols = [DISPLAY.get(canonical(n) or "", n) for n in order] + [f"Avg of {len(order)}"]
    if avg is None:
        avg = ({k: sum(benchmarks[n][k] for n in order) / len(order) for k in ("em", "f1")} if order
               else {})

    def row(label: str, key: str, scale: float, fmt: str, with_avg: bool) -> list[str]:
        vals = [format(benchmarks[n].get(key, 0.0) * scale, fmt) for n in order]
        return [label, *vals, format(avg[key] * scale, fmt) if with_avg and key in avg else ""]

    def interval(ci: Any) -> str:
        return (f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}" if isinstance(ci, (list, tuple))
                and len(ci) == 2 else "")

    return markdown_table(["metric", *cols], [
        row("EM", "em", 100, ".1f", True),
        ["EM 95% CI", *(interval(benchmarks[n].get("em_ci95")) for n in order),
         interval(avg.get("em_ci95"))],
        row("F1", "f1", 100, ".1f", True),
        row("searches/q", "searches_per_question", 1, ".2f", False),
        row("invalid turns %", "invalid_rate", 100, ".1f", False),
        row("valid questions %", "validity_rate", 100, ".1f", False),
        row("gen tokens/q", "gen_tokens_per_question", 1, ".1f", False),
        ["n", *(benchmarks[n]["n"] for n in order), sum(benchmarks[n]["n"] for n in order)]])


def table_note(n_benchmarks: int) -> str:
    """What the table's rows measure (below the table in ``results.md`` and after it on the
    console)."""
    return ("EM 95% CI: Wilson score interval over each benchmark's questions; for Avg of "
            f"{n_benchmarks} (the unweighted mean of the EM and F1 of {n_benchmarks} "
            f"benchmark{'s' * (n_benchmarks != 1)}), those intervals "
            "combined by MOVER (Zou & Donner 2008). invalid turns %: the model turns without a "
            "well-formed search or answer, of all model turns (a share of turns, not of "
            "questions); valid questions %: the questions with "
            "at least one well-formed search or answer.")


def count_rows(path: str | Path) -> int:
    """Rows in a QA file (JSON Lines: its non-blank lines; a JSON list or parquet: its items), bad
    ones included."""
    from hindsearch.data.qa import read_rows

    path = Path(path)
    if path.suffix in (".json", ".parquet"):
        return sum(1 for _ in read_rows(path))
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def mini_wiki_subset(path: str | Path | None, records: list[QARecord]) -> dict[str, Any] | None:
    """How a QA file is a subset of a mini-wiki's benchmark (``hindsearch data mini``), or None when
    it is not: its folder's ``mini.json`` names the file (``source``, ``kept`` of ``total``
    questions, ``rule``), or its rows carry the evidence ids that ``data mini`` records (then only
    that)."""
    if path is not None:
        meta_path = Path(path).parent / "mini.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            b = meta["benchmarks"][Path(path).stem]
            return {"source": b.get("source"), "kept": b.get("kept"), "total": b.get("total"),
                    "rule": b.get("rule"), "passages": meta.get("passages")}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    if any("evidence_ids" in r.metadata or "answer_passage_ids" in r.metadata for r in records):
        return {"source": None}
    return None


def describe_data(datasets: dict[str, list[QARecord]],
                  files: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per benchmark: ``file`` (the QA file, when ``files`` names one: ``{name: path or {"path":
    ...}}``), ``rows`` (its row count), ``evaluated`` (questions evaluated, after ``--limit``) and
    ``mini_wiki`` (``mini_wiki_subset``)."""
    out: dict[str, dict[str, Any]] = {}
    for name, recs in datasets.items():
        f = (files or {}).get(name)
        path = f.get("path") if isinstance(f, dict) else f
        rows = None
        if path is not None:
            try:
                rows = count_rows(path)
            except (OSError, ValueError):
                rows = None
        out[name] = {"file": None if path is None else str(path), "rows": rows,
                     "evaluated": len(recs), "mini_wiki": mini_wiki_subset(path, recs)}
    return out


def data_lines(data: dict[str, dict[str, Any]], order: list[str]) -> list[str]:
    """``results.md``'s data section: one line per benchmark."""
    lines = []
    for name in order:
        d = data.get(name)
        if not isinstance(d, dict):
            continue
        label = DISPLAY.get(canonical(name) or "", name)
        label = label if label == name else f"{label} (`{name}`)"
        where = f"`{d['file']}`" if d.get("file") else "questions given in memory (no file)"
        if d.get("rows") is not None:
            ev = d.get("evaluated")
            where += f", {d['rows']} rows, " + ("all evaluated" if ev == d["rows"]
                                                else f"{ev} evaluated")
        else:
            where += f", {d.get('evaluated')} questions evaluated"
        m = d.get("mini_wiki")
        if not m:
            sub = "not a mini-wiki subset"
        elif m.get("source"):
            sub = (f"a mini-wiki subset: {m.get('kept')} of the {m.get('total')} questions of "
                   f"{m['source']} whose evidence is in the mini-wiki corpus "
                   f"(rule {m.get('rule')})")
        else:
            sub = ("a mini-wiki subset (its rows carry mini-wiki evidence ids; no mini.json beside "
                   "it)")
        lines.append(f"- {label}: {where}; {sub}")
    return lines


def drop_error_rows(path: Path) -> int:
    """Remove the rows of ``path`` that recorded an error (they are redone); returns how many.

    The file is rewritten through a temporary file and an atomic rename, so a crash keeps either
    the old or the new file.
    """
    if not path.exists():
        return 0
    keep, dropped = [], 0
    # a torn last line stays torn
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
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
        tmp.write_text("".join(keep), encoding="utf-8")
        tmp.replace(path)
    return dropped


def read_done(path: Path) -> dict[tuple[str, str], Trajectory]:
    """Finished trajectories of an earlier run, keyed by (benchmark, question id); a torn last line
    (a killed writer's) is dropped from the file, and redone."""
    done: dict[tuple[str, str], Trajectory] = {}
    torn: list[str] = []
    try:
        for i, row in iter_jsonl(path, "drop-torn-tail", torn, objects=False):
            if not isinstance(row, dict) or "benchmark" not in row or "qid" not in row:
                raise ValueError(f"{path}:{i}: not an evaluation row (no 'benchmark' and 'qid'): "
                                 "this trajectories.jsonl was not written by hindsearch eval; give "
                                 "eval another --out")
            try:
                done[(row["benchmark"], row["qid"])] = Trajectory.from_dict(row)
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                raise ValueError(f"{path}:{i}: not an evaluation row ({type(e).__name__}: "
                                 f"{str(e)[:200]}): this trajectories.jsonl was not written by "
                                 "hindsearch eval; give eval another --out") from None
    except BadJsonl as e:
        raise ValueError(f"{e}; remove the line or the file to redo it") from None
    if torn:
        drop_torn_tail(path)
    return done


EVAL_FILES = ("trajectories.jsonl", "summary.json", "results.md")
"""What ``evaluate`` writes into its folder (with the marker and the lock)."""


class EvalMismatch(ValueError):
    """An evaluation folder's rows were made by another model, config or QA file than this
    rerun's."""


def model_identity(name: str, gguf_file: str | None = None) -> dict[str, Any]:
    """The model as recorded with evaluation rows: a hub name, or a local folder's resolved path
    with the size and modification time of its weight files (a retrained folder at the same path
    differs)."""
    p = Path(name)
    if p.is_dir():
        weights = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.iterdir())
                   if f.is_file() and f.suffix in (".safetensors", ".bin", ".gguf", ".pt")}
        ident: dict[str, Any] = {"path": str(p.resolve()), "weights": weights}
    else:
        ident = {"name": name}
    if gguf_file:
        ident["gguf_file"] = gguf_file
    return ident


ROLLOUT_SECTIONS = ("model", "rollout", "retrieval")
"""The config sections that shape an evaluation row (the model, how it is rolled out, what it
retrieves)."""


def config_record(cfg: Any) -> dict[str, Any]:
    """``{"config_sha256", "config"}``: the rollout-shaping sections of a ``Config``, and their
    hash."""
    import hashlib

    d = cfg.to_dict()
    part = {k: d[k] for k in ROLLOUT_SECTIONS if k in d}
    text = json.dumps(part, sort_keys=True, default=str)
    return {"config_sha256": hashlib.sha256(text.encode()).hexdigest(), "config": part}


def qa_file_record(path: str | Path) -> dict[str, Any]:
    from hindsearch.data.corpus import file_sha256

    return {"path": str(Path(path).resolve()), "sha256": file_sha256(path)}


def _describe_model(m: Any) -> str:
    if m is None:
        return "(not recorded)"
    if not isinstance(m, dict):
        return repr(m)
    return m.get("path") or m.get("name") or repr(m)


def _describe_retriever(r: Any) -> str:
    if not isinstance(r, dict):
        return repr(r)
    return str(r.get("index") or r.get("url") or r.get("index_dir") or r.get("config") or r)


def record_mismatch(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """What differs between the record of the rows in a folder (``old``) and this evaluation's
    (``new``), as one phrase, or None when the rows may be reused."""
    if old is None or "settings" not in old:
        return ("its rows carry no record of the model, config and QA files that made them (an "
                "older hindsearch)")
    if "model" in new and old.get("model") != new["model"]:
        a, b = old.get("model"), new["model"]
        if isinstance(a, dict) and isinstance(b, dict) and _describe_model(a) == _describe_model(b):
            return (f"the model {_describe_model(b)} changed since its rows were made (its weight "
                    "files differ)")
        return (f"its rows were made by the model {_describe_model(a)}, this evaluation uses "
                f"{_describe_model(b)}")
    if old.get("settings") != new["settings"]:
        def mode(x: Any) -> str:
            x = x or {}
            return (f"{'greedy decoding' if x.get('greedy') else 'sampling'} with seed "
                    f"{x.get('seed')}")
        return (f"its rows were made with {mode(old.get('settings'))}, this evaluation uses "
                f"{mode(new['settings'])}")
    if "config" in new and old.get("config_sha256") != new.get("config_sha256"):
        a, b = flat_keys(old.get("config") or {}), flat_keys(new["config"])
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return (f"its rows were made with {k} = {a.get(k)!r}, this evaluation has {k} = "
                        f"{b.get(k)!r}")
        return "its rows were made with another config (the hash differs)"
    if "retriever" in new and old.get("retriever") != new["retriever"]:
        a, b = _describe_retriever(old.get("retriever")), _describe_retriever(new["retriever"])
        if a == b:
            return f"the index {b} changed since its rows were made (its index.json differs)"
        return f"its rows were made with the retriever {a}, this evaluation uses {b}"
    for name, rec in (new.get("data") or {}).items():
        prev = (old.get("data") or {}).get(name)
        if prev is not None and prev.get("sha256") != rec.get("sha256"):
            same = prev.get("path") == rec.get("path")
            now = (" before the file changed" if same
                   else f", this evaluation reads {rec.get('path')}")
            return (f"benchmark {name!r}: its rows were made from {prev.get('path')}" + now
                    + " (the SHA-256 differs)")
    return None


def full_record(record: dict[str, Any] | None, greedy: bool, seed: int) -> dict[str, Any]:
    """``record`` with the decoding (greedy or sampled, and the seed, which ``summary.json`` reports
    too)."""
    return {**(record or {}), "settings": {"greedy": bool(greedy), "seed": seed}}


def reuse_problem(out: Path, record: dict[str, Any]) -> str | None:
    """Why the rows in ``out`` may not be reused by an evaluation described by ``record`` (None:
    they may, or there are none)."""
    from hindsearch.fsutil import read_marker

    if not any((out / n).exists() for n in EVAL_FILES):
        return None
    return record_mismatch(read_marker(out), record)


def refuse_message(out: Path, why: str) -> str:
    return (f"--out {out}: {why}; rerun with --fresh to start this folder anew, or choose another "
            "--out")


def _prepare_folder(out: Path, record: dict[str, Any], fresh: bool,
                    redo_on_change: bool, log: Any) -> None:
    """Check the rows in ``out`` were made by what ``record`` describes (or clear them), then record
    it."""
    from hindsearch.fsutil import claim_output, read_marker

    has_rows = any((out / n).exists() for n in EVAL_FILES)
    why = None if fresh else reuse_problem(out, record)
    if has_rows and (fresh or why):
        if why and not redo_on_change:
            raise EvalMismatch(refuse_message(out, why))
        for n in EVAL_FILES:
            (out / n).unlink(missing_ok=True)
        log(f"{out}: {why}; evaluating anew" if why
            else f"{out}: --fresh: the earlier rows are removed, evaluating anew")
    old = read_marker(out) if has_rows and not (fresh or why) else None
    data = {**((old or {}).get("data") or {}), **(record.get("data") or {})}
    claim_output(out, "eval", **{**record, "data": data})


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
    record: dict[str, Any] | None = None,
    fresh: bool = False,
    redo_on_change: bool = False,
) -> dict[str, Any]:
    """Evaluate ``engine`` on ``{benchmark: records}``; returns the summary (also
    ``out_dir/summary.json``).

    Batches may mix benchmarks. ``seed`` seeds sampling when ``greedy`` is False (batch ``b``
    uses ``seed + b``). With ``out_dir``, finished questions are appended to
    ``trajectories.jsonl`` after every batch and skipped on a rerun (rows with an error are redone
    unless ``redo_errors`` is False); the folder is locked against a second writer.

    ``record`` describes what makes the rows (``model``: ``model_identity``;
    ``config_sha256``/``config``: ``config_record``; ``retriever``; ``data``: ``{benchmark:
    qa_file_record}``); the decoding is added here. Rows of an earlier run are reused only when its
    record is the same (see ``record_mismatch``); otherwise ``EvalMismatch`` names what changed,
    unless ``fresh`` (start anew) or ``redo_on_change`` (start anew with a message: the main job's
    own dev evaluations).
    """
    for name, recs in datasets.items():
        seen: set[str] = set()
        for r in recs:
            if r.id in seen:
                raise ValueError(f"benchmark {name!r}: duplicate question id {r.id!r} (ids key the "
                                 "resume)")
            seen.add(r.id)
    if out_dir is None:
        return _evaluate(engine, datasets, None, batch_size, greedy, seed, progress, redo_errors,
                         log, (record or {}).get("data"))
    from hindsearch.fsutil import FolderLock, guard_output

    out = guard_output(out_dir, "eval", "evaluation folder")
    full = full_record(record, greedy, seed)
    with FolderLock(out, "evaluation folder", log=log):
        _prepare_folder(out, full, fresh, redo_on_change, log)
        return _evaluate(engine, datasets, out, batch_size, greedy, seed, progress, redo_errors,
                         log, (record or {}).get("data"))


def _evaluate(engine: Any, datasets: dict[str, list[QARecord]], out: Path | None, batch_size: int,
              greedy: bool, seed: int, progress: bool, redo_errors: bool, log: Any,
              files: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    traj_path = out / "trajectories.jsonl" if out else None
    if traj_path and redo_errors:
        n = drop_error_rows(traj_path)
        if n:
            log(f"{traj_path}: redoing {n} question(s) whose earlier rows recorded an error "
                "(--keep-errors keeps such rows)")
    done = read_done(traj_path) if traj_path else {}
    # a reused row must be of this question (ids of another file may collide)
    for name, recs in datasets.items():
        for r in recs:
            t = done.get((name, r.id))
            if t is not None and (t.question != r.question
                                  or list(t.golden_answers) != list(r.golden_answers)):
                raise EvalMismatch(refuse_message(
                    out, f"benchmark {name!r} question id {r.id!r}: its row holds another question "
                    "or golds than this QA file's"))
    todo = [(name, r) for name, recs in datasets.items() for r in recs if (name, r.id) not in done]
    total = sum(len(v) for v in datasets.values())
    bar = None
    if progress:
        from hindsearch.progress import progress_bar

        # plain lines off a terminal
        bar = progress_bar(total, "eval", unit="q", initial=total - len(todo))
    for b, start in enumerate(range(0, len(todo), batch_size)):
        batch = todo[start : start + batch_size]
        trajs = engine.rollout([r for _, r in batch], num_generations=1, greedy=greedy,
                               seed=None if greedy else seed + b)
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
    avg: dict[str, Any] = {k: sum(benchmarks[n][k] for n in scored) / len(scored) if scored else 0.0
                           for k in ("em", "f1")}
    avg["n_benchmarks"] = len(scored)
    avg["em_ci95"] = list(
        macro_interval([(benchmarks[n]["em"], *benchmarks[n]["em_ci95"]) for n in scored]))
    result: dict[str, Any] = {
        "benchmarks": benchmarks,
        "order": order,
        "avg": avg,
        "overall": summarize([done[(n, r.id)] for n in datasets for r in datasets[n]]),
        "greedy": greedy,
        "seed": seed,
        "data": describe_data(datasets, files),
        "table": format_table(benchmarks, scored, avg),
        "table_note": table_note(len(scored)),
    }
    if out:
        (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        (out / "results.md").write_text(results_markdown(result), encoding="utf-8")
    return result


def results_markdown(result: dict[str, Any]) -> str:
    """``results.md``: the EM/F1 table and what it measured (its note), the data evaluated (each QA
    file, its row count, whether it is a mini-wiki subset) and the overall validity, errors and stop
    reasons."""
    o = result.get("overall", {})
    mode = "greedy" if result.get("greedy") else f"sampled (seed {result.get('seed')})"
    n_benchmarks = (result.get("avg") or {}).get("n_benchmarks") or 0
    note = result.get("table_note") or table_note(int(n_benchmarks))
    data = data_lines(result.get("data") or {}, list(result.get("order") or []))
    return (f"# Evaluation results\n\n{result['table']}\n\n{note}\n\n"
            + ("## Data\n\n" + "\n".join(data) + "\n\n" if data else "")
            + "## Overall\n\n"
            f"- decoding: {mode}\n"
            f"- questions: {o.get('n', 0)}\n"
            "- valid questions (at least one well-formed search or answer): "
            f"{100 * o.get('validity_rate', 0):.1f}%\n"
            f"- invalid turns (of all model turns): {100 * o.get('invalid_rate', 0):.1f}%\n"
            f"- trajectories with a retrieval error: {o.get('errors', 0)}\n"
            f"- stop reasons: {o.get('stop_reasons', {})}\n")


def bench_row(r: dict[str, Any]) -> dict[str, Any]:
    """EM overall and by hop count, n, searches per question, the share of one-hop questions
    searched at least twice (``multi_1hop``: over-search) and validity from one benchmark's entry of
    an ``evaluate`` result (the row of the before/after and comparison tables)."""
    by_hops = r.get("em_by_hops") or {}
    multi = r.get("multi_search_by_hops") or {}
    return {
        "em": r.get("em"),
        "em_1hop": by_hops.get("1"),
        "em_2hop": by_hops.get("2"),
        "multi_1hop": multi.get("1"),
        "n": r.get("n"),
        "searches": r.get("searches_per_question"),
        "validity": r.get("validity_rate"),
    }
