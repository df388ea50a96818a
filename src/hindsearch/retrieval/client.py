"""``RemoteRetriever``: the ``Retriever`` protocol over a Search-R1-compatible ``/retrieve`` server.

One POST per batch (chunked to the server's ``max_queries``), bounded retries with exponential
backoff on connection errors, timeouts and 5xx; a 4xx answer raises ``ValueError`` at once, and a
server that stays unreachable raises ``RetrieverUnavailable`` naming the URL and the last error. One
``retrieve`` call returns or raises within ``deadline_s``, whatever the server does; after such a
failure, calls within ``cooldown_s`` fail at once; a response over ``max_response_bytes`` is
refused. The bounds: docs/protocol.md, "The client's bounds".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from hindsearch.records import Passage
from hindsearch.retrieval.base import register_retriever


class RetrieverUnavailable(ConnectionError):
    """The retrieval server could not be reached (after all retries)."""


def parse_hits(rows: list) -> list[Passage]:
    """One query's hits from either response shape (with or without scores)."""
    out = []
    for r in rows:
        doc, score = (r["document"], r.get("score")) if "document" in r else (r, None)
        out.append(Passage(id=str(doc.get("id", "")), contents=doc["contents"],
                           score=None if score is None else float(score)))
    return out


class RemoteRetriever:
    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 3, backoff: float = 0.5,
                 max_batch: int = 512, deadline_s: float | None = None, cooldown_s: float = 5.0,
                 max_response_bytes: int = 512 << 20):
        if not (url.startswith("http://") or url.startswith("https://")):
            raise ValueError(f"retriever URL {url!r} must start with http:// or https://")
        url = url.rstrip("/")
        self.base = url[: -len("/retrieve")] if url.endswith("/retrieve") else url
        self.url = self.base + "/retrieve"
        self.retries = retries
        self.backoff = backoff
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s if deadline_s is not None else 2 * timeout_s
        self.cooldown_s = cooldown_s
        self.max_response_bytes = max_response_bytes
        self._limits_known = False
        self._down_until = 0.0
        self._down_msg = ""
        self.client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def _learn_limits(self, deadline: float) -> None:
        """Read ``max_queries`` from ``/health`` once (Search-R1's own server has none: keep the
        default)."""
        self._limits_known = True
        try:
            r = self.client.get(self.base + "/health",
                                timeout=max(0.1, min(self.timeout_s, deadline - time.monotonic())))
            if r.status_code == 200 and isinstance(r.json().get("max_queries"), int):
                self.max_batch = max(1, min(self.max_batch, r.json()["max_queries"]))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass

    def _attempt(self, payload: dict, deadline: float) -> httpx.Response:
        """One POST that gives up at ``deadline`` even when the server trickles its answer."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise httpx.TimeoutException("deadline reached")
        t = min(self.timeout_s, left)
        with self.client.stream("POST", self.url, json=payload,
                                timeout=httpx.Timeout(t, connect=min(t, 10.0))) as r:
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise ValueError(f"retrieval server {self.url} answered more than "
                                     f"{self.max_response_bytes} bytes")
                if time.monotonic() > deadline:
                    raise httpx.TimeoutException(
                        f"answer not complete within {self.deadline_s:g} s")
                chunks.append(chunk)
            r._content = b"".join(chunks)  # noqa: SLF001 - the body, read within the deadline
        return r

    def _post(self, payload: dict, deadline: float) -> dict:
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                pause = self.backoff * 2 ** (attempt - 1)
                if time.monotonic() + pause >= deadline:
                    break
                time.sleep(pause)
            try:
                r = self._attempt(payload, deadline)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                continue
            if r.status_code >= 400:
                raise ValueError(f"retrieval server {self.url} rejected the request (HTTP "
                                 f"{r.status_code}): {r.text[:300]}")
            try:
                return r.json()
            except ValueError:
                raise ValueError(f"retrieval server {self.url} answered with invalid JSON: "
                                 f"{r.text[:200]!r}") from None
        self._down_until = time.monotonic() + self.cooldown_s
        n = attempt + 1
        self._down_msg = (f"retrieval server {self.url} unavailable after {n} "
                          f"attempt{'s' if n > 1 else ''}: {last} "
                          f"(deadline {self.deadline_s:g} s per call)")
        raise RetrieverUnavailable(self._down_msg)

    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        out: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        if not live or k <= 0:
            return out
        if time.monotonic() < self._down_until:
            raise RetrieverUnavailable(self._down_msg + " (not retried: it failed less than "
                                       f"{self.cooldown_s:g} s ago)")
        deadline = time.monotonic() + self.deadline_s
        if not self._limits_known:
            self._learn_limits(deadline)
        for s in range(0, len(live), self.max_batch):
            chunk = live[s : s + self.max_batch]
            body = self._post(
                {"queries": [queries[i] for i in chunk], "topk": k, "return_scores": True},
                deadline)
            result = body.get("result") if isinstance(body, dict) else None
            if not isinstance(result, list) or len(result) != len(chunk):
                raise ValueError(f"retrieval server {self.url} answered "
                                 f"{len(result) if isinstance(result, list) else result!r} results "
                                 f"for {len(chunk)} queries")
            for i, rows in zip(chunk, result):
                out[i] = parse_hits(rows)
        return out


@register_retriever("remote")
def open_remote(cfg: Any, index_dir: Path | None, corpus: Path | None) -> RemoteRetriever:
    """``retrieval.kind = remote``: a Search-R1-compatible ``/retrieve`` server at
    ``retrieval.url``."""
    if not cfg.url:
        raise ValueError("retrieval.url is required when retrieval.kind = 'remote'")
    return RemoteRetriever(cfg.url, timeout_s=cfg.timeout_s, retries=cfg.retries)
