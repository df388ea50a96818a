"""Issue 41, item 13: one machine with several addresses and slow uploads cannot starve the server's other clients.

70 slow uploads (a request head and one byte of body, then nothing) from 5 loopback addresses, 14 each, used to
take the 64 receiving places for the whole body timeout: every other client got 503. Now a client from an address
holding fewer places cuts the oldest upload of the address holding the most and is served at once. Real uvicorn,
real sockets, loopback only (127.0.0.0/8), 70 connections, a few seconds.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from hindsearch.retrieval.factory import load_index
from hindsearch.retrieval.limits import ServerLimits
from hindsearch.retrieval.server import BackgroundServer, create_app
from test_server_hostile import big_index  # noqa: F401  (64 passages holding the word 'common')

pytestmark = pytest.mark.timeout(120)

SLOW_HEAD = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{"


def slow_uploads(port: int, addresses: list[str], each: int) -> list[socket.socket]:
    socks = []
    for _ in range(each):
        for a in addresses:
            s = socket.socket()
            s.bind((a, 0))
            s.connect(("127.0.0.1", port))
            s.sendall(SLOW_HEAD)
            socks.append(s)
    return socks


def replies(socks: list[socket.socket]) -> list[bytes]:
    out = []
    for s in socks:
        try:
            out.append(s.recv(4096, socket.MSG_DONTWAIT))
        except BlockingIOError:
            out.append(b"")
    return out


def test_five_addresses_of_slow_uploads_do_not_starve_another_client(big_index):  # noqa: F811
    limits = ServerLimits(body_timeout_s=30.0)  # the defaults: 64 places, 16 per address
    assert (limits.max_receiving, limits.max_receiving_per_client) == (64, 16)
    with BackgroundServer(create_app(load_index(big_index), limits=limits)) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        attackers = [f"127.0.0.{i}" for i in range(2, 7)]
        socks = slow_uploads(port, attackers, 14)
        try:
            time.sleep(1.0)  # every upload has its head read and holds (or was refused) a place
            for _ in range(3):
                t0 = time.time()
                r = httpx.post(srv.url + "/retrieve", json={"queries": ["common amber"], "topk": 2}, timeout=10)
                assert r.status_code == 200 and len(r.json()["result"][0]) == 2, r.text
                assert time.time() - t0 < 5  # at once, not after the attackers' 30 s body timeout
            time.sleep(0.3)
            got = replies(socks)
            cut = [g for g in got if g.startswith(b"HTTP/1.1 503") and b"cut to make room" in g]
            assert len(cut) == 1, got  # one attacker upload cut for the first request; then a place stayed free
            # a client at yet another address is served too, and the attackers' fair share is intact
            extra = socket.socket()
            extra.bind(("127.0.0.9", 0))
            extra.connect(("127.0.0.1", port))
            body = b'{"queries": ["common birch"], "topk": 1}'
            extra.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
            extra.settimeout(10)
            assert extra.recv(4096).startswith(b"HTTP/1.1 200"), "a fourth address was not served"
            extra.close()
        finally:
            for s in socks:
                s.close()
