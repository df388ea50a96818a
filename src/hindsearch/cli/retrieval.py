"""CLI: ``hindsearch index``, ``hindsearch search`` and ``hindsearch serve``."""

from __future__ import annotations

import argparse

from hindsearch.cli.args import RETRIEVAL_URL, http_url, port_number, positive_float, positive_int
from hindsearch.retrieval.limits import ServerLimits


E5 = "e5-base-v2"


def cmd_index(args: argparse.Namespace) -> int:
    if args.faiss_index:
        from hindsearch.retrieval.dense import faiss_factory, import_faiss

        if args.kind != "dense" or args.skip_bad:
            raise ValueError("--faiss-index imports a prebuilt dense index: "
                             "--kind bm25 and --skip-bad do not apply "
                             "(the corpus must match the index row for row)")
        meta = import_faiss(args.faiss_index, args.corpus, args.out, encoder=args.encoder or E5,
                            query_prefix=args.query_prefix, device=args.device,
                            factory=faiss_factory(args.factory, args.hnsw),
                            nprobe=args.nprobe, ef_search=args.ef_search, log=print)
        if meta["faiss_link"] != "convert":
            how = f"{meta['faiss_link']}ed"
        else:
            how = f"converted to {meta['factory']}"
        print(f"imported {args.faiss_index} ({meta['n_docs']} vectors of {meta['dim']}, {how}, "
              f"{meta['encoder']}, query prefix {meta['prefixes'][0]!r}) "
              f"with the passages of {args.corpus} into {args.out}")
        return 0
    if args.query_prefix is not None:
        raise ValueError("--query-prefix goes with --faiss-index "
                         "(a built dense index uses its encoder's prefixes)")
    from hindsearch.retrieval.factory import build_index

    meta = build_index(args.corpus, args.out, kind=args.kind, encoder=args.encoder or "minilm",
                       skip_bad=args.skip_bad, hnsw=args.hnsw, device=args.device,
                       batch_size=args.batch_size, factory=args.factory,
                       nprobe=args.nprobe, ef_search=args.ef_search)
    skipped = f", {meta['skipped_rows']} bad rows skipped" if meta.get("skipped_rows") else ""
    encoder = ", " + meta["encoder"] if meta.get("encoder") else ""
    print(f"indexed {meta['n_docs']} passages ({meta['kind']}{encoder}) into {args.out}{skipped}")
    return 0


def index_folder(args: argparse.Namespace) -> str:
    """The index folder ``search``/``serve`` load: ``--index``, or the one made for
    ``--faiss-index`` + ``--corpus``."""
    if args.faiss_index:
        from hindsearch.retrieval.dense import ensure_faiss_index

        if not args.corpus:
            raise ValueError("--faiss-index needs --corpus, the corpus file the index was built "
                             "from (one vector per line)")
        return str(ensure_faiss_index(args.faiss_index, args.corpus, args.index,
                                      encoder=args.encoder or E5, query_prefix=args.query_prefix,
                                      device=args.device, factory=args.factory))
    for flag, value in (("--corpus", args.corpus), ("--encoder", args.encoder),
                        ("--query-prefix", args.query_prefix), ("--factory", args.factory)):
        if value is not None:
            raise ValueError(f"{flag} goes with --faiss-index "
                             "(an index folder records its corpus and encoder)")
    if not args.index:
        raise ValueError("give --index DIR (from `hindsearch index`) "
                         "or --faiss-index FILE --corpus FILE")
    return args.index


def cmd_search(args: argparse.Namespace) -> int:
    if bool(args.index or args.faiss_index) == bool(args.retrieval_url):
        raise ValueError("give exactly one of --index DIR, --faiss-index FILE --corpus FILE, "
                         f"or {RETRIEVAL_URL} URL")
    if args.retrieval_url:
        from hindsearch.retrieval.client import RemoteRetriever

        retriever = RemoteRetriever(args.retrieval_url, timeout_s=args.timeout, retries=1)
    else:
        from hindsearch.retrieval.factory import load_index

        retriever = load_index(index_folder(args), device=args.device, **dense_options(args))
    for query in args.query:
        hits = retriever.retrieve([query], args.k)[0]
        print(f"query: {query!r} ({len(hits)} hits)")
        for rank, p in enumerate(hits, 1):
            snippet = " ".join(p.text.split())[: args.snippet]
            print(f"{rank:>3}. [{p.score or 0.0:.3f}] {p.bare_title}  (id {p.id})\n     {snippet}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from hindsearch.retrieval.server import ServerLimits, serve

    limits = ServerLimits(
        max_queries=args.max_queries, max_topk=args.max_topk, max_query_chars=args.max_query_chars,
        max_body_bytes=args.max_body_bytes, max_hits=args.max_hits, max_inflight=args.max_inflight,
        max_pending=args.max_pending, queue_timeout_s=args.queue_timeout,
        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
        max_receiving=args.max_receiving, max_receiving_per_client=args.max_receiving_per_client,
        max_unsent_bytes=args.max_unsent_bytes, send_timeout_s=args.send_timeout)
    if args.topk > args.max_topk:
        raise ValueError(f"--topk {args.topk} exceeds --max-topk {args.max_topk}")
    options = dense_options(args)
    serve(index_folder(args), host=args.host, port=args.port, topk=args.topk, limits=limits,
          device=args.device, docs=args.docs, **({"retriever_options": options} if options else {}))
    return 0


def dense_options(args: argparse.Namespace) -> dict:
    """``load_index`` keywords of ``--nprobe``, ``--ef-search`` and ``--faiss-gpu`` (only those
    given)."""
    opts = {"nprobe": args.nprobe, "ef_search": args.ef_search, "faiss_gpu": args.faiss_gpu or None}
    return {k: v for k, v in opts.items() if v is not None}


def add_search_param_flags(p: argparse.ArgumentParser) -> None:
    """``--nprobe N`` (IVF) and ``--ef-search N`` (HNSW): how much of an approximate dense index a
    query visits."""
    p.add_argument("--nprobe", type=positive_int, default=None,
                   help="dense IVF index: inverted lists visited per query (more: better recall, "
                        "slower; default: the index's, 32 when built)")
    p.add_argument("--ef-search", type=positive_int, default=None,
                   help="dense HNSW index: candidate list size per query "
                        "(default: the index's, 64 when built)")


def add_dense_search_flags(p: argparse.ArgumentParser) -> None:
    """``search``/``serve``: the search parameters and ``--faiss-gpu``."""
    add_search_param_flags(p)
    p.add_argument("--faiss-gpu", action="store_true",
                   help="dense: copy the FAISS index to every visible GPU, sharded, in fp16 "
                        "(as Search-R1's server); without a GPU build of FAISS or a GPU it warns "
                        "and searches on the CPU")


def add_faiss_flags(p: argparse.ArgumentParser) -> None:
    """``--faiss-index FILE --corpus FILE [--encoder NAME --query-prefix TEXT]``: serve a prebuilt
    FAISS file."""
    p.add_argument("--faiss-index", metavar="FILE",
                   help="a prebuilt FAISS index file (e.g. Search-R1's e5_Flat.index) instead of "
                        "an index folder; needs --corpus. Its passages are indexed once into "
                        "--index (default: FILE.hindsearch) and reused")
    p.add_argument("--corpus",
                   help="with --faiss-index: the corpus it was built from, one vector per line in "
                        "order (.jsonl or .jsonl.gz, e.g. wiki-18.jsonl.gz)")
    p.add_argument("--encoder", default=None,
                   help="with --faiss-index: the encoder that made its vectors "
                        f"(default: {E5}, as Search-R1's index)")
    p.add_argument("--query-prefix", default=None,
                   help="with --faiss-index: text put before each query "
                        "(default: 'query: ' for e5 encoders, else none)")
    p.add_argument("--factory", default=None, metavar="STRING",
                   help="with --faiss-index: convert the flat index once into this approximate "
                        "FAISS index (e.g. 'IVF65536,Flat' or HNSW32) inside --index, instead of "
                        "searching it exactly")


class IndexKinds:
    """``--kind``'s choices: the registered index-backed kinds (``bm25``, ``dense``, a plugin's),
    read when argparse checks a value or prints the help, so the kinds' modules are imported only
    then."""

    def __iter__(self):
        from hindsearch.retrieval.base import index_kinds

        return iter(index_kinds())

    def __contains__(self, kind: object) -> bool:
        return kind in list(self)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``index``, ``search`` and ``serve`` to ``sub``."""
    register_index(sub)
    register_search(sub)
    register_serve(sub)


def register_index(sub: argparse._SubParsersAction) -> None:
    """``hindsearch index``: build an index folder from a corpus (or import a prebuilt FAISS
    file)."""
    p = sub.add_parser(
        "index", help="build a BM25 or dense index from a corpus",
        description="Build a BM25 or dense index folder from a corpus file (.jsonl, .jsonl.gz or "
                    ".json). An existing --out is replaced only when it is an index folder "
                    "or empty.")
    p.add_argument("--corpus", required=True,
                   help="corpus .jsonl or .jsonl.gz (id, contents | title+text per line) "
                        "or .json list")
    p.add_argument("--out", required=True,
                   help="index folder to write (new, empty, or an earlier index)")
    kind = p.add_argument("--kind", default="bm25", help="retriever kind")
    # set after add_argument, which would read the choices (and import every kind) now
    kind.choices = IndexKinds()
    p.add_argument("--encoder", default=None,
                   help=f"dense encoder: minilm, {E5} or an HF path/id "
                        f"(default: minilm; {E5} with --faiss-index)")
    p.add_argument("--faiss-index", metavar="FILE",
                   help="dense: import this prebuilt FAISS file (e.g. Search-R1's e5_Flat.index, "
                        "built from --corpus, one vector per line) instead of encoding the corpus; "
                        "it is hard-linked, not copied")
    p.add_argument("--query-prefix", default=None,
                   help="with --faiss-index: text put before each query "
                        "(default: 'query: ' for e5 encoders, else none)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip and count malformed rows instead of failing")
    p.add_argument("--hnsw", type=positive_int, default=None, metavar="M",
                   help="dense: HNSW graph with M links, the same as --factory HNSWM "
                        "(default: a flat, exact index)")
    p.add_argument("--factory", default=None, metavar="STRING",
                   help="dense: FAISS index factory string, inner product: Flat (default, exact), "
                        "HNSW32, 'IVF4096,Flat' (IVF is trained on a sample of the passages); with "
                        "--faiss-index: convert that flat file into this index "
                        "instead of linking it")
    add_search_param_flags(p)
    p.add_argument("--device", default="cpu", help="dense: device of the encoder (cpu, cuda)")
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="dense: passages per encoder batch")
    p.set_defaults(func=cmd_index)


def register_search(sub: argparse._SubParsersAction) -> None:
    """``hindsearch search``: print the top-k passages for queries (local index or a server)."""
    p = sub.add_parser(
        "search", help="print the top-k passages for queries",
        description="Print the top-k passages for each query, from an index folder, a prebuilt "
                    "FAISS file with its corpus, or a retrieval server.")
    p.add_argument("query", nargs="+", help="one or more queries (quote each)")
    p.add_argument("--index",
                   help="index folder "
                        f"(default: none; give this, --faiss-index or {RETRIEVAL_URL})")
    p.add_argument(RETRIEVAL_URL, type=http_url, metavar="URL",
                   help="retrieval server URL instead of --index, as the config's retrieval.url "
                        f"and `eval {RETRIEVAL_URL}` (default: none)")
    add_faiss_flags(p)
    add_dense_search_flags(p)
    p.add_argument("--device", default="cpu", help="dense: device of the query encoder (cpu, cuda)")
    p.add_argument("-k", type=positive_int, default=3, help="passages per query")
    p.add_argument("--snippet", type=positive_int, default=160,
                   help="characters of text shown per hit")
    p.add_argument("--timeout", type=positive_float, default=10.0,
                   help=f"seconds to wait for the server ({RETRIEVAL_URL})")
    p.set_defaults(func=cmd_search)


def register_serve(sub: argparse._SubParsersAction) -> None:
    """``hindsearch serve``: serve an index over HTTP; every ``ServerLimits`` bound is a flag (its
    default the default)."""
    lim = ServerLimits()
    p = sub.add_parser(
        "serve", help="serve an index over HTTP (Search-R1 /retrieve API)",
        description="Serve an index folder (or a prebuilt FAISS file with its corpus, e.g. "
                    "Search-R1's e5_Flat.index with wiki-18.jsonl.gz) over HTTP with Search-R1's "
                    "POST /retrieve API (and GET /health). Requests over a limit get a 4xx JSON "
                    "error; every limit below is a flag. Memory stays bounded by about "
                    "(max-receiving + max-pending + max-inflight) x max-body-bytes of bodies, "
                    "max-inflight parses, and max-unsent-bytes plus max-inflight answers.")
    p.add_argument("--index",
                   help="index folder to serve (from `hindsearch index`); with --faiss-index, the "
                        "folder its passages go to (default: none; give this or --faiss-index)")
    add_faiss_flags(p)
    add_dense_search_flags(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; 0.0.0.0 exposes it to the network")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (0..65535)")
    p.add_argument("--topk", type=positive_int, default=3,
                   help="passages per query when a request gives no topk")
    p.add_argument("--max-queries", type=positive_int, default=lim.max_queries,
                   help="queries per request; Search-R1's trainer sends a whole batch "
                        "(512 x 5 = 2,560) in one POST")
    p.add_argument("--max-topk", type=positive_int, default=lim.max_topk,
                   help="largest topk a request may ask for")
    p.add_argument("--max-query-chars", type=positive_int, default=lim.max_query_chars,
                   help="characters per query")
    p.add_argument("--max-body-bytes", type=positive_int, default=lim.max_body_bytes,
                   help="request body size")
    p.add_argument("--max-hits", type=positive_int, default=lim.max_hits,
                   help="queries x topk per request (bounds the response size)")
    p.add_argument("--max-inflight", type=positive_int, default=lim.max_inflight,
                   help="requests parsed and retrieved at the same time")
    p.add_argument("--max-pending", type=positive_int, default=lim.max_pending,
                   help="further requests that may wait for a slot; beyond them a request gets 503")
    p.add_argument("--queue-timeout", type=positive_float, default=lim.queue_timeout_s,
                   help="seconds a request may wait for a slot before a 503")
    p.add_argument("--header-timeout", type=positive_float, default=lim.header_timeout_s,
                   help="seconds a connection has to send its request head before it is dropped")
    p.add_argument("--body-timeout", type=positive_float, default=lim.body_timeout_s,
                   help="seconds a request has to send its body before a 408")
    p.add_argument("--max-receiving", type=positive_int, default=lim.max_receiving,
                   help="requests whose body is still arriving, at once (they hold no admission "
                        "slot); beyond: 503, unless the address holding the most has its oldest "
                        "upload cut for one holding fewer")
    p.add_argument("--max-receiving-per-client", type=positive_int,
                   default=lim.max_receiving_per_client, help="of those, from one client address")
    p.add_argument("--max-unsent-bytes", type=positive_int, default=lim.max_unsent_bytes,
                   help="bytes of answers not yet taken by their clients; beyond it requests wait "
                        "(queue timeout)")
    p.add_argument("--send-timeout", type=positive_float, default=lim.send_timeout_s,
                   help="seconds a client has to take its answer once it fills the socket buffer, "
                        "then it is reset")
    p.add_argument("--device", default="cpu", help="dense: device of the query encoder (cpu, cuda)")
    p.add_argument("--docs", action="store_true", help="also serve /docs and /openapi.json")
    p.set_defaults(func=cmd_serve)
