"""``RemoteRetriever``: the ``Retriever`` protocol over a Search-R1-compatible ``/retrieve`` server.

One POST per batch (chunked to the server's ``max_queries``, read once from ``/health`` when
the server has it, else ``max_batch``), bounded retries with exponential backoff on
connection errors, timeouts and 5xx; a 4xx answer is a bad request and raises ``ValueError``
at once. When the server stays unreachable, ``RetrieverUnavailable`` names the URL and the
last error.
"""

from __future__ import annotations

import time

import httpx

from hindsearch.records import Passage


class RetrieverUnavailable(ConnectionError):
    """The retrieval server could not be reached (after all retries)."""


def parse_hits(rows: list) -> list[Passage]:
    """One query's hits from either response shape (with or without scores)."""
    out = []
    for r in rows:
        doc, score = (r["document"], r.get("score")) if "document" in r else (r, None)
        out.append(Passage(id=str(doc.get("id", "")), contents=doc["contents"], score=None if score is None else float(score)))
    return out


class RemoteRetriever:
    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 3, backoff: float = 0.5, max_batch: int = 512):
        url = url.rstrip("/")
        self.base = url[: -len("/retrieve")] if url.endswith("/retrieve") else url
        self.url = self.base + "/retrieve"
        self.retries = retries
        self.backoff = backoff
        self.max_batch = max_batch
        self._limits_known = False
        self.client = httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def _learn_limits(self) -> None:
        """Read ``max_queries`` from ``/health`` once (Search-R1's own server has none: keep the default)."""
        self._limits_known = True
        try:
            r = self.client.get(self.base + "/health")
            if r.status_code == 200 and isinstance(r.json().get("max_queries"), int):
                self.max_batch = min(self.max_batch, r.json()["max_queries"])
        except (httpx.HTTPError, ValueError):
            pass

    def _post(self, payload: dict) -> dict:
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = self.client.post(self.url, json=payload)
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code >= 500:
                last = f"HTTP {r.status_code}: {r.text[:300]}"
                continue
            if r.status_code >= 400:
                raise ValueError(f"retrieval server {self.url} rejected the request (HTTP {r.status_code}): {r.text[:300]}")
            return r.json()
        raise RetrieverUnavailable(f"retrieval server {self.url} unavailable after {self.retries + 1} attempts: {last}")

    def retrieve(self, queries: list[str], k: int) -> list[list[Passage]]:
        out: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        if not live or k <= 0:
            return out
        if not self._limits_known:
            self._learn_limits()
        for s in range(0, len(live), self.max_batch):
            chunk = live[s : s + self.max_batch]
            body = self._post({"queries": [queries[i] for i in chunk], "topk": k, "return_scores": True})
            result = body.get("result")
            if not isinstance(result, list) or len(result) != len(chunk):
                raise ValueError(f"retrieval server {self.url} answered {len(result) if isinstance(result, list) else result!r} results for {len(chunk)} queries")
            for i, rows in zip(chunk, result):
                out[i] = parse_hits(rows)
        return out
