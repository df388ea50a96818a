"""A retrieval HTTP server compatible with Search-R1's ``retrieval_server.py``.

``POST /retrieve`` reads and answers exactly what Search-R1's server does; ``GET /health`` reports
the index and the limits. A bad request gets a 4xx JSON ``{"error": ...}`` naming the field and the
limit, a retriever failure a 500, a passage store changed on disk a 503. Every input is bounded by
``ServerLimits``, so memory stays bounded. Binds 127.0.0.1 by default; ``/docs`` and
``/openapi.json`` only with ``docs=True``. The contract, the limits, and which of them uvicorn and
pydantic hold and which need the code here: docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import ipaddress
import json
import logging
import re
import socket
import struct
import weakref
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Optional

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator, BaseModel, Field, Strict, ValidationError, model_validator
from pydantic_core import PydanticCustomError, PydanticKnownError
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from hindsearch.retrieval.base import IndexedRetriever, Retriever, StoreChanged
from hindsearch.retrieval.limits import ServerLimits


log = logging.getLogger("hindsearch.server")


class BadRequest(Exception):
    def __init__(self, status: int, msg: str):
        super().__init__(msg)
        self.status = status


def _error(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"error": msg}, status_code=status)


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def count_containers(body: bytes, limit: int) -> int:
    """The JSON objects/arrays of a body, not counting ``[``/``{`` inside strings (exact for valid
    JSON; for a broken body, at least those before the point where parsing would stop). The plain
    count is used when it is within ``limit``: strings can only add to it."""
    n = body.count(b"{") + body.count(b"[")
    if n <= limit:
        return n
    bare = _JSON_STRING.sub(b"", body)
    return bare.count(b"{") + bare.count(b"[")


def client_key(host: str) -> str:
    """The address that ``max_receiving_per_client`` counts: an IPv4 address, or an IPv6 address's
    /64 (one host's share of a network; a client can pick any address in it)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 4:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


@functools.lru_cache(maxsize=16)
def request_model(max_queries: int, max_query_chars: int, max_topk: int, max_hits: int,
                  default_topk: int) -> type[BaseModel]:
    """The ``/retrieve`` body as Search-R1's ``QueryRequest`` reads it (``topk: Optional[int]``,
    lax), with the limits as pydantic constraints; ``topk`` comes out resolved (missing, 0 or null:
    ``default_topk``). ``return_scores`` is a strict bool (``"yes"`` or ``1`` is refused, not read
    as true)."""

    # not StringConstraints: it refuses the lone surrogates Search-R1 takes
    def query_chars(q: str) -> str:
        if len(q) > max_query_chars:
            raise PydanticKnownError("string_too_long", {"max_length": max_query_chars})
        return q

    class RetrieveRequest(BaseModel):
        queries: Annotated[list[Annotated[str, AfterValidator(query_chars)]],
                           Field(max_length=max_queries, fail_fast=True)]
        topk: Optional[Annotated[int, Field(ge=0, le=max_topk)]] = None
        return_scores: Optional[Annotated[bool, Strict()]] = None

        @model_validator(mode="after")
        def _hits(self) -> "RetrieveRequest":
            self.topk = self.topk or default_topk
            self.return_scores = bool(self.return_scores)
            if len(self.queries) * self.topk > max_hits:
                n, k = len(self.queries), self.topk
                text = ("{n} queries x topk {k} = {hits} passages in one answer; "
                        "the limit is {limit}")
                values = {"n": n, "k": k, "hits": n * k, "limit": max_hits}
                raise PydanticCustomError("too_many_hits", text, values)
            return self

    return RetrieveRequest


def _first_error(e: ValidationError) -> str:
    """The first error, as its field and pydantic's text: ``queries[3]: String should have at most
    4096 characters``."""
    err = e.errors(include_url=False, include_input=False, include_context=False)[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
    if err["type"] == "model_type":
        return (f'request body: {err["msg"]} '
                '(a /retrieve body is like {"queries": [...], "topk": 3})')
    return f"{where}: {err['msg']}" if where else err["msg"]


def parse_request(body: bytes, default_topk: int,
                  limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body -> (queries, topk, return_scores); raises ``BadRequest``."""
    if len(body) > limits.max_body_bytes:
        raise BadRequest(413, f"request body is {len(body)} bytes; "
                              f"the limit is {limits.max_body_bytes}")
    containers = count_containers(body, limits.max_queries + 1024)  # a valid body has 2
    if containers > limits.max_queries + 1024:
        raise BadRequest(422, f"request body holds {containers} JSON objects/arrays; "
                              "a /retrieve body is one object with one list of strings, "
                              'like {"queries": [...], "topk": 3}')
    # json.loads, as FastAPI and so Search-R1 parse
    # (docs/protocol.md says why not model_validate_json)
    try:
        data = json.loads(body)
    except RecursionError:
        raise BadRequest(400, "request body is nested too deeply") from None
    except ValueError as e:
        # JSONDecodeError, UnicodeDecodeError, an integer over Python's digit limit
        reason = " ".join(str(e).split())[:300]
        raise BadRequest(400, f"request body is not valid JSON: {reason}") from None
    model = request_model(limits.max_queries, limits.max_query_chars, limits.max_topk,
                          limits.max_hits, default_topk)
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        raise BadRequest(422, _first_error(e)) from None
    return req.queries, req.topk, req.return_scores


def _trim_memory() -> None:
    """Give freed heap pages back to the OS after a large request (glibc only; else a no-op)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def format_result(hits: list[list[Any]], return_scores: bool) -> dict:
    """Search-R1's response body from per-query ``Passage`` lists."""
    if return_scores:
        return {"result": [[{"document": p.to_search_r1(), "score": float(p.score or 0.0)}
                            for p in ps] for ps in hits]}
    return {"result": [[p.to_search_r1() for p in ps] for ps in hits]}


def render_ids(retriever: IndexedRetriever, queries: list[str], topk: int,
               return_scores: bool) -> bytearray:
    """Fast path for index-backed retrievers: splice the stored compact-JSON rows into the body.

    Byte-identical to ``JSONResponse(format_result(...)).body`` (a test checks it): rows are
    stored exactly as FastAPI renders a document and a float renders as its ``repr``. Built in one
    buffer (peak memory about the answer's size). Raises ``StoreChanged`` when the passage store
    changed on disk before or while the rows were read.
    """
    store = retriever.store
    store.check()
    out = bytearray(b'{"result":[')
    for i, (docs, scores) in enumerate(retriever.retrieve_ids(queries, topk)):
        if return_scores:
            items = [b'{"document":' + store.raw(int(d)) + b',"score":'
                     + repr(float(sc)).encode() + b"}" for d, sc in zip(docs, scores)]
        else:
            items = [store.raw(int(d)) for d in docs]
        out += b",[" if i else b"["
        out += b",".join(items)
        out += b"]"
    out += b"]}"
    store.check()
    return out


class _Answer(Response):
    """A JSON answer written in ``CHUNK`` pieces as the client reads it (uvicorn waits for the
    socket buffer to drain between pieces), its bytes counted in ``service.unsent`` until the last
    piece is handed over or the connection ends (``guarded_protocol`` resets a client that stops
    reading)."""

    CHUNK = 64 << 10

    def __init__(self, body: bytes | bytearray, service: "_RetrieveService") -> None:
        super().__init__(b"", media_type="application/json")
        self.body = body
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.raw_headers.append((b"content-length", str(len(body)).encode()))
        service.hold(len(body))
        # released once: when sent, or when dropped unsent
        self._release = weakref.finalize(self, service.release, len(body))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            body, step = self.body, self.CHUNK
            for i in range(0, max(len(body), 1), step):
                await send({"type": "http.response.body", "body": bytes(body[i : i + step]),
                            "more_body": i + step < len(body)})
        finally:
            self.body = b""
            self._release()


SMALL_ANSWER = 1 << 20  # answers up to this size have their own quarter of max_unsent_bytes


class _Upload:
    """A request whose body is arriving: its body timeout (``asyncio.Timeout``, set once the read
    starts) and whether it was cut to make room for another address's request
    (``_RetrieveService.make_room``)."""

    __slots__ = ("timeout", "cut")

    def __init__(self) -> None:
        self.timeout: asyncio.Timeout | None = None
        self.cut = False


class _RetrieveService:
    """What ``create_app``'s routes share: the retriever, the limits, the admission gates and the
    count of requests in progress (one instance per app; its methods are the route handlers)."""

    def __init__(self, retriever: Retriever, default_topk: int, limits: ServerLimits,
                 info: dict | None) -> None:
        self.retriever = retriever
        self.default_topk = default_topk
        self.limits = limits
        self.info = info
        self.slots = asyncio.Semaphore(limits.max_inflight)
        # bodies over 1 MiB are parsed one at a time (~13x the body)
        self.big_slot = asyncio.Semaphore(1)
        # requests whose body is in and that have not been answered (admission slots held)
        self.pending = 0
        self.receiving = 0  # requests whose body is arriving
        self.receiving_from: Counter[str] = Counter()  # ... per client address
        self.uploads: dict[str, list[_Upload]] = {}  # ... each, oldest first, per client address
        # bytes of answers built, not yet handed over: large, small
        self.unsent = {True: 0, False: 0}
        # set (and replaced) when unsent goes down: wakes those waiting for room
        self.freed = asyncio.Event()
        store = getattr(retriever, "store", None)
        try:  # the mean stored row, to estimate an answer's size before it is built
            self.row_bytes = (int(store.offsets[-1]) - int(store.offsets[0])) / max(1, len(store))
        except (AttributeError, TypeError, IndexError):
            self.row_bytes = 1024.0

    def hold(self, n: int) -> None:
        self.unsent[n > SMALL_ANSWER] += n

    def release(self, n: int) -> None:
        self.unsent[n > SMALL_ANSWER] -= n
        freed, self.freed = self.freed, asyncio.Event()
        freed.set()

    def room(self, answer_bytes: float) -> bool:
        """Whether an answer of about ``answer_bytes`` may be built now: the unsent answers over
        1 MiB may take 3/4 of ``max_unsent_bytes``, the smaller ones the other 1/4, so that clients
        that never read large answers do not hold up small ones."""
        if answer_bytes > SMALL_ANSWER:
            return self.unsent[True] < 0.75 * self.limits.max_unsent_bytes
        return self.unsent[False] < 0.25 * self.limits.max_unsent_bytes

    # health and retrieve are the route handlers: no docstrings
    # (FastAPI would publish them in /openapi.json)

    def health(self) -> dict:  # GET /health: the index size, the default topk, the limits and info
        n = len(self.retriever) if hasattr(self.retriever, "__len__") else None
        store = getattr(self.retriever, "store", None)
        try:
            if store is not None and hasattr(store, "check"):
                store.check()
        except StoreChanged as e:
            return JSONResponse({"status": "error", "error": str(e), "n_docs": n}, status_code=503)
        return {"status": "ok", "n_docs": n, "default_topk": self.default_topk,
                **asdict(self.limits), **(self.info or {})}

    async def read_body(self, request: Request,
                        upload: _Upload | None = None) -> bytes | JSONResponse:
        """The request body, or a 413/408 error response (too large, or not received in time), or a
        503 when ``upload`` was cut to make room for another address."""
        limits = self.limits
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return _error(413, f"request body is {declared} bytes; "
                               f"the limit is {limits.max_body_bytes}")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(limits.body_timeout_s) as timeout:
                if upload is not None:
                    upload.timeout = timeout
                # stop reading a (chunked) body once it is too large
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limits.max_body_bytes:
                        return _error(413, "request body exceeds the limit of "
                                           f"{limits.max_body_bytes} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            if upload is not None and upload.cut:
                return _error(503, "server busy: this upload was cut to make room for other "
                                   "clients (its address held the most request bodies arriving); "
                                   "retry later")
            return _error(408, f"request body not received within {limits.body_timeout_s:g} s")
        return b"".join(chunks)

    def parse(self, body: bytes) -> tuple[list[str], int, bool] | JSONResponse:
        """Parse one body (in the thread pool) into (queries, topk, return_scores), or an
        error response."""
        try:
            return parse_request(body, self.default_topk, self.limits)
        except BadRequest as e:
            return _error(e.status, str(e))
        except Exception as e:  # a bug must not take the server down
            return _error(500, f"parsing failed: {type(e).__name__}: {e}")
        finally:
            if len(body) > 1 << 20:
                _trim_memory()

    def answer(self, queries: list[str], topk: int,
               scores: bool) -> bytes | bytearray | JSONResponse:
        """Retrieve and render (in the thread pool): the JSON bytes, or an error response."""
        try:
            if isinstance(self.retriever, IndexedRetriever):
                return render_ids(self.retriever, queries, topk, scores)
            return JSONResponse(format_result(self.retriever.retrieve(queries, topk), scores)).body
        except StoreChanged as e:
            log.error("%s", e)
            return _error(503, str(e))
        except Exception as e:  # a retriever bug must not take the server down
            return _error(500, f"retrieval failed: {type(e).__name__}: {e}")
        finally:
            if len(queries) * topk > 4096:
                _trim_memory()

    async def acquire(self, deadline: float, gates: list[asyncio.Semaphore],
                      answer_bytes: float | None = None) -> list[asyncio.Semaphore] | None:
        """Take ``gates`` in order, by ``deadline`` (loop time); with ``answer_bytes``, first wait
        (holding no gate) until the unsent answers leave room for one of that size (``room``). The
        gates held, or None (none held) when the deadline passes."""
        held: list[asyncio.Semaphore] = []
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    if answer_bytes is not None:
                        while not self.room(answer_bytes):
                            await self.freed.wait()
                    for gate in gates:
                        await gate.acquire()
                        held.append(gate)
                    if answer_bytes is None or self.room(answer_bytes):
                        return held
                    for gate in held:  # the room went while waiting for a slot
                        gate.release()
                    held = []
        except TimeoutError:
            for gate in held:
                gate.release()
            return None

    def _leave(self, host: str, upload: _Upload) -> None:
        """``upload`` gives its receiving place back (once: when it ends, or when it is cut)."""
        self.receiving -= 1
        self.receiving_from[host] -= 1
        if not self.receiving_from[host]:
            del self.receiving_from[host]
        mine = self.uploads.get(host, [])
        if upload in mine:
            mine.remove(upload)
        if not mine:
            self.uploads.pop(host, None)

    def make_room(self, host: str) -> bool:
        """All receiving places are taken: when the address holding the most of them holds at least
        two more than ``host``, cut its oldest upload (its body timeout fires now: a 503) and give
        its place to ``host``. So the places are shared fairly between addresses: a machine with
        many addresses and slow uploads cannot keep another client out, whatever the caps."""
        if not self.receiving_from:
            return False
        top, most = self.receiving_from.most_common(1)[0]
        if most < self.receiving_from[host] + 2:
            return False
        for victim in list(self.uploads.get(top, [])):
            if victim.timeout is None or victim.cut:
                continue
            try:
                victim.timeout.reschedule(asyncio.get_running_loop().time())
            except RuntimeError:  # its timeout is already firing: it leaves by itself
                continue
            victim.cut = True
            self._leave(top, victim)
            log.info("cut a request body arriving from %s (%d arriving from it) for %s",
                     top, most, host)
            return True
        return False

    async def receive(self, request: Request) -> bytes | Response:
        """The body, read while holding a receiving place (``max_receiving``,
        ``max_receiving_per_client`` per address; none free: 503 unless ``make_room`` frees one), or
        an error response."""
        limits = self.limits
        host = client_key(request.client.host if request.client else "")
        if self.receiving >= limits.max_receiving and not self.make_room(host):
            return _error(503, f"server busy: {self.receiving} request bodies arriving; "
                               "retry later")
        if self.receiving_from[host] >= limits.max_receiving_per_client:
            return _error(503, f"server busy: {self.receiving_from[host]} request bodies "
                               f"arriving from {host}; "
                               f"the limit per client is {limits.max_receiving_per_client}")
        upload = _Upload()
        self.receiving += 1
        self.receiving_from[host] += 1
        self.uploads.setdefault(host, []).append(upload)
        try:
            return await self.read_body(request, upload)
        finally:
            if not upload.cut:
                self._leave(host, upload)

    # POST /retrieve: read, admit, wait, retrieve
    async def retrieve(self, request: Request) -> Response:
        limits = self.limits
        try:
            body = await self.receive(request)
        except ClientDisconnect:
            log.info("client %s disconnected before its request was read", request.client)
            return Response(status_code=400)
        if isinstance(body, Response):
            return body
        if self.pending >= limits.max_inflight + limits.max_pending:
            return _error(503, f"server busy: {self.pending} requests in progress; retry later")
        self.pending += 1
        busy = f"server busy: no retrieval slot within {limits.queue_timeout_s:g} s; retry later"
        try:
            deadline = asyncio.get_running_loop().time() + limits.queue_timeout_s
            # parse under a slot (and under the big-body slot for a body over 1 MiB)
            gates = [self.big_slot, self.slots] if len(body) > 1 << 20 else [self.slots]
            held = await self.acquire(deadline, gates)
            if held is None:
                return _error(503, busy)
            try:
                parsed = await run_in_threadpool(self.parse, body)
            finally:
                for gate in held:
                    gate.release()
            del body
            if isinstance(parsed, Response):
                return parsed
            queries, topk, scores = parsed
            # retrieve under a slot, once the unsent answers leave room for this one
            # (waiting holds no slot)
            estimate = len(queries) * topk * (self.row_bytes + (40 if scores else 2))
            held = await self.acquire(deadline, [self.slots], answer_bytes=estimate)
            if held is None:
                return _error(503, busy)
            try:
                out = await run_in_threadpool(self.answer, queries, topk, scores)
            finally:
                for gate in held:
                    gate.release()
            return out if isinstance(out, Response) else _Answer(out, self)
        finally:
            self.pending -= 1


def create_app(retriever: Retriever, default_topk: int = 3, limits: ServerLimits | None = None,
               info: dict | None = None, docs: bool = False) -> FastAPI:
    """The FastAPI app serving ``retriever`` (``docs``: also ``/docs`` and ``/openapi.json``)."""
    limits = (limits or ServerLimits()).validate()
    if not 0 < default_topk <= limits.max_topk:
        raise ValueError(f"--topk {default_topk} must be in 1..{limits.max_topk} (--max-topk)")
    if docs:
        app = FastAPI(title="hindsearch retrieval server")
    else:
        app = FastAPI(title="hindsearch retrieval server",
                      docs_url=None, redoc_url=None, openapi_url=None)
    service = _RetrieveService(retriever, default_topk, limits, info)
    app.state.limits = limits  # BackgroundServer reads send_timeout_s here
    app.get("/health")(service.health)
    app.post("/retrieve")(service.retrieve)
    return app


def uvicorn_options(header_timeout_s: float, send_timeout_s: float) -> dict[str, Any]:
    """``uvicorn.Config`` keywords for the server's connection deadlines: uvicorn's keep-alive
    timer (``timeout_keep_alive``) is the header timeout, and ``guarded_protocol`` arms it from
    the start."""
    return {"http": guarded_protocol(send_timeout_s), "timeout_keep_alive": header_timeout_s}


def guarded_protocol(send_timeout_s: float = 30.0) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the two connection deadlines uvicorn lacks.

    Request head: uvicorn's keep-alive timer is also armed when a connection opens, and only a
    complete request head cancels it (uvicorn cancels it on any byte), so a head must be complete
    within ``timeout_keep_alive`` of the connection opening or of its last response. Answer: a
    client that has not taken its answer ``send_timeout_s`` after it first filled the socket's write
    buffer (64 KiB past what the kernel holds) is reset, which frees what uvicorn and the kernel
    hold for it."""

    class GuardedH11Protocol(H11Protocol):
        _send_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

        def data_received(self, data: bytes) -> None:  # uvicorn's, without cancelling the timer
            self.conn.receive_data(data)
            self.handle_events()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(send_timeout_s, self._send_expired)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.cycle is None or self.cycle.response_complete:
                self._disarm_send()

        def _disarm_send(self) -> None:
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _send_expired(self) -> None:
            self._send_timer = None
            response_incomplete = self.cycle is not None and not self.cycle.response_complete
            if self.flow.write_paused or response_incomplete:
                log.info("dropped %s: its answer was not read within %g s",
                         self.client, send_timeout_s)
                sock = self.transport.get_extra_info("socket")
                try:  # reset, so the kernel drops what it still holds for this client too
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except (OSError, AttributeError):
                    pass
                self.transport.abort()

        def on_response_complete(self) -> None:
            if not self.flow.write_paused:
                self._disarm_send()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_send()
            super().connection_lost(exc)

    return GuardedH11Protocol


def serve(
    index_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    topk: int = 3,
    limits: ServerLimits | None = None,
    device: str = "cpu",
    log_level: str = "info",
    docs: bool = False,
    retriever_options: dict | None = None,
) -> None:
    """Load ``index_dir`` (``load_index`` keywords: ``retriever_options``) and serve it with uvicorn
    until interrupted."""
    import uvicorn

    from hindsearch.retrieval.base import read_meta

    from hindsearch.retrieval.factory import load_index

    limits = (limits or ServerLimits()).validate()
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: must be in 0..65535")
    meta = read_meta(index_dir)
    retriever = load_index(index_dir, device=device, **(retriever_options or {}))
    app = create_app(retriever, default_topk=topk, limits=limits,
                     info={"kind": meta.get("kind"), "encoder": meta.get("encoder")}, docs=docs)
    try:  # fail with one line (port in use, no permission) before uvicorn logs its own traceback
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        raise OSError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from e
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                **uvicorn_options(limits.header_timeout_s, limits.send_timeout_s))


class BackgroundServer:
    """Serve an ASGI app with uvicorn on a free loopback port in a daemon thread (tests, notebooks).

    ``url`` is ``http://127.0.0.1:PORT``; ``stop()`` shuts it down. Also a context manager. The send
    timeout is the app's ``send_timeout_s`` (``create_app``'s limits), else ``send_timeout_s``.
    """

    def __init__(self, app: Any, start_timeout_s: float = 20.0, header_timeout_s: float = 10.0,
                 send_timeout_s: float | None = None) -> None:
        import threading
        import time

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        if send_timeout_s is None:
            limits = getattr(getattr(app, "state", None), "limits", None)
            send_timeout_s = (limits if limits is not None else ServerLimits()).send_timeout_s
        options = uvicorn_options(header_timeout_s, send_timeout_s)
        config = uvicorn.Config(app, log_level="warning", **options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.time() + start_timeout_s
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"retrieval server on {self.url} "
                                   f"did not start within {start_timeout_s} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
