"""Retrieval quality: answer-in-top-k rate (default k=3) for BM25 and dense, per benchmark.

A question counts as a hit when a normalised gold answer occurs, as whole words, in one of
its top-k passages (``hindsearch.answers.answer_in_text``, the usual "answer recall").

Inputs, either:
* ``--mini DIR`` from ``hindsearch data mini``: ``DIR/corpus.jsonl`` and every other ``*.jsonl``
  under DIR as a benchmark (name = the file stem, or its folder when the stem is ``test``); or
* the default: the ~9.5k-passage wiki-18 slice in ../shared/data against the ros-subsample
  questions (NQ, TriviaQA, PopQA, Bamboogle). The column "answer in corpus" is the ceiling:
  the share of questions whose answer occurs in some passage at all.

Indexes are cached under ``--cache`` (built once, rebuilt when the corpus changes); dense
encoding of ~10k passages with MiniLM takes minutes on a small CPU. ``--max-passages N``
runs both retrievers on a seeded random sample of N passages instead (the "answer in corpus"
column then shows how many questions that sample can still answer).

    python benchmarks/bench_retrieval_quality.py [--mini DIR] [--kinds bm25,dense] [--k 3] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"


def load_questions(path: Path, limit: int | None) -> list[tuple[str, list[str]]]:
    out = []
    for n, line in enumerate(path.open(encoding="utf-8"), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        gold = row.get("golden_answers", row.get("answer"))
        gold = [gold] if isinstance(gold, str) else gold
        if not isinstance(row.get("question"), str) or not gold:
            raise ValueError(f"{path}:{n}: expected 'question' and 'golden_answers'")
        out.append((row["question"], [str(g) for g in gold]))
    return out[:limit] if limit else out


def benchmarks(args: argparse.Namespace) -> tuple[Path, dict[str, Path]]:
    if args.mini:
        mini = Path(args.mini)
        files = sorted(p for p in mini.rglob("*.jsonl") if p.name != "corpus.jsonl")
        return mini / "corpus.jsonl", {(p.parent.name if p.stem == "test" else p.stem): p for p in files}
    sub = DATA / "ros-subsample"
    return DATA / "wiki18-slice" / "wiki18_passages_from_search_r1_runs.jsonl", {
        b: sub / b / "test.jsonl" for b in ("nq", "triviaqa", "popqa", "bamboogle")
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mini", default=None, help="folder written by `hindsearch data mini`")
    ap.add_argument("--kinds", default="bm25,dense")
    ap.add_argument("--encoder", default="minilm")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--limit", type=int, default=None, help="questions per benchmark (default: all)")
    ap.add_argument("--max-passages", type=int, default=None, help="use a seeded random sample of N passages")
    ap.add_argument("--cache", default=str(ROOT / ".hindsearch" / "bench-indexes"))
    args = ap.parse_args()

    from hindsearch.data.corpus import read_corpus, write_corpus
    from hindsearch.retrieval.factory import ensure_index, load_index
    from hindsearch.answers import answer_in_text, normalize_answer

    corpus, benches = benchmarks(args)
    if not corpus.exists() or not benches:
        raise SystemExit(f"no corpus/benchmarks found ({corpus}); see --help")
    passages = read_corpus(corpus)
    if args.max_passages and args.max_passages < len(passages):
        import random

        passages = sorted(random.Random(0).sample(passages, args.max_passages), key=lambda p: p.id)
        corpus = Path(args.cache) / f"sample{args.max_passages}" / corpus.name
        if not corpus.exists():
            write_corpus(corpus, passages)
    questions = {name: load_questions(path, args.limit) for name, path in benches.items()}
    kinds = args.kinds.split(",")
    results: dict[str, dict[str, float]] = {k: {} for k in kinds}
    notes = []
    for kind in kinds:
        t = time.perf_counter()
        index = ensure_index(corpus, Path(args.cache) / f"{corpus.parent.name}-{kind}", kind=kind, encoder=args.encoder)
        r = load_index(index)
        notes.append(f"{kind} index ready in {time.perf_counter() - t:.1f} s")
        for name, qa in questions.items():
            hits = r.retrieve([q for q, _ in qa], args.k)
            results[kind][name] = sum(any(answer_in_text(g, p.contents) for p in h) for (_, g), h in zip(qa, hits)) / len(qa)

    # ceiling: normalised passages joined by " | " (normalisation strips punctuation, so no match spans two)
    everything = " | ".join(normalize_answer(p.contents) for p in passages)
    ceiling = {
        name: sum(any(normalize_answer(a) and f" {normalize_answer(a)} " in f" {everything} " for a in g) for _, g in qa) / len(qa)
        for name, qa in questions.items()
    }

    print(f"corpus: {corpus.parent.name}/{corpus.name} ({len(passages)} passages); k={args.k}; encoder={args.encoder}; " + "; ".join(notes))
    print()
    head = "| benchmark | questions | " + " | ".join(f"{k} answer@{args.k}" for k in kinds) + (" | answer in corpus |" if ceiling else " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, qa in questions.items():
        cells = " | ".join(f"{100 * results[k][name]:.1f}%" for k in kinds)
        print(f"| {name} | {len(qa)} | {cells}" + (f" | {100 * ceiling[name]:.1f}% |" if ceiling else " |"))
    macro = " | ".join(f"{100 * sum(results[k].values()) / len(results[k]):.1f}%" for k in kinds)
    print(f"| macro average | {sum(len(q) for q in questions.values())} | {macro}" +
          (f" | {100 * sum(ceiling.values()) / len(ceiling):.1f}% |" if ceiling else " |"))


if __name__ == "__main__":
    main()
