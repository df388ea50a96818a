"""``ServerLimits``: the bounds of ``hindsearch serve`` (a light module, so ``serve --help`` shows the
defaults without importing FastAPI). See ``hindsearch.retrieval.server`` for what each bound does."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ServerLimits:
    """Limits of ``/retrieve`` (see the module docstring); ``serve --help`` lists them as flags."""

    max_queries: int = 4096
    max_topk: int = 100
    max_query_chars: int = 4096
    max_body_bytes: int = 4 << 20
    max_hits: int = 65536
    max_inflight: int = 4
    max_pending: int = 64
    queue_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_receiving: int = 64  # connections whose body is still arriving, at once (they hold no admission slot)
    max_receiving_per_client: int = 16  # ... of them from one client address
    max_unsent_bytes: int = 64 << 20  # answer bytes built and not yet taken by their clients; beyond, requests wait
    send_timeout_s: float = 30.0  # seconds a client has to take its answer once it fills the socket buffer

    def validate(self) -> "ServerLimits":
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be a positive number, got {value!r}")
        return self
