"""A retrieval HTTP server compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` takes ``{"queries": [str, ...], "topk": int, "return_scores": bool}``
(``topk`` missing/0/null -> the server default; ``return_scores`` defaults to false, as in
Search-R1) and answers ``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}``
with scores or ``{"result": [[{"id", "contents"}, ...], ...]}`` without, serialised exactly as
FastAPI serialises Search-R1's dict. ``GET /health`` reports the index and the limits.

Bad requests never crash the server: they get a 4xx JSON ``{"error": "..."}`` (400 malformed
JSON, 413 body too large, 422 wrong fields/types or a limit exceeded); a retriever failure
gets 500 ``{"error": ...}``. Binds 127.0.0.1 by default.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from hindsearch.retrieval.base import IndexedRetriever, Retriever


@dataclass
class ServerLimits:
    """Per-request limits of ``/retrieve``."""

    max_queries: int = 512
    max_topk: int = 100
    max_query_chars: int = 4096
    max_body_bytes: int = 4 << 20


class BadRequest(Exception):
    def __init__(self, status: int, msg: str):
        super().__init__(msg)
        self.status = status


def _error(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status)


def parse_request(body: bytes, default_topk: int, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body -> (queries, topk, return_scores); raises ``BadRequest``."""
    if len(body) > limits.max_body_bytes:
        raise BadRequest(413, f"request body is {len(body)} bytes; the limit is {limits.max_body_bytes}")
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest(422, 'request body must be a JSON object like {"queries": [...], "topk": 3}')
    if "queries" not in req:
        raise BadRequest(422, "missing field 'queries' (a list of strings)")
    queries = req["queries"]
    if not isinstance(queries, list):
        raise BadRequest(422, f"'queries' must be a list of strings, got {type(queries).__name__}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(422, f"queries[{i}] must be a string, got {type(q).__name__}")
        if len(q) > limits.max_query_chars:
            raise BadRequest(422, f"queries[{i}] has {len(q)} characters; the limit is {limits.max_query_chars}")
    if len(queries) > limits.max_queries:
        raise BadRequest(422, f"{len(queries)} queries in one request; the limit is {limits.max_queries}")
    topk = req.get("topk")
    if topk is None or topk == 0 and not isinstance(topk, bool):
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise BadRequest(422, f"'topk' must be a non-negative integer, got {req.get('topk')!r}")
    if topk > limits.max_topk:
        raise BadRequest(422, f"'topk' = {topk} exceeds the limit {limits.max_topk}")
    scores = req.get("return_scores", False)
    if scores is None:
        scores = False
    if not isinstance(scores, bool):
        raise BadRequest(422, f"'return_scores' must be true or false, got {scores!r}")
    return queries, topk, scores


def format_result(hits: list[list[Any]], return_scores: bool) -> dict:
    """Search-R1's response body from per-query ``Passage`` lists."""
    if return_scores:
        return {"result": [[{"document": p.to_search_r1(), "score": float(p.score or 0.0)} for p in ps] for ps in hits]}
    return {"result": [[p.to_search_r1() for p in ps] for ps in hits]}


def render_ids(retriever: IndexedRetriever, queries: list[str], topk: int, return_scores: bool) -> bytes:
    """Fast path for index-backed retrievers: splice the stored compact-JSON rows into the body.

    Byte-identical to ``JSONResponse(format_result(...)).body`` (a test checks it): rows are
    stored exactly as FastAPI renders a document and a float renders as its ``repr``.
    """
    store = retriever.store
    lists = []
    for docs, scores in retriever.retrieve_ids(queries, topk):
        if return_scores:
            items = [b'{"document":' + store.raw(int(d)) + b',"score":' + repr(float(sc)).encode() + b"}" for d, sc in zip(docs, scores)]
        else:
            items = [store.raw(int(d)) for d in docs]
        lists.append(b"[" + b",".join(items) + b"]")
    return b'{"result":[' + b",".join(lists) + b"]}"


def create_app(retriever: Retriever, default_topk: int = 3, limits: ServerLimits | None = None, info: dict | None = None) -> FastAPI:
    """The FastAPI app serving ``retriever``."""
    limits = limits or ServerLimits()
    if not 0 < default_topk <= limits.max_topk:
        raise ValueError(f"default topk {default_topk} must be in 1..{limits.max_topk}")
    app = FastAPI(title="hindsearch retrieval server")

    @app.get("/health")
    def health() -> dict:
        n = len(retriever) if hasattr(retriever, "__len__") else None
        return {"status": "ok", "n_docs": n, "default_topk": default_topk, **asdict(limits), **(info or {})}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return _error(413, f"request body is {declared} bytes; the limit is {limits.max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():  # stop reading a (chunked) body as soon as it is too large
            size += len(chunk)
            if size > limits.max_body_bytes:
                return _error(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes")
            chunks.append(chunk)
        try:
            queries, topk, scores = parse_request(b"".join(chunks), default_topk, limits)
        except BadRequest as e:
            return _error(e.status, str(e))
        try:
            if isinstance(retriever, IndexedRetriever):
                body = await run_in_threadpool(render_ids, retriever, queries, topk, scores)
                return Response(body, media_type="application/json")
            hits = await run_in_threadpool(retriever.retrieve, queries, topk)
        except Exception as e:  # a retriever bug must not take the server down
            return _error(500, f"retrieval failed: {type(e).__name__}: {e}")
        return JSONResponse(format_result(hits, scores))

    return app


def serve(
    index_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    topk: int = 3,
    limits: ServerLimits | None = None,
    device: str = "cpu",
    log_level: str = "info",
) -> None:
    """Load ``index_dir`` and serve it with uvicorn until interrupted."""
    import uvicorn

    from hindsearch.retrieval.base import load_index, read_meta

    meta = read_meta(index_dir)
    app = create_app(load_index(index_dir, device=device), default_topk=topk, limits=limits,
                     info={"kind": meta.get("kind"), "encoder": meta.get("encoder")})
    uvicorn.run(app, host=host, port=port, log_level=log_level)


class BackgroundServer:
    """Serve an ASGI app with uvicorn on a free loopback port in a daemon thread (tests, notebooks).

    ``url`` is ``http://127.0.0.1:PORT``; ``stop()`` shuts it down. Also a context manager.
    """

    def __init__(self, app: Any, start_timeout_s: float = 20.0) -> None:
        import socket
        import threading
        import time

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + start_timeout_s
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"retrieval server on {self.url} did not start within {start_timeout_s} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
