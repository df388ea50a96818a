"""A HindSearch judge behind an OpenAI-compatible chat-completions endpoint (``judge_kind =
openai``).

``OpenAIJudge`` sends the in-process judge's message (``judge.judge_prompt_with_steps``) to
``{judge_url}/chat/completions`` greedily, ``judge_concurrency`` at a time, and cleans each answer
as the in-process judge does (``judge.finish``). Nothing is lost, nothing hangs: timeouts, 429s and
5xxs are retried with backoff; a request that still fails becomes that rollout's error critique;
401/403/404 stop the run (``JudgeRejected``); an endpoint that never connects raises
``JudgeUnavailable``. The options: docs/methods.md; serving one: docs/gpu.md.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from hindsearch.agent import protocol
from hindsearch.hindsight.judge import Critique, finish, judge_prompt_with_steps
from hindsearch.records import Trajectory

MAX_ANSWER_BYTES = 8 << 20
"""A chat-completions answer larger than this is refused (a malformed answer for that rollout)."""


class JudgeUnavailable(ConnectionError):
    """The judge endpoint could not be reached: every attempt of a request failed to connect."""


class JudgeRejected(ValueError):
    """The judge endpoint refused the run's requests (401, 403, 404: the key, the URL or the model
    name)."""


def chat_completions_url(base: str) -> str:
    """``{base}/chat/completions`` for a base URL such as ``http://host:8000/v1`` (a URL that
    already ends with ``/chat/completions`` is kept)."""
    base = base.rstrip("/")
    return base if base.endswith("/chat/completions") else base + "/chat/completions"


def chat_request(model: str, message: str, max_tokens: int) -> dict[str, Any]:
    """The chat-completions body of one judge prompt: one user message, greedy, at most
    ``max_tokens`` tokens."""
    return {"model": model, "messages": [{"role": "user", "content": message}],
            "max_tokens": max_tokens, "temperature": 0.0, "n": 1, "stream": False}


def parse_chat_answer(body: bytes) -> tuple[str, int | None]:
    """The first choice's message text of a chat-completions answer, and ``usage.prompt_tokens``
    when it is an integer. Raises ``ValueError`` naming what is missing or malformed."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"answer is not JSON ({e}): {body[:200]!r}") from None
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"answer has no choices[0]: {body[:200]!r}")
    msg = choices[0].get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    if not isinstance(content, str):
        raise ValueError(f"answer's choices[0].message.content is not text: {body[:200]!r}")
    usage = doc.get("usage")
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return content, n if isinstance(n, int) and not isinstance(n, bool) else None


def api_key(env_name: str | None) -> str | None:
    """The API key from the environment variable ``env_name`` (None: no key). Raises ``ValueError``
    naming the variable when it is named but unset or empty."""
    if not env_name:
        return None
    key = os.environ.get(env_name, "")
    if not key:
        raise ValueError(f"hindsearch.judge_api_key_env = {env_name!r}: the environment variable "
                         f"{env_name} is not set (export the judge endpoint's API key there)")
    return key


@dataclass
class Reply:
    """One judge request's outcome: the answer's text, or an error; the ``attempts`` made;
    ``prompt_tokens`` from the answer's usage, when given."""

    text: str | None = None
    error: str | None = None
    attempts: int = 0
    prompt_tokens: int | None = None


class OpenAIJudge:
    """Critiques from an OpenAI-compatible chat-completions endpoint (see the module doc)."""

    kind = "openai"

    def __init__(self, cfg: Any, tokenizer: Any) -> None:
        if not cfg.judge_url or not cfg.judge_model:
            raise ValueError("hindsearch.judge_kind = 'openai' needs hindsearch.judge_url and "
                             "hindsearch.judge_model")
        self.cfg, self.tokenizer = cfg, tokenizer
        self.url = chat_completions_url(cfg.judge_url)
        key = api_key(cfg.judge_api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        n = cfg.judge_concurrency
        self.client = httpx.Client(
            headers=headers, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        self.errors = 0
        self.requests = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._down: str | None = None

    def close(self) -> None:
        self.client.close()

    def critique(self, trajs: Sequence[Trajectory]) -> list[Critique]:
        """One ``Critique`` per trajectory, in order; a failed request is that rollout's ``error``
        critique. Raises ``JudgeUnavailable`` when the endpoint cannot be reached and
        ``JudgeRejected`` on a 401/403/404."""
        t0 = time.perf_counter()
        cfg = self.cfg
        msgs, steps = [], []
        for tr in trajs:
            msg, st = judge_prompt_with_steps(tr, cfg.judge_template, cfg.judge_sees_gold,
                                              cfg.judge_max_prompt_tokens, self.tokenizer)
            msgs.append(msg)
            steps.append(st)
        self._down = None
        if msgs:
            with ThreadPoolExecutor(max_workers=min(cfg.judge_concurrency, len(msgs)),
                                    thread_name_prefix="judge") as pool:
                replies = list(pool.map(self.ask, msgs))
        else:
            replies = []
        self.seconds += time.perf_counter() - t0
        if self._down is not None:
            raise JudgeUnavailable(self._down)
        out = []
        for tr, msg, st, rep in zip(trajs, msgs, steps, replies):
            n_prompt = rep.prompt_tokens if rep.prompt_tokens is not None else self._n_tokens(msg)
            if rep.error is not None or rep.text is None:
                self.errors += 1
                out.append(Critique(text="", error=rep.error, prompt_tokens=n_prompt,
                                    truncation=st))
                continue
            c = finish(rep.text, tr.golden_answers, cfg.judge_template, cfg.redact_gold_in_critique)
            c.prompt_tokens, c.truncation = n_prompt, st
            out.append(c)
        return out

    def _n_tokens(self, msg: str) -> int:
        text = protocol.apply_template(self.tokenizer, msg)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def ask(self, message: str) -> Reply:
        """One judge request with its retries (thread-safe): the answer's text, or the error of its
        last attempt."""
        cfg = self.cfg
        body = chat_request(cfg.judge_model, message, cfg.critique_max_tokens)
        rep, last, connected, t0 = Reply(), "", False, time.monotonic()
        retry_after: float | None = None
        for attempt in range(cfg.judge_retries + 1):
            if self._down is not None:  # another request found the endpoint down: send nothing more
                return Reply(error=self._down, attempts=rep.attempts)
            if attempt:
                time.sleep(self._pause(attempt, retry_after))
            retry_after = None
            with self._lock:
                self.requests += 1
            rep.attempts += 1
            try:
                status, headers, data = self._attempt(body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            except (httpx.HTTPError, TimeoutError) as e:
                connected, last = True, f"{type(e).__name__}: {e or 'no answer'}"
                continue
            connected = True
            if status in (401, 403, 404):
                raise JudgeRejected(f"judge endpoint {self.url} refused the request (HTTP "
                                    f"{status}): {data[:300].decode(errors='replace')} (check "
                                    f"hindsearch.judge_url, judge_model and judge_api_key_env)")
            if status == 429 or status >= 500:
                last = f"HTTP {status}: {data[:300].decode(errors='replace')}"
                retry_after = _retry_after(headers)
                continue
            if status >= 400:
                rep.error = (f"judge endpoint answered HTTP {status}: "
                             f"{data[:300].decode(errors='replace')}")
                return rep
            try:
                rep.text, rep.prompt_tokens = parse_chat_answer(data)
            except ValueError as e:
                rep.error = f"judge endpoint gave a malformed answer: {e}"
            return rep
        tries = f"{rep.attempts} attempt{'s' if rep.attempts > 1 else ''}"
        if not connected:
            with self._lock:
                if self._down is None:
                    self._down = (f"judge endpoint {self.url} unreachable after {tries} in "
                                  f"{time.monotonic() - t0:.1f} s: {last} (is the server at "
                                  "hindsearch.judge_url up?)")
        rep.error = f"judge request failed after {tries}: {last}"
        return rep

    def _pause(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before retry ``attempt`` (1-based): exponential backoff, at least the server's
        ``Retry-After``, at most ``judge_timeout_s``."""
        pause = self.cfg.judge_backoff_s * 2 ** (attempt - 1)
        if retry_after is not None:
            pause = max(pause, retry_after)
        return min(pause, self.cfg.judge_timeout_s)

    def _attempt(self, body: dict[str, Any]) -> tuple[int, httpx.Headers, bytes]:
        """One POST that gives up after ``judge_timeout_s`` even when the answer trickles in."""
        t = self.cfg.judge_timeout_s
        deadline = time.monotonic() + t
        with self.client.stream("POST", self.url, json=body,
                                timeout=httpx.Timeout(t, connect=min(t, 10.0))) as r:
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    return 200, r.headers, b"<answer larger than %d bytes>" % MAX_ANSWER_BYTES
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"answer not complete within {t:g} s")
                chunks.append(chunk)
        return r.status_code, r.headers, b"".join(chunks)


def _retry_after(headers: httpx.Headers) -> float | None:
    try:
        v = float(headers.get("retry-after", ""))
    except ValueError:
        return None
    return v if v >= 0 else None
