"""CLI: ``hindsearch index``, ``hindsearch search`` and ``hindsearch serve``."""

from __future__ import annotations

import argparse


def cmd_index(args: argparse.Namespace) -> int:
    from hindsearch.retrieval.base import build_index

    meta = build_index(args.corpus, args.out, kind=args.kind, encoder=args.encoder, skip_bad=args.skip_bad,
                       hnsw=args.hnsw, device=args.device, batch_size=args.batch_size)
    skipped = f", {meta['skipped_rows']} bad rows skipped" if meta.get("skipped_rows") else ""
    print(f"indexed {meta['n_docs']} passages ({meta['kind']}{', ' + meta['encoder'] if meta.get('encoder') else ''}) "
          f"into {args.out}{skipped}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    if bool(args.index) == bool(args.url):
        raise ValueError("give exactly one of --index DIR or --url URL")
    if args.url:
        from hindsearch.retrieval.client import RemoteRetriever

        retriever = RemoteRetriever(args.url, timeout_s=args.timeout, retries=1)
    else:
        from hindsearch.retrieval.base import load_index

        retriever = load_index(args.index)
    for query in args.query:
        hits = retriever.retrieve([query], args.k)[0]
        print(f"query: {query!r} ({len(hits)} hits)")
        for rank, p in enumerate(hits, 1):
            snippet = " ".join(p.text.split())[: args.snippet]
            print(f"{rank:>3}. [{p.score or 0.0:.3f}] {p.bare_title}  (id {p.id})\n     {snippet}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from hindsearch.retrieval.server import ServerLimits, serve

    limits = ServerLimits(max_queries=args.max_queries, max_topk=args.max_topk)
    serve(args.index, host=args.host, port=args.port, topk=args.topk, limits=limits, device=args.device)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build a BM25 or dense index from a corpus")
    p.add_argument("--corpus", required=True, help="corpus .jsonl (id, contents | title+text) or .json list")
    p.add_argument("--out", required=True, help="index folder to write")
    p.add_argument("--kind", choices=("bm25", "dense"), default="bm25")
    p.add_argument("--encoder", default="minilm", help="dense encoder: minilm, e5-base-v2 or an HF path/id")
    p.add_argument("--skip-bad", action="store_true", help="skip and count malformed rows instead of failing")
    p.add_argument("--hnsw", type=int, default=None, metavar="M", help="dense: HNSW graph with M links (default: flat)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=64)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="print the top-k passages for queries")
    p.add_argument("query", nargs="+")
    p.add_argument("--index", help="index folder")
    p.add_argument("--url", help="retrieval server URL instead of --index")
    p.add_argument("-k", type=int, default=3)
    p.add_argument("--snippet", type=int, default=160, help="characters of text shown per hit")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("serve", help="serve an index over HTTP (Search-R1 /retrieve API)")
    p.add_argument("--index", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--topk", type=int, default=3, help="default topk when a request gives none")
    p.add_argument("--max-queries", type=int, default=512)
    p.add_argument("--max-topk", type=int, default=100)
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_serve)
