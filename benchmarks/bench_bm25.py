"""BM25 throughput: hindsearch's retriever vs raw bm25s (numba and numpy backends) vs rank_bm25, and cost vs corpus size.

Every row uses the same tokens (bm25s' tokenizer, PyStemmer English stemmer, bm25s' English
stopwords), the same BM25 (bm25s defaults: Lucene, k1 = 1.5, b = 0.75), the same k and the
same threads (``--threads``, default 0 = one thread), on the same real questions.

* hindsearch: ``load_index(...).retrieve(questions, k)``, i.e. tokenising, search and the
  ``Passage`` objects (id, contents, score). ``numba`` is the default path; ``sparse`` is the
  fallback for an install without numba.
* raw bm25s: ``bm25s.BM25(backend=...)`` indexed in memory over the same corpus,
  ``retrieve(bm25s.tokenize(questions), k, n_threads)``: tokenising and search, ids only (no
  passage text). Its numba backend is bm25s' fastest.
* rank_bm25 ``BM25Okapi`` scores every document in Python per query, so it runs on
  ``--rank-queries`` questions and its rate is extrapolated.

Part 1 (the wiki-18 slice + 1,000 NQ test questions by default) times every row interleaved,
repeat by repeat, and prints the median wall and process CPU time (CPU time is the fair one on a
shared machine; the load average is printed). Part 2 times hindsearch vs raw bm25s numba,
interleaved, over world corpora of ``--sizes`` passages (``hindsearch world``'s generator, its
train questions) and the mini-wiki (``hindsearch data mini`` from ../shared/data, its NQ
questions), and states how the cost per query grows with the corpus (the log-log slope from the
smallest to the largest corpus). One-off costs (numba compilation or loading its cache, index
build) happen before timing and are printed.

    python benchmarks/bench_bm25.py [--corpus FILE --questions FILE --k 3 --repeats 7 --sizes 2000,10000,30000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def clock(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def interleaved(fns: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each function, called in turn once per repeat."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(clock(fn))
    return {name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for name, r in runs.items()}


def raw_bm25s(texts: list[str], backend: str):
    """bm25s called directly: an in-memory index of ``texts`` and a function timing tokenise + retrieve."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    model = bm25s.BM25(backend=backend)
    model.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)

    def run(questions: list[str], k: int, threads: int):
        q = bm25s.tokenize(questions, stopwords="en", stemmer=stemmer, show_progress=False)
        return model.retrieve(q, k=k, n_threads=threads, show_progress=False)

    return run


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(DATA / "wiki18-slice" / "wiki18_passages_from_search_r1_runs.jsonl"))
    ap.add_argument("--questions", default=str(DATA / "ros-subsample" / "nq" / "test.jsonl"))
    ap.add_argument("--n-questions", type=int, default=1000)
    ap.add_argument("--rank-queries", type=int, default=100, help="questions run through rank_bm25 (rate extrapolated)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="n_threads of every retriever (0 = one thread)")
    ap.add_argument("--sizes", default="2000,10000,30000", help="world corpus sizes of part 2 ('' skips the worlds)")
    ap.add_argument("--shared", default=str(DATA), help="../shared/data, for the mini-wiki of part 2")
    ap.add_argument("--no-mini", action="store_true", help="part 2 without the mini-wiki")
    ap.add_argument("--skip-main", action="store_true", help="part 2 only")
    args = ap.parse_args()

    import bm25s

    from hindsearch.data.corpus import read_corpus
    from hindsearch.retrieval.factory import build_index, load_index

    if not bm25s.NUMBA_AVAILABLE:
        raise SystemExit("numba is not installed: pip install -e '.[fast]' (the raw numba rows and our default need it)")
    k, th = args.k, args.threads
    print(f"k={k}; n_threads={th}; {args.repeats} interleaved repeats, medians; load average at start {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_main:
            main_table(args, Path(tmp))
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        corpora = []
        if sizes:
            from hindsearch.data.world import generate_world
            from hindsearch.data.corpus import write_corpus

            for n in sizes:
                world = generate_world(seed=0, n_entities=n)
                path = Path(tmp) / f"world{n}.jsonl"
                write_corpus(path, world.passages)
                corpora.append((f"world {n:,}", path, [r.question for r in world.splits["train"]][: args.n_questions]))
        if not args.no_mini:
            from hindsearch.data.mini import build_mini

            build_mini(args.shared, Path(tmp) / "mini", log=lambda *a: None)
            nq = Path(tmp) / "mini" / "nq.jsonl"
            qs = [json.loads(line)["question"] for line in nq.open(encoding="utf-8") if line.strip()][: args.n_questions]
            corpora.append(("mini-wiki", Path(tmp) / "mini" / "corpus.jsonl", qs))
        rows = []
        for name, path, qs in corpora:
            build_index(path, Path(tmp) / "idx", show_progress=False)
            ours = load_index(Path(tmp) / "idx", n_threads=th)
            raw = raw_bm25s([p.contents for p in read_corpus(path)], "numba")
            ours.retrieve(qs, k), raw(qs, k, th)  # warm-up
            t = interleaved({"ours": lambda: ours.retrieve(qs, k), "raw": lambda: raw(qs, k, th)}, args.repeats)
            rows.append((name, len(ours), len(qs), t["ours"], t["raw"]))
        if rows:
            print(f"\n### Cost vs corpus size (hindsearch vs raw bm25s numba, interleaved; load average {load_average()})\n")
            print("| corpus | passages | questions | ours µs/query (CPU) | raw numba µs/query (CPU) | ours/raw speed (CPU) "
                  "| ours µs/query (wall) | raw numba µs/query (wall) | ours/raw speed (wall) |")
            print("|---|---|---|---|---|---|---|---|---|")
            for name, n, nq, (ow, oc), (rw, rc) in rows:
                print(f"| {name} | {n:,} | {nq} | {1e6 * oc / nq:.1f} | {1e6 * rc / nq:.1f} | {rc / oc:.2f}x "
                      f"| {1e6 * ow / nq:.1f} | {1e6 * rw / nq:.1f} | {rw / ow:.2f}x |")
            worst = min(min(rc / oc, rw / ow) for *_, (ow, oc), (rw, rc) in rows)
            print(f"\ntarget >= 0.9x raw bm25s numba at every size: {'met' if worst >= 0.9 else 'NOT met'} (worst {worst:.2f}x)")
            same = [r for r in rows if r[0].startswith("world")]  # one generator: growth with size alone
            same = same if len(same) > 1 else rows
            if len(same) > 1:
                (_, n0, q0, (_, c0), (_, r0)), (_, n1, q1, (_, c1), (_, r1)) = min(same, key=lambda r: r[1]), max(same, key=lambda r: r[1])
                slope = lambda a, b: math.log(b / a) / math.log(n1 / n0)  # noqa: E731
                print(f"growth ({'world corpora' if same is not rows else 'all corpora'}) from {n0:,} to {n1:,} passages ({n1 / n0:.0f}x): ours x{(c1 / q1) / (c0 / q0):.1f} per query "
                      f"(log-log slope {slope(c0 / q0, c1 / q1):.2f}), raw numba x{(r1 / q1) / (r0 / q0):.1f} "
                      f"(slope {slope(r0 / q0, r1 / q1):.2f}); slope 1 = linear in the corpus")


def main_table(args: argparse.Namespace, tmp: Path) -> None:
    from rank_bm25 import BM25Okapi

    from hindsearch.data.corpus import read_corpus
    from hindsearch.retrieval.bm25 import tokenize
    from hindsearch.retrieval.factory import build_index, load_index

    k, th = args.k, args.threads
    questions = [json.loads(line)["question"] for line in open(args.questions, encoding="utf-8") if line.strip()][: args.n_questions]
    passages = read_corpus(args.corpus)
    texts = [p.contents for p in passages]
    notes = []
    t = time.perf_counter()
    build_index(args.corpus, tmp / "idx", show_progress=False)
    notes.append(f"hindsearch index build {time.perf_counter() - t:.2f} s")
    fns = {}
    for backend in ("numba", "sparse"):
        t = time.perf_counter()
        r = load_index(tmp / "idx", n_threads=th, bm25_backend=backend)
        r.retrieve(questions[:10], k)
        notes.append(f"hindsearch {backend}: load + first batch {time.perf_counter() - t:.2f} s")
        fns[f"hindsearch {backend}" + (" (default)" if backend == "numba" else " (fallback without numba)")] = (
            lambda r=r: r.retrieve(questions, k))
    for backend in ("numba", "numpy"):
        t = time.perf_counter()
        run = raw_bm25s(texts, backend)
        run(questions[:10], k, th)
        notes.append(f"raw bm25s {backend}: index + first batch {time.perf_counter() - t:.2f} s")
        fns[f"raw bm25s {backend} (ids only)"] = lambda run=run: run(questions, k, th)
    times = interleaved(fns, args.repeats)
    rows = [(name, len(questions), args.repeats, *times[name]) for name in fns]

    t = time.perf_counter()
    rank = BM25Okapi(tokenize(texts))
    notes.append(f"rank_bm25 build {time.perf_counter() - t:.2f} s")
    sub = tokenize(questions[: args.rank_queries])

    def run_rank() -> None:
        for q in sub:
            np.argsort(rank.get_scores(q))[::-1][:k]

    reps = max(1, args.repeats // 3)
    rows.append(("rank_bm25 BM25Okapi (rate extrapolated)", len(sub), reps, *interleaved({"rank": run_rank}, reps)["rank"]))

    base_wall, base_cpu = rows[-1][1] / rows[-1][3], rows[-1][1] / rows[-1][4]
    print(f"\n### {len(passages):,} passages ({Path(args.corpus).name}), {len(questions)} questions "
          f"({Path(args.questions).parent.name}); load average {load_average()}\n")
    print("; ".join(notes) + "\n")
    print("| retriever | queries x repeats | median wall (s) | queries/s (wall) | vs rank_bm25 (wall) | median CPU (s) "
          "| queries/s (CPU) | vs rank_bm25 (CPU) | µs/query (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n, reps, wall, cpu in rows:
        print(f"| {name} | {n} x{reps} | {wall:.3f} | {n / wall:,.0f} | {n / wall / base_wall:,.0f}x | {cpu:.3f} "
              f"| {n / cpu:,.0f} | {n / cpu / base_cpu:,.0f}x | {1e6 * cpu / n:.1f} |")
    ours = times["hindsearch numba (default)"]
    raw = times["raw bm25s numba (ids only)"]
    vs = (raw[0] / ours[0], raw[1] / ours[1])
    print(f"\ntarget >= 0.9x raw bm25s numba (interleaved): {'met' if min(vs) >= 0.9 else 'NOT met'} "
          f"({vs[1]:.2f}x CPU, {vs[0]:.2f}x wall)")
    x = min(rows[0][1] / rows[0][3] / base_wall, rows[0][1] / rows[0][4] / base_cpu)
    print(f"target >= 50x rank_bm25 (default path): {'met' if x >= 50 else 'NOT met'} ({x:,.0f}x)")


if __name__ == "__main__":
    main()
