"""``ServerLimits``: the bounds of ``hindsearch serve`` (a light module, so ``serve --help`` shows
the defaults without importing FastAPI). See ``hindsearch.retrieval.server`` for what each bound
does."""

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
    # connections whose body is still arriving, at once (they hold no admission slot)
    max_receiving: int = 64
    # ... of them from one client address
    max_receiving_per_client: int = 16
    # answer bytes built and not yet taken by their clients; beyond, requests wait
    max_unsent_bytes: int = 64 << 20
    # seconds a client has to take its answer once it fills the socket buffer
    send_timeout_s: float = 30.0

    def validate(self) -> "ServerLimits":
        for name, value in asdict(self).items():
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not is_number or not value > 0 or value != value:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be a positive number, got {value!r}")
        return self
