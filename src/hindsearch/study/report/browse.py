"""The trajectory browser's groups and each search's retrieval quality.

Rollouts are grouped by outcome and, inside each, by hop count (a run) or benchmark (an evaluation),
as nested ``<details>`` with a table of counts that links to every group (no script: the page's
Content-Security-Policy forbids them). Each search turn shows its retrieval quality where the data
has it: the recall so far of the evidence the question names, and which retrieved passages are
evidence. Where that evidence comes from and how it is matched: docs/runs.md, "The report".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hindsearch.records import title_key
from hindsearch.study.report.runs import Run, text

MAX_QA_BYTES = 256 * 2**20
"""A QA file larger than this is not read for the evidence of the shown rollouts (the page would
take minutes)."""

OUTCOMES = (("crit", "failed, with a critique"), ("fail", "failed, without a critique"),
            ("ok", "succeeded"))
"""The outcome groups of the browser, in the order shown."""


# --------------------------------------------------------------------------- evidence
@dataclass
class Evidence:
    """What a question's retrieval is scored against (empty: nothing to score)."""

    titles: set[str] = field(default_factory=set)
    """``title_key`` of the evidence passages' titles."""
    ids: set[str] = field(default_factory=set)
    """Ids of the evidence passages (``metadata.evidence_ids``)."""
    answer_ids: set[str] = field(default_factory=set)
    """Ids of passages holding the answer (``metadata.answer_passage_ids``: single-hop mini-wiki
    sets)."""
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.titles or self.ids or self.answer_ids)


def strings(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def evidence_of(sample: dict[str, Any], qa: dict[str, Any] | None = None) -> Evidence:
    """The sample's own ``evidence``, else (``qa``: ``{qid: QARecord}``) its question's row when
    that row holds the same question."""
    own = strings(sample.get("evidence"))
    if own:
        return Evidence(titles={title_key(t) for t in own}, source="the rollout's evidence titles")
    rec = (qa or {}).get(text(sample.get("qid"))) if sample.get("qid") is not None else None
    if rec is None or rec.question.strip() != text(sample.get("question", "")).strip():
        return Evidence()
    meta = rec.metadata if isinstance(rec.metadata, dict) else {}
    return Evidence(titles={title_key(t) for t in rec.evidence if isinstance(t, str)},
                    ids=set(strings(meta.get("evidence_ids"))),
                    answer_ids=set(strings(meta.get("answer_passage_ids"))),
                    source="the question's row of its QA file")


def turn_quality(turns: Sequence[dict[str, Any]], ev: Evidence
                 ) -> tuple[list[dict[str, Any]], str | None, tuple[float, str] | None]:
    """Per turn ``{"hits": [bool per retrieved title], "quality": str | None}``, the rollout's
    final retrieval quality as text and as ``(share, kind)``: the evidence recall, or 1/0 whether an
    answer passage was retrieved (None without evidence).
    ``turns`` are ``samples.jsonl``'s / ``trajectories.jsonl``'s turn records."""
    if not ev:
        return [{"hits": [], "quality": None} for _ in turns], None, None
    seen_titles: set[str] = set()
    seen_ids: set[str] = set()
    answer_turn: int | None = None
    out = []
    searches = 0
    for t in turns:
        if not isinstance(t, dict) or t.get("action") != "search":
            out.append({"hits": [], "quality": None})
            continue
        searches += 1
        titles = [title_key(x) for x in strings(t.get("doc_titles"))]
        ids = strings(t.get("doc_ids"))
        id_of = ids if len(ids) == len(strings(t.get("doc_titles"))) else [None] * len(titles)
        hits = [k in ev.titles or (i is not None and (i in ev.ids or i in ev.answer_ids))
                for k, i in zip(titles, id_of)]
        seen_titles |= {k for k in titles if k in ev.titles}
        seen_ids |= {i for i in ids if i in ev.ids}
        if answer_turn is None and any(i in ev.answer_ids for i in ids):
            answer_turn = searches
        out.append({"hits": hits, "quality": quality_text(ev, seen_titles, seen_ids, answer_turn)})
    if ev.titles:
        share, kind = len(seen_titles) / len(ev.titles), "evidence recall"
    elif ev.ids:
        share, kind = len(seen_ids) / len(ev.ids), "evidence recall"
    else:
        share, kind = float(answer_turn is not None), "answer passage retrieved"
    return out, quality_text(ev, seen_titles, seen_ids, answer_turn, final=True), (share, kind)


def quality_text(ev: Evidence, titles: set[str], ids: set[str], answer_turn: int | None,
                 final: bool = False) -> str:
    parts = []
    if ev.titles:
        parts.append(f"evidence recall {len(titles)}/{len(ev.titles)} "
                     f"({100 * len(titles) / len(ev.titles):.0f}%)")
    elif ev.ids:
        parts.append(f"evidence recall {len(ids)}/{len(ev.ids)} "
                     f"({100 * len(ids) / len(ev.ids):.0f}%, by passage id)")
    if ev.answer_ids and not ev.titles:
        parts.append("answer passage retrieved"
                     + (f" (search {answer_turn})" if final and answer_turn else "")
                     if answer_turn else "answer passage not retrieved")
    return "; ".join(parts) + ("" if final else " so far")


def read_qa(path: Path | None, bad: list[str]) -> dict[str, Any]:
    """``{id: QARecord}`` of a QA file ({} when absent, too large or unreadable: the reason goes to
    ``bad``)."""
    if path is None or not path.is_file():
        return {}
    try:
        if path.stat().st_size > MAX_QA_BYTES:
            bad.append(f"{text(str(path))}: larger than {MAX_QA_BYTES >> 20} MiB; not read for the "
                       "rollouts' evidence")
            return {}
        from hindsearch.data.qa import QAStats, load_qa

        return {r.id: r for r in load_qa(path, skip_bad=True, stats=QAStats())}
    except Exception as e:  # noqa: BLE001 - evidence is extra: the page is shown without it
        bad.append(f"{text(str(path))}: not read for the rollouts' evidence ({type(e).__name__}: "
                   f"{text(str(e))[:200]})")
        return {}


def run_roots(run: Run) -> list[Path]:
    """Folders a run's relative paths may be relative to: the folder it was started from (the run
    folder minus its recorded relative ``out``), then the current folder."""
    roots = []
    rel = run.summary.get("run_dir") or run.config.get("out")
    if isinstance(rel, str) and rel.strip() and not Path(rel).is_absolute():
        parts = tuple(p for p in Path(rel).parts if p not in (".", ""))
        here = run.path.resolve().parts
        if parts and len(here) > len(parts) and here[-len(parts):] == parts:
            roots.append(Path(*here[:-len(parts)]))
    roots.append(Path.cwd())
    return roots


def train_qa_path(run: Run) -> Path | None:
    """The training QA file the run read (``summary.json``'s ``paths.train``, ``data.train``, or the
    world's ``train.jsonl``), where it can still be found."""
    paths = run.summary.get("paths")
    data = run.config.get("data") if isinstance(run.config.get("data"), dict) else {}
    cands = [paths.get("train")] if isinstance(paths, dict) else []
    cands.append(data.get("train"))
    if not data.get("train") and isinstance(data.get("world_dir"), str):
        cands.append(str(Path(data["world_dir"]) / "train.jsonl"))
    for c in cands:
        if not isinstance(c, str) or not c.strip():
            continue
        p = Path(os.path.expanduser(c))
        for q in ([p] if p.is_absolute() else [root / p for root in run_roots(run)]):
            if q.is_file():
                return q
    return None


# --------------------------------------------------------------------------- groups
def mean_recall(views: Sequence[dict[str, Any]]) -> str | None:
    """The mean final retrieval quality of a group's shown rollouts, per kind (``"evidence recall
    55%"``, ``"answer passage retrieved 40%"``; ``of N`` when only N of them have evidence), None
    when none has."""
    kinds: dict[str, list[float]] = {}
    for v in views:
        if v.get("recall_share") is not None:
            share, kind = v["recall_share"]
            kinds.setdefault(kind, []).append(share)
    parts = [f"{kind} {100 * sum(vals) / len(vals):.0f}%"
             + (f" of {len(vals)}" if len(vals) != len(views) else "")
             for kind, vals in kinds.items()]
    return "; ".join(parts) or None


def outcome(view: dict[str, Any]) -> str:
    """``ok``, ``crit`` (failed, with a critique) or ``fail`` (failed, without one) of a
    ``sample_view``."""
    if view["ok"]:
        return "ok"
    return "crit" if view.get("hind") and view["hind"].get("critique") is not None else "fail"


def hops_key(view: dict[str, Any]) -> tuple[Any, str]:
    h = view.get("hops")
    try:
        n = int(str(h))
    except ValueError:
        return (1, 0, "hops not recorded"), "hops not recorded"
    return (0, n, ""), f"{n} hop{'s' * (n != 1)}"


def bench_key(order: Sequence[str],
              label: Callable[[str], str] = str) -> Callable[[dict[str, Any]], tuple[Any, str]]:
    """Group by benchmark, in ``order`` (then the rest by name), labelled ``label(name)``."""
    def key(view: dict[str, Any]) -> tuple[Any, str]:
        b = view.get("benchmark") or "?"
        return (order.index(b) if b in order else len(order), b), label(b)
    return key


def grouped(views: Iterable[dict[str, Any]], anchor: str, by: str,
            key: Callable[[dict[str, Any]], tuple[Any, str]],
            outcomes: Sequence[tuple[str, str]] = OUTCOMES,
            totals: dict[tuple[str, str], int] | None = None) -> dict[str, Any]:
    """The browser's groups and its table of counts. ``views``: ``sample_view`` dicts; ``by``: the
    second level's name (``hops`` or ``benchmark``); ``key(view)`` -> ``(sort key, label)``;
    ``totals``: ``{(outcome, label): rollouts recorded}`` when more were recorded than shown (an
    evaluation)."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    order: dict[str, Any] = {}
    for v in views:
        sort, label = key(v)
        order[label] = sort
        cells.setdefault((outcome(v), label), []).append(v)
    for (_, label) in (totals or {}):
        order.setdefault(label, (len(order), label))
    labels = sorted(order, key=lambda k: order[k])
    ids = {lab: i for i, lab in enumerate(labels)}
    groups = []
    for o, title in outcomes:
        subs = [{"id": f"{anchor}-{o}-{ids[lab]}", "title": lab, "n": len(cells.get((o, lab), [])),
                 "total": (totals or {}).get((o, lab), len(cells.get((o, lab), []))),
                 "samples": cells.get((o, lab), []), "recall": mean_recall(cells.get((o, lab), []))}
                for lab in labels if cells.get((o, lab)) or (totals or {}).get((o, lab))]
        groups.append({"id": f"{anchor}-{o}", "title": title, "n": sum(s["n"] for s in subs),
                       "total": sum(s["total"] for s in subs), "subs": subs})

    def cell(o: str, lab: str) -> dict[str, Any]:
        n = len(cells.get((o, lab), []))
        total = (totals or {}).get((o, lab), n)
        return {"n": n, "total": total, "id": f"{anchor}-{o}-{ids[lab]}" if n else None}

    rows = [{"label": lab, "cells": [cell(o, lab) for o, _ in outcomes]} for lab in labels]
    head = [by] + [t for _, t in outcomes]
    return {"head": head, "rows": rows, "groups": groups,
            "totals": [{"n": g["n"], "total": g["total"], "id": g["id"] if g["n"] else None}
                       for g in groups]}
