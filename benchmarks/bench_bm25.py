"""BM25 throughput: hindsearch's bm25s retriever (batched, in-process) vs raw bm25s vs rank_bm25's BM25Okapi.

Same corpus (default: the ~9.5k-passage wiki-18 slice in ../shared/data), same tokens
(bm25s tokenizer + PyStemmer + English stopwords for both), same real questions (default:
1,000 NQ test questions). rank_bm25 scores every document in Python per query, so it runs on
the first ``--rank-queries`` questions and its rate is extrapolated (queries/second is a
per-query rate either way). rank_bm25 gets its queries pre-tokenised; hindsearch's time
includes tokenising the queries and fetching the passages. Both bm25s backends are timed
(sparse is the default; numba only when installed; its one-off JIT compilation is excluded by a warm-up and printed).
Raw bm25s is the library called directly (``bm25s.BM25`` indexed in memory over the same tokens,
``retrieve`` on the same tokenised questions, same k and n_threads): the target is hindsearch's
retriever at >= 0.9x raw bm25s; raw bm25s returns document ids only, so the passage fetch and
``Passage`` building are what our wrapper adds. Raw and ours are interleaved repeat by repeat.
Wall-clock and process CPU time are both reported (CPU time is the fair one on a shared machine).

    python benchmarks/bench_bm25.py [--corpus FILE --questions FILE --k 3 --repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median (wall seconds, process CPU seconds) of ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(DATA / "wiki18-slice" / "wiki18_passages_from_search_r1_runs.jsonl"))
    ap.add_argument("--questions", default=str(DATA / "ros-subsample" / "nq" / "test.jsonl"))
    ap.add_argument("--n-questions", type=int, default=1000)
    ap.add_argument("--rank-queries", type=int, default=100, help="questions run through rank_bm25 (rate extrapolated)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="bm25s n_threads (0 = single thread)")
    args = ap.parse_args()

    import bm25s
    import Stemmer
    from rank_bm25 import BM25Okapi

    from hindsearch.data.corpus import read_corpus
    from hindsearch.retrieval.factory import build_index, load_index
    from hindsearch.retrieval.bm25 import tokenize

    questions = [json.loads(line)["question"] for line in open(args.questions, encoding="utf-8") if line.strip()][: args.n_questions]
    passages = read_corpus(args.corpus)
    rows = []  # (name, queries, repeats, wall, cpu)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        build_index(args.corpus, Path(tmp) / "idx", show_progress=False)
        build_s = time.perf_counter() - t
        notes = [f"hindsearch index build {build_s:.2f} s"]
        for backend in ("sparse", "numpy", "numba"):
            if backend == "numba" and not bm25s.NUMBA_AVAILABLE:
                notes.append("numba not installed: numba backend skipped")
                continue
            t = time.perf_counter()
            r = load_index(Path(tmp) / "idx", n_threads=args.threads, bm25_backend=backend)
            r.retrieve(questions[:10], args.k)  # warm-up (numba: JIT compilation)
            notes.append(f"{backend}: load + first batch {time.perf_counter() - t:.2f} s")
            rows.append((f"hindsearch bm25s {backend} (batched, n_threads={args.threads})", len(questions), args.repeats,
                         *timed(lambda: r.retrieve(questions, args.k), args.repeats)))

        stemmer = Stemmer.Stemmer("english")
        raw = bm25s.BM25()
        raw.index(bm25s.tokenize([p.contents for p in passages], stopwords="en", stemmer=stemmer, show_progress=False),
                  show_progress=False)
        ours = load_index(Path(tmp) / "idx", n_threads=args.threads, bm25_backend="sparse")

        def run_raw() -> None:
            q = bm25s.tokenize(questions, stopwords="en", stemmer=stemmer, show_progress=False)
            raw.retrieve(q, k=args.k, n_threads=args.threads, show_progress=False)

        run_raw()
        pairs = [(timed(run_raw, 1), timed(lambda: ours.retrieve(questions, args.k), 1)) for _ in range(args.repeats)]
        raw_t = (statistics.median(p[0][0] for p in pairs), statistics.median(p[0][1] for p in pairs))
        ours_t = (statistics.median(p[1][0] for p in pairs), statistics.median(p[1][1] for p in pairs))
        rows.append((f"raw bm25s (ids only, n_threads={args.threads})", len(questions), args.repeats, *raw_t))
        vs_raw = (raw_t[0] / ours_t[0], raw_t[1] / ours_t[1])

        t = time.perf_counter()
        rank = BM25Okapi(tokenize([p.contents for p in passages]))
        notes.append(f"rank_bm25 build {time.perf_counter() - t:.2f} s")
        sub = tokenize(questions[: args.rank_queries])

        def run_rank() -> None:
            for q in sub:
                np.argsort(rank.get_scores(q))[::-1][: args.k]

        reps = max(1, args.repeats // 2)
        rows.append(("rank_bm25 BM25Okapi (rate extrapolated)", len(sub), reps, *timed(run_rank, reps)))

    base_wall, base_cpu = rows[-1][1] / rows[-1][3], rows[-1][1] / rows[-1][4]
    print(f"corpus: {len(passages)} passages ({Path(args.corpus).name}); {len(questions)} questions "
          f"({Path(args.questions).parent.name}); k={args.k}; " + "; ".join(notes))
    print()
    print("| retriever | queries x repeats | median wall (s) | queries/s (wall) | speed-up (wall) | median CPU (s) | queries/s (CPU) | speed-up (CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, reps, wall, cpu in rows:
        print(f"| {name} | {n} x{reps} | {wall:.3f} | {n / wall:,.1f} | {n / wall / base_wall:.1f}x | {cpu:.3f} | {n / cpu:,.1f} | {n / cpu / base_cpu:.1f}x |")
    wall_x, cpu_x = rows[0][1] / rows[0][3] / base_wall, rows[0][1] / rows[0][4] / base_cpu
    ok = "met" if min(wall_x, cpu_x) >= 50 else "NOT met"
    ok_raw = "met" if min(vs_raw) >= 0.9 else "NOT met"
    print(f"\ntarget >= 0.9x raw bm25s (interleaved, sparse backend): {ok_raw} ({vs_raw[0]:.2f}x wall, {vs_raw[1]:.2f}x CPU; "
          f"median wall ours {ours_t[0]:.3f} s vs raw {raw_t[0]:.3f} s)")
    print(f"target >= 50x rank_bm25 (default backend 'sparse'): {ok} ({wall_x:.0f}x wall, {cpu_x:.0f}x CPU)")


if __name__ == "__main__":
    main()
