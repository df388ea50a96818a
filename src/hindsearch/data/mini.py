"""``hindsearch data mini``: a mini-wiki corpus plus the seven benchmark test sets restricted to it.

From a folder of real data slices (``--shared``) it builds ``corpus.jsonl`` (wiki-18 format,
deduplicated, ids stable when sources are added), ``<benchmark>.jsonl`` for the seven benchmarks
(only questions whose evidence is in the corpus), ``train.jsonl`` and ``dev.jsonl`` (training
questions whose supporting paragraphs are all in the corpus) and ``mini.json`` with the counts,
also printed as a table. What each file holds and the rules that keep a question: docs/data.md,
"What `data mini` writes".
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hindsearch.data.corpus import iter_corpus, write_corpus
from hindsearch.data.qa import paragraphs_of, read_rows, row_to_record
from hindsearch.records import Passage, QARecord, make_contents

# Passage sources, relative to the shared data folder.
CORPUS_FILES = (
    "wiki18-slice/wiki18_passages_from_search_r1_runs.jsonl",
    "flashrag-toy/sample_data.jsonl",
    "search-r1/corpus.jsonl",
    "hipporag/2wikimultihopqa_corpus.json",
    "hipporag/musique_train_corpus.json",
    "hipporag/hotpotqa_train_corpus.json",
)
# QA files whose rows ship paragraphs (all of them go into the corpus).
PARAGRAPH_FILES = (
    "ircot-hotpotqa/dev_subsampled.jsonl",
    "migres/hotpot.json",
    "migres/musique.json",
    "migres/wikihop.json",
    "hipporag/hotpotqa_train.json",
    "hipporag/musique_train.json",
)
# Benchmark -> (test file, "multi" = supporting paragraphs must be present | "single" = answer in a
# passage).
BENCHMARKS = {
    "nq": ("ros-subsample/nq/test.jsonl", "single"),
    "triviaqa": ("ros-subsample/triviaqa/test.jsonl", "single"),
    "popqa": ("ros-subsample/popqa/test.jsonl", "single"),
    "hotpotqa": ("ircot-hotpotqa/dev_subsampled.jsonl", "multi"),
    "2wiki": ("migres/wikihop.json", "multi"),
    "musique": ("migres/musique.json", "multi"),
    "bamboogle": ("ros-subsample/bamboogle/test.jsonl", "single"),
}

# Training sets (their questions go to train.jsonl / dev.jsonl; every one is multi-hop, with its
# paragraphs).
TRAIN_FILES = {
    "hotpotqa_train": "hipporag/hotpotqa_train.json",
    "musique_train": "hipporag/musique_train.json",
}
DEV_FRACTION = 0.1
"""Share of the kept training questions that ``build_mini`` writes to ``dev.jsonl``."""

_PUNCT = re.compile("[" + re.escape(string.punctuation) + "]")
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_ARTICLE_WORDS = {"a", "an", "the"}


def fast_normalize(s: str) -> str:
    """Same result as ``answers.normalize_answer`` (lower, no punctuation, no articles), faster.

    For ASCII text every non-space character left after dropping punctuation is a word
    character, so the article regex equals dropping the tokens a/an/the.
    """
    s = _PUNCT.sub("", s.lower())
    if s.isascii():
        return " ".join(t for t in s.split() if t not in _ARTICLE_WORDS)
    return " ".join(_ARTICLES.sub(" ", s).split())


def passage_key(title: str, text: str) -> tuple[str, str]:
    """Deduplication key: case-folded bare title and whitespace-collapsed text."""
    return title.strip().strip('"').strip().lower(), " ".join(text.split())


def passage_id(key: tuple[str, str]) -> str:
    return "mw" + hashlib.sha1("\n".join(key).encode("utf-8")).hexdigest()[:12]


class MiniCorpus:
    """Deduplicating passage collection with an inverted index for answer lookup."""

    def __init__(self) -> None:
        self.passages: list[Passage] = []
        self.index_of: dict[tuple[str, str], int] = {}
        self.added: dict[str, int] = {}

    def add(self, title: str, text: str, source: str) -> int | None:
        """Add a passage (bare title, text); returns its position, None when the text is empty."""
        title, text = title.strip().strip('"').strip(), text.strip()
        if not text:
            return None
        key = passage_key(title, text)
        if key not in self.index_of:
            self.index_of[key] = len(self.passages)
            self.passages.append(Passage(passage_id(key), make_contents(title, text)))
            self.added[source] = self.added.get(source, 0) + 1
        return self.index_of[key]

    def find(self, title: str, text: str) -> int | None:
        return self.index_of.get(passage_key(title, text))

    def build_answer_index(self, vocab: set[str]) -> None:
        """Normalise every passage and index the positions of the tokens in ``vocab`` (answer
        tokens)."""
        self.norm = [f" {fast_normalize(p.contents)} " for p in self.passages]
        self.postings: dict[str, set[int]] = {t: set() for t in vocab}
        for i, t in enumerate(self.norm):
            for tok in vocab.intersection(t.split()):
                self.postings[tok].add(i)

    def passages_with_answer(self, answers: list[str], limit: int = 5) -> list[int]:
        """Positions of passages containing a normalised gold answer as whole words."""
        hits: list[int] = []
        for a in answers:
            na = fast_normalize(a)
            toks = na.split()
            if not toks:
                continue
            sets = sorted((self.postings.get(t, set()) for t in set(toks)), key=len)
            cand = set.intersection(*sets) if sets[0] else set()
            hits += [i for i in sorted(cand) if f" {na} " in self.norm[i] and i not in hits]
            if len(hits) >= limit:
                break
        return hits[:limit]


def _corpus_rows(path: Path) -> Iterator[tuple[str, str]]:
    """(title, text) of a corpus file: wiki-18 jsonl, HippoRAG list, or a {title: [sentences]}
    dict."""
    raw = path.read_text(encoding="utf-8", errors="replace") if path.suffix == ".json" else ""
    if raw.lstrip().startswith("{"):
        for title, sents in json.loads(path.read_text(encoding="utf-8")).items():
            yield title, "".join(sents).strip()
        return
    for p in iter_corpus(path):
        yield (p.bare_title, p.text) if "\n" in p.contents else ("", p.contents)


def _collect_corpus(shared: Path, missing: list[str]) -> MiniCorpus:
    """Every passage of the corpus files and of the multi-hop rows' paragraphs (missing files are
    noted)."""
    corpus = MiniCorpus()
    for rel in CORPUS_FILES:
        if not (shared / rel).is_file():
            missing.append(rel)
            continue
        for title, text in _corpus_rows(shared / rel):
            corpus.add(title, text, rel)
    for rel in PARAGRAPH_FILES:
        if not (shared / rel).is_file():
            missing.append(rel)
            continue
        for _, err, row in read_rows(shared / rel):
            for p in paragraphs_of(row) if isinstance(row, dict) else []:
                corpus.add(p.title, p.text, rel)
    return corpus


def _read_benchmarks(shared: Path, missing: list[str],
                     files: dict[str, str] | None = None) -> dict[str, list[tuple[Any, QARecord]]]:
    """Each benchmark's (or each of ``files``': name -> path) (raw row, record) pairs; a malformed
    row is an error naming file and line."""
    rows: dict[str, list[tuple[Any, QARecord]]] = {}
    files = files if files is not None else {name: rel for name, (rel, _kind) in BENCHMARKS.items()}
    for name, rel in files.items():
        if not (shared / rel).is_file():
            if rel not in missing:  # a training set is a paragraph source too: named once
                missing.append(rel)
            continue
        rows[name] = []
        for where, err, row in read_rows(shared / rel):
            if err is not None:
                raise ValueError(f"{shared / rel}: {where}: {err}")
            rec = row_to_record(row, default_id=f"{name}_{len(rows[name])}", name=name)
            rec.data_source = name
            rows[name].append((row, rec))
    return rows


def _answerable(corpus: MiniCorpus, kind: str, row: Any, rec: QARecord) -> bool:
    """Keep ``rec`` when the mini-wiki can answer it (``multi``: every evidence paragraph is in it;
    else a passage holds a gold answer); records the passage ids it relies on in
    ``rec.metadata``."""
    if kind == "multi":
        paras = [p for p in paragraphs_of(row) if p.supporting or p.title in rec.evidence]
        ids = [corpus.find(p.title, p.text) for p in paras]
        if not paras or None in ids or not set(rec.evidence) <= {p.title for p in paras}:
            return False
        rec.metadata["evidence_ids"] = [corpus.passages[i].id for i in ids]
        return True
    hits = corpus.passages_with_answer(rec.golden_answers)
    if hits:
        rec.metadata["answer_passage_ids"] = [corpus.passages[i].id for i in hits]
    return bool(hits)


def split_train_dev(records: list[QARecord], dev_fraction: float,
                    seed: int = 0) -> tuple[list[QARecord], list[QARecord]]:
    """``(train, dev)``: a seeded shuffle of ``records``, ``round(n * dev_fraction)`` of them (at
    least one when the fraction is > 0 and there are two or more) to dev."""
    import random

    order = list(records)
    random.Random(seed).shuffle(order)
    n_dev = round(len(order) * dev_fraction)
    if dev_fraction > 0 and len(order) >= 2:
        n_dev = min(max(n_dev, 1), len(order) - 1)
    return order[n_dev:], order[:n_dev]


def _write_qa(path: Path, records: list[QARecord]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")


def build_mini(shared: str | Path, out: str | Path, log=print,
               dev_fraction: float = DEV_FRACTION) -> dict[str, Any]:
    """Build the mini-wiki, the filtered benchmarks and the train/dev split (``dev_fraction`` of the
    kept training questions to dev) in ``out``; returns the ``mini.json`` dict."""
    if not 0 <= dev_fraction < 1:
        raise ValueError(f"--dev-fraction {dev_fraction}: must be at least 0 and below 1")
    shared, out = Path(shared), Path(out)
    if not shared.is_dir():
        raise FileNotFoundError(f"shared data folder not found: {shared}")
    t0 = time.perf_counter()
    missing: list[str] = []
    corpus = _collect_corpus(shared, missing)
    out.mkdir(parents=True, exist_ok=True)
    write_corpus(out / "corpus.jsonl", corpus.passages)
    rows = _read_benchmarks(shared, missing)
    train_rows = _read_benchmarks(shared, missing, TRAIN_FILES)
    corpus.build_answer_index({t for recs in rows.values() for _, r in recs
                               for a in r.golden_answers
                               for t in fast_normalize(a).split()})
    bench: dict[str, Any] = {}
    for name, recs in rows.items():
        rel, kind = BENCHMARKS[name]
        kept = [rec for row, rec in recs if _answerable(corpus, kind, row, rec)]
        _write_qa(out / f"{name}.jsonl", kept)
        bench[name] = {"source": rel, "rule": kind, "total": len(recs), "kept": len(kept)}
    pool = [rec for recs in train_rows.values() for row, rec in recs
            if _answerable(corpus, "multi", row, rec)]
    train, dev = split_train_dev(pool, dev_fraction)
    if pool:
        _write_qa(out / "train.jsonl", train)
        _write_qa(out / "dev.jsonl", dev)
    split = {"sources": [TRAIN_FILES[n] for n in train_rows],
             "total": sum(len(r) for r in train_rows.values()),
             "kept": len(pool), "train": len(train), "dev": len(dev), "dev_fraction": dev_fraction}
    meta = {"passages": len(corpus.passages), "passages_per_source": corpus.added,
            "benchmarks": bench, "split": split, "missing_sources": missing,
            "seconds": round(time.perf_counter() - t0, 2)}
    (out / "mini.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    log(format_table(meta))
    return meta


def format_table(meta: dict[str, Any]) -> str:
    """Questions kept per benchmark, as a plain-text table."""
    lines = [f"mini-wiki: {meta['passages']} passages ({meta['seconds']} s)",
             f"{'benchmark':<10} {'kept':>6} {'total':>6} {'rule':<6} source"]
    for name, b in meta["benchmarks"].items():
        lines.append(f"{name:<10} {b['kept']:>6} {b['total']:>6} {b['rule']:<6} {b['source']}")
    sp = meta.get("split") or {}
    if sp.get("kept"):
        lines.append(f"train/dev split: {sp['train']} train.jsonl + {sp['dev']} dev.jsonl of "
                     f"{sp['kept']} kept training questions ({sp['total']} in "
                     f"{', '.join(sp['sources'])})")
    else:
        lines.append("train/dev split: none (no training questions answerable from the corpus: "
                     + ", ".join(TRAIN_FILES.values()) + ")")
    for rel in meta["missing_sources"]:
        lines.append(f"missing (skipped): {rel}")
    return "\n".join(lines)
