"""Retrieval server overhead: 64-query batches over HTTP (real uvicorn on loopback) vs in-process.

The server runs in its own process (``hindsearch.retrieval.server.serve``) on a free
127.0.0.1 port, over the same index the in-process retriever loads; the client is
``RemoteRetriever`` (one persistent HTTP connection, scores requested, JSON parsed back
into ``Passage``s). Each batch is timed end to end, the two paths alternating batch by
batch; the table gives medians and the ratio.

    python benchmarks/bench_server.py [--corpus FILE --questions FILE --batch 64 --rounds 3 --kind bm25]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not become healthy in {timeout} s")


def time_interleaved(fns: list, batches: list[list[str]], rounds: int) -> list[list[float]]:
    """Seconds per batch for each fn; the fns alternate batch by batch so load drift hits both alike."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for b in batches:
            for times, fn in zip(out, fns):
                t = time.perf_counter()
                fn(b)
                times.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(DATA / "wiki18-slice" / "wiki18_passages_from_search_r1_runs.jsonl"))
    ap.add_argument("--questions", default=str(DATA / "ros-subsample" / "nq" / "test.jsonl"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--kind", choices=("bm25", "dense"), default="bm25")
    ap.add_argument("--index", default=None, help="existing index folder (default: build one in a temp folder)")
    args = ap.parse_args()

    from hindsearch.retrieval.factory import build_index, load_index
    from hindsearch.retrieval.client import RemoteRetriever

    qs = [json.loads(line)["question"] for line in open(args.questions, encoding="utf-8") if line.strip()]
    batches = [qs[i : i + args.batch] for i in range(0, len(qs) - args.batch + 1, args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(args.index) if args.index else Path(tmp) / "idx"
        if not args.index:
            build_index(args.corpus, index, kind=args.kind, show_progress=False)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        code = f"from hindsearch.retrieval.server import serve; serve({str(index)!r}, port={port}, topk={args.k}, log_level='warning')"
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            wait_healthy(url, proc)
            local = load_index(index)
            remote = RemoteRetriever(url, timeout_s=60, retries=0)
            for b in batches[:2]:  # warm-up both paths
                assert [[p.id for p in h] for h in remote.retrieve(b, args.k)] == [[p.id for p in h] for h in local.retrieve(b, args.k)]
            t_local, t_http = time_interleaved(
                [lambda b: local.retrieve(b, args.k), lambda b: remote.retrieve(b, args.k)], batches, args.rounds
            )
        finally:
            proc.terminate()
            proc.wait(10)

    m_local, m_http = statistics.median(t_local), statistics.median(t_http)
    print(f"index: {args.kind} over {Path(args.corpus).name}; {len(batches)} batches of {args.batch} questions x {args.rounds} rounds; k={args.k}")
    print()
    print("| path | batches timed | median ms/batch | p90 ms/batch | queries/s |")
    print("|---|---|---|---|---|")
    for name, t in (("in-process", t_local), ("HTTP (uvicorn, loopback)", t_http)):
        p90 = sorted(t)[int(0.9 * (len(t) - 1))]
        print(f"| {name} | {len(t)} | {1000 * statistics.median(t):.1f} | {1000 * p90:.1f} | {args.batch / statistics.median(t):,.0f} |")
    ratio = m_http / m_local
    print(f"\nHTTP / in-process median latency: {ratio:.2f}x (target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'}); "
          f"HTTP overhead {1000 * (m_http - m_local):.1f} ms per batch")


if __name__ == "__main__":
    main()
