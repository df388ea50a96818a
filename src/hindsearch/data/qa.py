"""Load question-answer sets in the formats the field uses and normalise them to ``QARecord``.

``load_qa(path)`` reads ``.jsonl``, ``.json`` and ``.parquet`` rows of FlashRAG / Search-R1 / PopQA,
HotpotQA, 2WikiMultihopQA, MuSiQue, IRCoT and plain ``{question, answer}`` lists. A bad row raises
``QAError`` naming the file and line (or list item / parquet row), or with ``skip_bad=True`` is
skipped and counted in ``QAStats``; an unreadable file raises ``QAError`` naming it.
``paragraphs_of(row)`` returns a multi-hop row's own paragraphs; ``load_hf`` reads a Hugging Face
dataset. The fields read per format: docs/data.md, "Formats read".
"""

from __future__ import annotations

import codecs
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hindsearch.data.corpus import RowStats
from hindsearch.fsutil import BadJsonl, BadLine, iter_jsonl, json_problem
from hindsearch.records import QARecord

log = logging.getLogger(__name__)

ID_KEYS = ("id", "_id", "question_id", "test_id", "qid")
QUESTION_KEYS = ("question", "question_text", "query")
META_KEYS = ("type", "level", "answerable", "question_decomposition", "evidences", "dataset")


class QAError(ValueError):
    """A malformed QA row or file; the message names the file and the line/item."""


SKIP_HINT = "skip_bad=True skips bad rows; for an evaluation, hindsearch eval --skip-bad"
"""How to skip bad rows, appended to a bad row's error (``eval`` has the flag; ``train`` reads its
QA files strictly)."""


ROW_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)
"""What normalising one odd row can raise: each is that row's error (skipped with ``skip_bad``)."""


def not_utf8(data: bytes, e: UnicodeDecodeError) -> str:
    """Where a byte that is not UTF-8 is: ``line N: not UTF-8 (byte 0xff at column M)``."""
    line_start, line = data.rfind(b"\n", 0, e.start) + 1, data.count(b"\n", 0, e.start) + 1
    column = e.start - line_start + 1
    return (f"line {line}: not UTF-8 (byte 0x{data[e.start]:02x} at column {column}); "
            f"a QA file is UTF-8")


QAStats = RowStats
"""Counts filled while loading QA rows (the same type as the corpus reader's)."""


@dataclass(frozen=True)
class Paragraph:
    """A paragraph shipped with a multi-hop question."""

    title: str
    text: str
    supporting: bool = False


def _tolist(x: Any) -> Any:
    """numpy arrays (parquet list columns) -> list; anything else unchanged."""
    return x.tolist() if hasattr(x, "tolist") and not isinstance(x, (str, bytes)) else x


def read_rows(path: str | Path) -> Iterator[tuple[str, str | None, Any]]:
    """Yield ``(where, parse error or None, row)`` for every row of a QA file.

    ``where`` is ``"line N"`` (JSON Lines), ``"item N"`` (JSON list) or ``"row N"`` (parquet),
    1-based. A ``.json`` file that is not one JSON document is read as JSON Lines. A byte-order mark
    at the start of the file is read past.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"QA file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.ParquetFile(path).read().to_pylist()
        except Exception as e:  # noqa: BLE001
            # pyarrow raises ArrowInvalid, OSError, ... for a bad file
            raise QAError(f"{path}: not a readable parquet file "
                          f"({type(e).__name__}: {e})") from None
        for i, row in enumerate(rows, 1):
            yield f"row {i}", None, row
        return
    if path.suffix == ".json":
        raw = path.read_bytes()
        raw = raw[3:] if raw.startswith(codecs.BOM_UTF8) else raw  # a byte-order mark is no row
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise QAError(f"{path}: {not_utf8(raw, e)}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":
                raise QAError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from e
            data = None  # JSON Lines in a .json file (MIGRES)
        except (ValueError, RecursionError) as e:
            raise QAError(f"{path}: {json_problem(e)}") from None
        if data is not None:
            if isinstance(data, dict) and isinstance(data.get("data"), list):
                data = data["data"]
            elif isinstance(data, dict) and any(k in data for k in QUESTION_KEYS):
                data = [data]  # a one-row JSON Lines file
            if not isinstance(data, list):
                raise QAError(f"{path}: expected a JSON list of questions, "
                              f"got {type(data).__name__}")
            for i, row in enumerate(data, 1):
                yield f"item {i}", None, row
            return
    try:
        for i, row in iter_jsonl(path, "yield-bad", objects=False):
            bad = isinstance(row, BadLine)
            yield (f"line {i}", row.reason, None) if bad else (f"line {i}", None, row)
    except BadJsonl as e:
        raise QAError(str(e)) from None


def _join_sentences(sents: list[str]) -> str:
    """HotpotQA sentences carry their leading space, 2Wiki's do not: join without doubling."""
    out = ""
    for s in sents:
        out += s if not out or s[:1].isspace() else " " + s
    return out.strip()


def paragraphs_of(row: dict[str, Any]) -> list[Paragraph]:
    """Paragraphs shipped with a multi-hop row (MuSiQue, IRCoT, HotpotQA/2Wiki); [] when none."""
    paras = row.get("paragraphs") or row.get("contexts")
    if isinstance(paras, list):
        return [Paragraph(str(p.get("title", "")), str(p.get("paragraph_text", p.get("text", ""))),
                          bool(p.get("is_supporting", False)))
                for p in paras if isinstance(p, dict)]
    ctx = row.get("context")
    sf = _tolist(row.get("supporting_facts") or [])
    support = set(sf["title"] if isinstance(sf, dict) else [t for t, *_ in sf])
    if isinstance(ctx, dict) and "title" in ctx:  # HF hotpot_qa layout
        titles, sents = _tolist(ctx["title"]), _tolist(ctx.get("sentences", []))
        return [Paragraph(t, _join_sentences(_tolist(s)), t in support)
                for t, s in zip(titles, sents)]
    if isinstance(ctx, list):
        return [Paragraph(str(c[0]), _join_sentences(list(c[1])), c[0] in support)
                for c in ctx if isinstance(c, (list, tuple)) and len(c) == 2]
    return []


def _answers(row: dict[str, Any]) -> list[str]:
    """Gold answers of a row in any supported layout, deduplicated, order kept."""
    cand: list[Any] = []
    if "golden_answers" in row:
        cand = _tolist(row["golden_answers"])
        if isinstance(cand, dict):  # its keys would become the golds
            raise ValueError(f"golden_answers is an object ({_short(cand)}); "
                             f"expected a list of strings or a string")
    elif "possible_answers" in row:
        pa = row["possible_answers"]
        cand = json.loads(pa) if isinstance(pa, str) and pa.startswith("[") else _tolist(pa)
    elif "answers_objects" in row:
        for obj in row["answers_objects"] or []:
            cand += list(obj.get("spans") or [])
            if obj.get("number"):
                cand.append(obj["number"])
            d = obj.get("date") or {}
            if any(d.get(k) for k in ("day", "month", "year")):
                cand.append(" ".join(str(d[k]) for k in ("day", "month", "year") if d.get(k)))
    elif any(k in row for k in ("answer", "answers", "short_answers")):
        cand = _tolist(next(row[k] for k in ("answer", "answers", "short_answers") if k in row))
        if isinstance(cand, dict):  # HF trivia_qa / squad style: {value, aliases} or {text: [...]}
            aliases = _tolist(cand.get("aliases") or cand.get("text") or [])
            cand = [cand["value"]] * ("value" in cand) + list(aliases)
        cand = list(cand) if isinstance(cand, (list, tuple)) else [cand]
        cand += list(_tolist(row.get("answer_aliases") or []))
    elif isinstance(row.get("reward_model"), dict):
        cand = _tolist(((row["reward_model"].get("ground_truth") or {}).get("target")))
    if isinstance(cand, (str, int, float)):
        cand = [cand]
    out: list[str] = []
    for a in cand or []:
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise ValueError(f"answer {_short(a)} is not a string")
        if isinstance(a, float) and not math.isfinite(a):
            raise ValueError(f"answer {a!r} is not a string or a finite number (JSON NaN/Infinity)")
        a = str(a).strip()
        if a and a not in out:
            out.append(a)
    return out


# Reasoning hops by question type (HotpotQA: bridge, comparison; 2WikiMultihopQA: comparison,
# inference, compositional, bridge_comparison): the length of the longest chain of dependent
# lookups. Every type is 2 hops. A bridge_comparison ("Which film has the director born first, A or
# B?") has 4 supporting titles but is two parallel 2-hop chains (film -> director -> birth date) and
# a comparison, so its title count (kept in ``evidence``) is not its hop count.
TYPE_HOPS = {"bridge": 2, "comparison": 2, "inference": 2, "compositional": 2,
             "bridge_comparison": 2}


def _hops(row: dict[str, Any], evidence: list[str]) -> int | None:
    """Hop count: an explicit ``hops``; MuSiQue's id prefix; the question ``type`` (``TYPE_HOPS``,
    top level or in FlashRAG's ``metadata``); else the number of supporting titles (None when there
    are none)."""
    if isinstance(row.get("hops"), int):
        return row["hops"]
    rid = str(row.get("id", ""))
    if "hop" in rid.split("__")[0] and rid[:1].isdigit():  # MuSiQue ids: 2hop__, 3hop1__, 4hop3__
        return int(rid[0])
    meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    qtype = row.get("type", meta.get("type"))
    if isinstance(qtype, str) and qtype in TYPE_HOPS:
        return TYPE_HOPS[qtype]
    return len(evidence) or None


def _short(v: Any, n: int = 60) -> str:
    """``repr(v)`` cut to ``n`` characters (a row's value in an error message)."""
    try:
        r = repr(v)
    except (RecursionError, ValueError):
        return f"a {type(v).__name__} too nested to print"
    return r if len(r) <= n else r[:n - 1] + "…"


def row_to_record(row: Any, default_id: str, name: str | None = None) -> QARecord:
    """Normalise one row to a ``QARecord``; raises ``ValueError`` with the reason when bad."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    question = next((row[k] for k in QUESTION_KEYS if k in row), None)
    if not isinstance(question, str) or not question.strip():
        tried = ", ".join(QUESTION_KEYS)
        raise ValueError("empty or missing question (fields tried: " + tried + ")")
    answers = _answers(row)
    if not answers:
        raise ValueError("missing or empty answers "
                         "(golden_answers / answer / answers_objects / possible_answers)")
    rid = next((row[k] for k in ID_KEYS if row.get(k) is not None), default_id)
    if isinstance(row.get("evidence"), list):
        evidence = [str(t) for t in row["evidence"]]
    elif "supporting_facts" in row:  # HotpotQA / 2Wiki: their order (the reasoning order)
        sf = _tolist(row["supporting_facts"])
        titles = sf["title"] if isinstance(sf, dict) else [t for t, *_ in sf]
        evidence = list(dict.fromkeys(str(t) for t in titles))
    else:
        evidence = list(dict.fromkeys(p.title for p in paragraphs_of(row) if p.supporting))
    meta = dict(row["metadata"]) if isinstance(row.get("metadata"), dict) else {}
    meta.update({k: _tolist(row[k]) for k in META_KEYS if k in row})
    source = row.get("data_source") or row.get("dataset") or name or ""
    return QARecord(id=str(rid), question=question.strip(), golden_answers=answers,
                    data_source=str(source), hops=_hops(row, evidence), evidence=evidence,
                    metadata=meta)


def load_qa(path: str | Path, name: str | None = None, limit: int | None = None,
            skip_bad: bool = False, stats: QAStats | None = None) -> list[QARecord]:
    """All (or the first ``limit``) questions of a QA file as ``QARecord``s, in file order.

    ``name`` sets ``data_source`` when rows do not carry one (e.g. ``"hotpotqa"``). A question id
    read twice is a bad row (the error names both lines). Skipped rows are logged as a warning,
    unless the caller passes ``stats`` (then it reports them, as ``load_qa_reporting`` does).
    """
    path = Path(path)
    # a caller's stats: it reports
    quiet, stats = stats is not None, stats if stats is not None else QAStats()
    out: list[QARecord] = []
    first: dict[str, str] = {}  # question id -> where it was first read
    for where, err, row in read_rows(path):
        if limit is not None and len(out) >= limit:
            break
        try:
            if err is not None:
                raise ValueError(err)
            default_id = f"{path.stem}_{len(out) + stats.skipped}"
            rec = row_to_record(row, default_id=default_id, name=name)
            if rec.id in first:
                raise ValueError(f"duplicate question id {rec.id!r} (first at {first[rec.id]}; "
                                 f"ids key an evaluation's resume)")
        except ROW_ERRORS as e:
            why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {str(e)[:200]}"
            msg = f"{path}: {where}: bad QA row: {why}"
            if not skip_bad:
                raise QAError(f"{msg} ({SKIP_HINT})") from None
            stats.skip(msg)
            continue
        stats.rows += 1
        first[rec.id] = where
        out.append(rec)
    if stats.skipped and not quiet:
        log.warning("%s: skipped %d bad rows (first: %s)", path, stats.skipped, stats.errors[0])
    return out


def load_qa_reporting(path: str | Path, name: str | None = None, limit: int | None = None,
                      skip_bad: bool = False) -> list[QARecord]:
    """``load_qa`` for a command: with ``skip_bad``, the rows skipped are counted and named on
    stderr (the first 20, each with its line), so that a skipped row is never silent."""
    import sys

    stats = QAStats()
    recs = load_qa(path, name=name, limit=limit, skip_bad=skip_bad, stats=stats)
    if stats.skipped:
        print(f"{path}: skipped {stats.skipped} bad QA row{'s' * (stats.skipped != 1)} "
              f"(--skip-bad), kept {stats.rows}:", file=sys.stderr)
        for msg in stats.errors:
            print(f"  {msg}", file=sys.stderr)
        if stats.skipped > len(stats.errors):
            print(f"  ... and {stats.skipped - len(stats.errors)} more", file=sys.stderr)
    return recs


def load_hf(dataset_id: str, split: str = "test", name: str | None = None,
            limit: int | None = None, skip_bad: bool = False, stats: QAStats | None = None,
            **load_kwargs: Any) -> list[QARecord]:
    """Questions of a Hugging Face hub dataset (e.g. ``RUC-NLPIR/FlashRAG_datasets``, name ``nq``).

    Needs ``datasets`` and network (or a warm HF cache); offline it raises ``ConnectionError``
    naming the dataset. ``load_kwargs`` go to ``datasets.load_dataset`` (e.g. ``data_files``).
    """
    try:
        import datasets
    except ImportError as e:
        raise RuntimeError("load_hf needs the 'datasets' package: pip install datasets") from e
    where = f"{dataset_id}" + (f" ({name})" if name else "") + f" split {split!r}"
    try:
        ds = datasets.load_dataset(dataset_id, name, split=split, **load_kwargs)
    except Exception as e:  # datasets raises many types for network/cache problems
        raise ConnectionError(f"could not load {where} from the Hugging Face hub: "
                              f"{type(e).__name__}: {e}. Without network, fetch the file elsewhere "
                              "('hindsearch data fetch') and load it by path.") from e
    stats = stats if stats is not None else QAStats()
    out: list[QARecord] = []
    for i, row in enumerate(ds):
        if limit is not None and len(out) >= limit:
            break
        try:
            out.append(row_to_record(row, default_id=f"{split}_{i}", name=name or dataset_id))
            stats.rows += 1
        except ValueError as e:
            msg = f"{where}: row {i}: bad QA row: {e}"
            if not skip_bad:
                raise QAError(msg) from None
            stats.skip(msg)
    return out
