"""A small OpenAI-compatible chat-completions server for the tests: a tiny model built from a config, greedy
decode through transformers, served with real uvicorn on a free 127.0.0.1 port.

``ChatServer(model, tokenizer)`` answers ``POST /v1/chat/completions`` the way vLLM's ``vllm serve`` does (the
messages through the tokenizer's chat template, ``max_tokens``, ``temperature = 0``; 404 for another model name,
401 for a wrong bearer key) and ``GET /v1/models``. Faults are queued per request: ``server.faults.extend([...])``
with ``"slow:SECONDS"`` (answer after a pause), ``"500"``, ``"429"``, ``"badjson"`` (a body that is not JSON) or
``"nochoices"`` (JSON without ``choices``), or ``"say:TEXT"`` (answer TEXT instead of the model's text); each
chat request takes the next one. ``requests`` counts the chat
requests received, ``answers`` the texts sent; ``idle()`` waits until no request is being answered (a slow one the client gave up on
still finishes).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hindsearch.retrieval.server import BackgroundServer


class ChatServer:
    def __init__(self, model: Any, tokenizer: Any, name: str = "tiny-judge", key: str | None = None) -> None:
        self.model, self.tokenizer, self.name, self.key = model.eval(), tokenizer, name, key
        self.faults: deque[str] = deque()
        self.requests = 0
        self.inflight = 0
        self.answers: list[str] = []
        self.bodies: list[dict] = []
        self._lock = threading.Lock()
        self._gen = threading.Lock()
        self.server = BackgroundServer(self.app())
        self.url = self.server.url + "/v1"

    def stop(self) -> None:
        self.server.stop()

    def idle(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not self.inflight, f"{self.inflight} requests still being answered after {timeout_s} s"

    def generate(self, messages: list[dict], max_tokens: int) -> tuple[str, int, int]:
        """Greedy text for the chat ``messages``: (text, prompt tokens, completion tokens)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        else:
            ids = tok("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:",
                      add_special_tokens=False)["input_ids"]
        x = torch.tensor([list(ids)])
        with self._gen, torch.no_grad():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=False,
                                      pad_token_id=tok.pad_token_id)
        new = out[0, x.shape[1]:].tolist()
        return tok.decode(new, skip_special_tokens=True), x.shape[1], len(new)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        def models() -> dict:
            return {"object": "list", "data": [{"id": self.name, "object": "model"}]}

        @app.post("/v1/chat/completions")
        def chat(request: Request, body: dict) -> Response:
            with self._lock:
                self.requests += 1
                self.inflight += 1
                self.bodies.append(body)
                fault = self.faults.popleft() if self.faults else ""
            try:
                return answer(request, body, fault)
            finally:
                with self._lock:
                    self.inflight -= 1

        def answer(request: Request, body: dict, fault: str) -> Response:
            if self.key and request.headers.get("authorization") != f"Bearer {self.key}":
                return JSONResponse({"error": {"message": "invalid API key"}}, status_code=401)
            if body.get("model") != self.name:
                return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist."}},
                                    status_code=404)
            if fault.startswith("slow:"):
                time.sleep(float(fault.split(":", 1)[1]))
            elif fault in ("500", "429"):
                return JSONResponse({"error": {"message": f"injected {fault}"}}, status_code=int(fault))
            elif fault == "badjson":
                return Response(b'{"choices": [{"message": {"content": "unterminated', media_type="application/json")
            elif fault == "nochoices":
                return JSONResponse({"id": "x", "object": "chat.completion", "model": self.name})
            text, n_prompt, n_new = self.generate(body["messages"], int(body.get("max_tokens") or 16))
            if fault.startswith("say:"):
                text = fault.split(":", 1)[1]
            with self._lock:
                self.answers.append(text)
            return JSONResponse({
                "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "length" if n_new >= int(body.get("max_tokens") or 16) else "stop"}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_new, "total_tokens": n_prompt + n_new},
            })

        return app
