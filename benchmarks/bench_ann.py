"""Approximate dense search: recall@k against exact search and queries/s, on real passages, and the 21M extrapolation.

The exact index is a flat dense index folder of the mini-wiki (30,220 real passages, ``hindsearch
data mini`` from ../shared/data), built once with the MiniLM encoder under ``--cache`` (the folder
``bench_retrieval_quality.py --mini`` uses too); ``--index`` takes any flat dense index folder instead.
Each approximate index is made from it the way ``hindsearch serve --faiss-index FLAT --factory ...``
converts Search-R1's ``e5_Flat.index`` (``dense.convert_flat``: trained on a seeded sample, vectors
added in chunks). The queries are the mini-wiki's benchmark questions, encoded once (encoding costs the
same for every index and is reported apart).

recall@k: the share of the exact top k that the approximate top k holds, over all queries. queries/s:
``index.search`` over all queries in one batch, one thread (FAISS' OpenMP set to 1), median of
``--repeats`` interleaved repeats, process CPU time and wall time; the load average is printed.

The last table extrapolates to Search-R1's 21,015,324 x 768 e5 index on paper, from the measured
per-vector costs: it is arithmetic, not a measurement (see its notes).

    python benchmarks/bench_ann.py [--mini DIR | --index DIR] [--hnsw 32 --ef 16,32,64,128 --ivf 256 --nprobe 4,8,16,32,64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
WIKI18 = (21_015_324, 768)  # Search-R1's e5_Flat.index: vectors x dimensions


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def clock(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def questions_of(mini: Path) -> list[str]:
    out = []
    for f in sorted(mini.glob("*.jsonl")):
        if f.name != "corpus.jsonl":
            out += [json.loads(line)["question"] for line in f.open(encoding="utf-8") if line.strip()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mini", default=None, help="folder of `hindsearch data mini` (default: built under --cache)")
    ap.add_argument("--index", default=None, help="a flat dense index folder (default: the mini-wiki's, built once)")
    ap.add_argument("--questions", default=None, help="questions file (.jsonl with 'question'; default: the mini-wiki's)")
    ap.add_argument("--encoder", default="minilm")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--hnsw", type=int, default=32, help="HNSW links per node (M); 0 skips HNSW")
    ap.add_argument("--ef", type=ints, default=ints("16,32,64,128"), help="HNSW efSearch values")
    ap.add_argument("--ivf", type=ints, default=ints("256"), help="IVF list counts (comma list); '' skips IVF")
    ap.add_argument("--nprobe", type=ints, default=ints("4,8,16,32,64"), help="IVF nprobe values")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cache", default=str(ROOT / ".hindsearch" / "bench-indexes"))
    args = ap.parse_args()

    import faiss

    from hindsearch.retrieval.dense import DenseRetriever, convert_flat, read_faiss, set_search_params
    from hindsearch.retrieval.factory import ensure_index

    faiss.omp_set_num_threads(1)
    cache = Path(args.cache)
    if args.index:
        if not args.questions:
            raise SystemExit("--index needs --questions (the mini-wiki's questions go with the mini-wiki's index)")
        index_dir = Path(args.index)
        qfile = Path(args.questions)
    else:
        mini = Path(args.mini) if args.mini else cache / "mini"
        if not (mini / "corpus.jsonl").exists():
            from hindsearch.data.mini import build_mini

            build_mini(DATA, mini, log=lambda *a: None)
        t = time.perf_counter()
        index_dir = ensure_index(mini / "corpus.jsonl", cache / f"{mini.name}-dense", kind="dense", encoder=args.encoder)
        print(f"flat index ready in {time.perf_counter() - t:.1f} s ({index_dir})")
        qfile = Path(args.questions) if args.questions else None
    if qfile is not None:
        questions = [json.loads(line)["question"] for line in qfile.open(encoding="utf-8") if line.strip()]
    else:
        questions = questions_of(mini)
    exact = DenseRetriever(index_dir)
    if exact.factory != "Flat":
        raise SystemExit(f"{index_dir}: a {exact.factory} index; give a flat (exact) one")
    n, d, k = int(exact.index.ntotal), int(exact.index.d), args.k
    w, c = clock(lambda: exact.encoder.encode(questions, kind="query"))
    q = exact.encoder.encode(questions, kind="query")
    print(f"{n:,} passages x {d} dims ({exact.encoder.name}); {len(questions):,} questions, encoded at "
          f"{len(questions) / c:,.0f} q/s CPU ({len(questions) / w:,.0f} wall); k={k}; one thread; load average {load_average()}")

    flat = read_faiss(index_dir / "faiss.index", mmap=False)
    truth = flat.search(q, k)[1]
    rows, builds = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        variants = [("Flat (exact)", flat, [({}, "-")])]
        specs = ([f"HNSW{args.hnsw}"] if args.hnsw else []) + [f"IVF{nl},Flat" for nl in args.ivf]
        for factory in specs:
            path = Path(tmp) / f"{factory.replace(',', '_')}.index"
            t, c0 = time.perf_counter(), time.process_time()
            convert_flat(index_dir / "faiss.index", path, factory)
            builds[factory] = (time.perf_counter() - t, time.process_time() - c0, path.stat().st_size)
            index = faiss.read_index(str(path))
            grid = ([({"efSearch": e}, f"efSearch={e}") for e in args.ef] if factory.startswith("HNSW")
                    else [({"nprobe": p}, f"nprobe={p}") for p in args.nprobe])
            variants.append((factory, index, grid))
        timings: dict[tuple[str, str], list[tuple[float, float]]] = {}
        recalls: dict[tuple[str, str], float] = {}
        for _ in range(args.repeats):  # interleaved: every setting once per repeat
            for factory, index, grid in variants:
                for params, label in grid:
                    set_search_params(index, params)
                    out = {}
                    timings.setdefault((factory, label), []).append(clock(lambda: out.setdefault("ids", index.search(q, k)[1])))
                    found = out["ids"]
                    recalls[(factory, label)] = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth)]))
        for factory, index, grid in variants:
            for params, label in grid:
                ts = timings[(factory, label)]
                wall, cpu = statistics.median(t for t, _ in ts), statistics.median(c for _, c in ts)
                rows.append((factory, label, recalls[(factory, label)], len(questions) / cpu, len(questions) / wall, params))
    exact_cpu = next(r[3] for r in rows if r[0].startswith("Flat"))

    print(f"\n### recall@{k} against exact search, queries/s (load average {load_average()})\n")
    print(f"| index | search parameter | recall@{k} | queries/s (CPU) | queries/s (wall) | speed-up vs exact (CPU) |")
    print("|---|---|---|---|---|---|")
    for factory, label, rec, qps, qpw, _ in rows:
        print(f"| {factory} | {label} | {rec:.3f} | {qps:,.0f} | {qpw:,.0f} | {qps / exact_cpu:.1f}x |")
    print("\nbuild (convert from the flat index, one thread): " + "; ".join(
        f"{f}: {c:.1f} s CPU ({w:.1f} s wall), {b / 2**20:.0f} MiB" for f, (w, c, b) in builds.items()))

    # ---- on paper: 21M x 768
    hnsw_build = ""
    N, D = WIKI18
    scale = (N / n) * (D / d)
    flat_us = 1e6 / exact_cpu * scale
    print(f"\n### Extrapolation to {N:,} x {D} (Search-R1's e5 index): on paper, not measured\n")
    print("| index | setting | est. ms per query, one core | est. queries/s, one core | memory | basis |")
    print("|---|---|---|---|---|---|")
    print(f"| Flat (exact) | - | {flat_us / 1e3:,.0f} | {1e6 / flat_us:.2f} | {N * D * 4 / 1e9:.1f} GB (fp32), "
          f"{N * D * 2 / 1e9:.1f} GB in fp16 on GPUs | measured µs/query x {N / n:,.0f} (vectors) x {D / d:.0f} (dims): "
          "exact search is linear in both |")
    c_flat = 1 / exact_cpu / (n * d)  # CPU seconds per vector-dimension, batched exact search (BLAS)
    big_nlist = 65536
    ivf_rows = [r for r in rows if r[0].startswith("IVF") and r[5].get("nprobe")]
    if ivf_rows:
        costs = []  # measured CPU seconds per scanned vector-dimension of each IVF setting (less its coarse search)
        for factory, label, rec, qps, _, params in ivf_rows:
            nlist = int(factory[3:].split(",")[0])
            costs.append(max(1e-15, 1 / qps - nlist * d * c_flat) / (params["nprobe"] / nlist * n * d))
        c_ivf = statistics.median(costs)
        per_list = N / big_nlist
        for nprobe in (64, 256, 1024):
            us = 1e6 * (big_nlist * D * c_flat + nprobe * per_list * D * c_ivf)
            share = nprobe / big_nlist
            near = min(ivf_rows, key=lambda r: abs(r[5]["nprobe"] / int(r[0][3:].split(",")[0]) - share))
            print(f"| IVF{big_nlist},Flat | nprobe={nprobe} ({100 * share:.2f}% of the lists, ~{nprobe * per_list:,.0f} "
                  f"vectors scanned) | {us / 1e3:,.1f} | {1e6 / us:,.1f} | {N * (D * 4 + 8) / 1e9:.1f} GB | the 65,536 centroids "
                  f"at the flat cost + the scanned vectors at this run's IVF cost per vector-dimension ({c_ivf / c_flat:.0f}x "
                  f"flat's). Recall at 21M not known: here {near[1]} ({100 * near[5]['nprobe'] / int(near[0][3:].split(',')[0]):.1f}% "
                  f"of the lists) gave {near[2]:.3f} |")
    for factory, label, rec, qps, _, params in rows:
        if factory.startswith("HNSW") and params.get("efSearch") == 64:
            import math

            us = 1e6 / qps * (math.log(N) / math.log(n)) * (D / d)
            print(f"| {factory},Flat | {label} | {us / 1e3:,.2f} | {1e6 / us:,.0f} | {N * (D * 4 + 2 * args.hnsw * 4) / 1e9:.1f} GB "
                  f"(vectors + links; in RAM, no mmap) | measured x log(N) ratio ({math.log(N) / math.log(n):.2f}) x "
                  f"{D / d:.0f} (dims); recall@{k} {rec:.3f} at 30k, lower at 21M for the same efSearch; building it "
                  "is hours on many cores |")
            hn = builds.get(factory)
            if hn:
                build_h = hn[1] * (N / n) * (math.log(N) / math.log(n)) * (D / d) / 3600
                hnsw_build = f"; building HNSW{args.hnsw} (insertions ~ N log N x dims from this run's {hn[1]:.1f} s CPU): ~{build_h:,.1f} core-hours"
    train = 40 * big_nlist  # FAISS wants >= 39 points per centroid
    add_h = N * big_nlist * D * c_flat / 3600
    print(f"\nBuilding IVF{big_nlist},Flat from e5_Flat.index (on paper): k-means on {train:,} sampled vectors "
          f"(~{10 * train * big_nlist * D * c_flat / 3600:,.1f} core-hours for 10 iterations) and assigning all {N / 1e6:.0f}M "
          f"vectors to their list (~{add_h:,.1f} core-hours), both at this run's flat cost per vector-dimension; on a GPU "
          "these are minutes (not measured here)" + hnsw_build + ".")


if __name__ == "__main__":
    main()
