"""Fuzz ``hindsearch serve`` with bad request bodies and hostile clients (issue 16); prints one table.

Starts ``hindsearch serve`` (its default limits) in its own process on a free 127.0.0.1 port, over
a BM25 index of the fictional world (2,000 passages, built under a temporary folder), then:

1. sends at least 60 bad bodies, one per request (malformed JSON, wrong types, limits exceeded,
   numbers past Python's digit limit, nesting past the recursion limit, oversize bodies,
   lone surrogates ...), and classifies each answer: a clean 4xx with a JSON ``error``, a 5xx
   (or a non-JSON answer, or no answer), or a silent acceptance (2xx for a bad body);
2. hostile clients: a slow request head, a slow body, an aborted upload (checks the server's log
   for tracebacks);
3. memory: 16 maximal requests at once, twice: 16 bodies at the size limit that parse to the
   largest Python object the server lets through to the parser (838k short strings, ~52 MiB per
   parse; rejected after parsing; a body of more objects/arrays than a request needs is refused
   before parsing), and 16 valid maximal requests (4,096 queries of 60 characters of words the
   corpus holds, topk 16 = max-hits: 65,536 passages, a ~36 MiB answer); the server's resident
   memory is sampled (peak = the kernel's VmHWM) and read again afterwards;
4. valid requests that must be answered (issue 23): a 2,560-query Search-R1 batch whose queries hold
   brackets and braces, ``topk`` as Search-R1's pydantic model takes it (``"3"``, ``3.0``, ``true``) ...;
5. slow uploads: 68 connections from one address (127.0.0.2) that send a request head and one byte of
   body, while another address (127.0.0.1) sends 10 ordinary requests: those must all be answered;
6. unread answers: 48 clients (each its own loopback address) send a maximal request (4,096 queries,
   topk 16, a ~36 MiB answer) and never read, for 60 s; the server's peak RSS (VmHWM) is compared with
   the bound stated in the README (``stated_bound_mib``), and a reading client probes every 5 s;
7. a truncated passage store: a second server over a copy of the index, whose ``passages.jsonl`` is
   truncated under it: the next request must get a JSON 503 and the server stay alive (was SIGBUS);
8. the server is alive afterwards (``/health`` and a good query answer 200).

    python benchmarks/fuzz_server.py [--json OUT.json] [--unread-seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import free_port, wait_healthy  # noqa: E402


def bad_bodies() -> list[tuple[str, bytes]]:
    """(name, body) pairs that a correct server must reject with a 4xx."""
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    deep = lambda n: b"[" * n + b"]" * n  # noqa: E731
    big = b"9" * 5000
    cases = [
        ("empty body", b""),
        ("whitespace", b"   \n "),
        ("lone brace", b"{"),
        ("lone bracket", b"["),
        ("truncated object", b'{"queries": ["a", "b"'),
        ("trailing comma", b'{"queries": ["a",]}'),
        ("single quotes", b"{'queries': ['a']}"),
        ("bare word", b"queries"),
        ("invalid utf-8", b"\xff\xfe\xfd"),
        ("empty key only", b'{"": ["a"]}'),
        ("invalid utf-8 in a string", b'{"queries": ["\xff"]}'),
        ("NUL bytes", b"\x00" * 64),
        ("JSON array", j(["a", "b"])),
        ("JSON string", j("a")),
        ("JSON number", j(3)),
        ("JSON null", b"null"),
        ("JSON true", b"true"),
        ("no queries field", j({"topk": 3})),
        ("queries null", j({"queries": None})),
        ("queries string", j({"queries": "a question"})),
        ("queries number", j({"queries": 3})),
        ("queries object", j({"queries": {"q": "a"}})),
        ("queries of numbers", j({"queries": [1, 2]})),
        ("queries with null", j({"queries": ["a", None]})),
        ("queries nested list", j({"queries": [["a"]]})),
        ("queries of objects", j({"queries": [{"q": "a"}]})),
        ("queries of bools", j({"queries": [True]})),
        ("too many queries", j({"queries": ["q"] * 5000})),
        ("query too long", j({"queries": ["x" * 5000]})),
        ("queries 3k-deep", b'{"queries": ' + deep(3_000) + b"}"),
        ("queries 50k-deep", b'{"queries": ' + deep(50_000) + b"}"),
        ("queries 100k-deep", b'{"queries": ' + deep(100_000) + b"}"),
        ("extra field 50k-deep", b'{"queries": ["a"], "x": ' + deep(50_000) + b"}"),
        ("extra field 100k-deep", b'{"queries": ["a"], "x": ' + deep(100_000) + b"}"),
        ("deep objects", b'{"queries": ["a"], "x": ' + b'{"a":' * 60_000 + b"1" + b"}" * 60_000 + b"}"),
        ("topk 5000 digits", b'{"queries": ["a"], "topk": ' + big + b"}"),
        ("extra field 5000 digits", b'{"queries": ["a"], "x": ' + big + b"}"),
        ("topk -5000 digits", b'{"queries": ["a"], "topk": -' + big + b"}"),
        ("topk 1e400 (inf)", b'{"queries": ["a"], "topk": 1e400}'),
        ("topk NaN", b'{"queries": ["a"], "topk": NaN}'),
        ("topk Infinity", b'{"queries": ["a"], "topk": Infinity}'),
        ("topk negative", j({"queries": ["a"], "topk": -1})),
        ("topk float", j({"queries": ["a"], "topk": 1.5})),
        ("topk non-numeric string", j({"queries": ["a"], "topk": "three"})),
        ("topk fractional string", j({"queries": ["a"], "topk": "1.5"})),
        ("topk list", j({"queries": ["a"], "topk": [3]})),
        ("topk object", j({"queries": ["a"], "topk": {"k": 3}})),
        ("topk over max", j({"queries": ["a"], "topk": 101})),
        ("topk huge", j({"queries": ["a"], "topk": 10**18})),
        ("queries x topk over max-hits", j({"queries": ["a"] * 1000, "topk": 100})),
        ("return_scores string", j({"queries": ["a"], "return_scores": "yes"})),
        ("return_scores number", j({"queries": ["a"], "return_scores": 1})),
        ("return_scores list", j({"queries": ["a"], "return_scores": []})),
        ("return_scores object", j({"queries": ["a"], "return_scores": {}})),
        ("body over 4 MiB", j({"queries": ["a" * 4000] * 1100})),
        ("4 MiB of whitespace then JSON", b" " * (4 << 20) + j({"queries": ["a"]})),
        ("huge list of ints", b'{"queries": [' + b"0," * 1_000_000 + b"0]}"),
        ("huge list of strings", b'{"queries": [' + b'"a",' * 800_000 + b'"a"]}'),
        ("million empty objects", b'{"queries": [' + b"{}," * 1_000_000 + b"{}]}"),
        ("unterminated string", b'{"queries": ["abc'),
        ("control character in string", b'{"queries": ["a\x01b"]}'),
        ("bad escape", b'{"queries": ["\\q"]}'),
        ("bad unicode escape", b'{"queries": ["\\u12"]}'),
        ("two JSON documents", j({"queries": ["a"]}) + j({"queries": ["b"]})),
        ("comment", b'{"queries": ["a"] /* hi */}'),
    ]
    return cases


def valid_bodies() -> list[tuple[str, bytes]]:
    """(name, body) pairs that Search-R1's server answers and so must get a 200."""
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    brackets = [f"[{i}] what is {{this}} in [[that]] \"[quoted]\" \\ [" for i in range(2560)]
    return [
        ("Search-R1 batch, 2,560 queries with brackets", j({"queries": brackets, "topk": 3, "return_scores": True})),
        ("Search-R1 batch, 2,560 plain queries", j({"queries": [f"town {i}" for i in range(2560)], "topk": 3})),
        ("queries of only brackets", j({"queries": ["[[[[{{{{" * 100] * 16, "topk": 3})),
        ("topk numeric string", j({"queries": ["a market town"], "topk": "3"})),
        ("topk string with spaces", j({"queries": ["a market town"], "topk": " 2 "})),
        ("topk integral float", j({"queries": ["a market town"], "topk": 3.0})),
        ("topk true (pydantic: 1)", j({"queries": ["a market town"], "topk": True})),
        ("topk false (default)", j({"queries": ["a market town"], "topk": False})),
        ("topk \"0\" (default)", j({"queries": ["a market town"], "topk": "0"})),
        ("topk null", j({"queries": ["a market town"], "topk": None})),
        ("no topk", j({"queries": ["a market town"]})),
        ("return_scores null", j({"queries": ["a market town"], "return_scores": None})),
        ("empty queries", j({"queries": []})),
        ("empty and blank queries", j({"queries": ["", "  "]})),
        ("extra fields", j({"queries": ["a"], "topk": 1, "x": {"y": [1, 2]}})),
        ("unicode and escapes", j({"queries": ["Z\u00fcrich \"q\" \\ \ud83c\udf89 \u2028"], "topk": 2})),
    ]


def stated_bound_mib(idle_mib: float, answer_mib: float, connections: int) -> float:
    """The README's bound, by construction (default limits): bodies arriving, waiting and in flight (4 MiB each),
    one parse of a body over 1 MiB (~55 MiB at worst) and one per other slot of a smaller body (~13 MiB), the
    unsent answers (max-unsent-bytes) and one being built per slot (``answer_mib``: max-hits passages of this
    index), and up to 128 KiB per open connection in its socket's write buffer."""
    from hindsearch.retrieval.limits import ServerLimits

    lim = ServerLimits()
    body = lim.max_body_bytes / 2**20
    return (idle_mib + (lim.max_receiving + lim.max_pending + lim.max_inflight) * body + 55 + lim.max_inflight * 13
            + lim.max_unsent_bytes / 2**20 + lim.max_inflight * answer_mib + connections / 8)


def slow_uploads(port: int, url: str, n: int = 68, legit: int = 10) -> tuple[int, list[int | None], float]:
    """n connections from 127.0.0.2 send a head and 1 byte of body; then ``legit`` requests from 127.0.0.1 ->
    (slow connections answered 503 at once, the legit statuses, the slowest legit request in seconds)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        socks.append(s)
    time.sleep(1.0)
    statuses, slowest = [], 0.0
    for _ in range(legit):
        t = time.time()
        statuses.append(post(url, json.dumps({"queries": ["a market town"], "topk": 3}).encode(), timeout=20)[0])
        slowest = max(slowest, time.time() - t)
    refused = 0
    for s in socks:
        s.setblocking(False)
        try:
            refused += s.recv(4096).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
        s.close()
    return refused, statuses, slowest


def unread_answers(port: int, url: str, pid: int, body: bytes, n: int = 48, seconds: float = 60.0) -> dict:
    """n clients (127.0.1.1 ...) send ``body`` and never read, for ``seconds``; a reader probes every 5 s."""
    reset_hwm(pid)
    socks = []
    for i in range(n):
        s = socket.socket()
        s.bind((f"127.0.1.{i + 1}", 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)
    t0, peak, probes = time.time(), 0, []
    while time.time() - t0 < seconds:
        t = time.time()
        status, _, note = post(url, json.dumps({"queries": ["a market town"], "topk": 3}).encode(), timeout=60)
        probes.append((status, time.time() - t, note if status != 200 else ""))
        while time.time() - t < 5 and time.time() - t0 < seconds:
            peak = max(peak, rss_kib(pid)[0])
            time.sleep(0.05)
    peak = max(peak, rss_kib(pid)[1])
    dropped = 0
    for s in socks:  # drain what the kernel queued: a reset connection then reports ECONNRESET (or EOF), a held one blocks
        s.setblocking(False)
        try:
            while s.recv(1 << 20):
                pass
            dropped += 1
        except ConnectionResetError:
            dropped += 1
        except BlockingIOError:
            pass
        s.close()
    time.sleep(2)
    return {"peak_kib": peak, "after_kib": rss_kib(pid)[0], "dropped": dropped, "probes": probes}


def truncated_store(index: Path, tmp: Path) -> tuple[int | None, str, bool]:
    """A second server over a copy of ``index``; truncate its passages.jsonl -> (status, error, alive)."""
    copy = tmp / "index-copy"
    shutil.copytree(index, copy)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "hindsearch.cli", "serve", "--index", str(copy), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url, proc)
        assert post(url, json.dumps({"queries": ["a market town"]}).encode())[0] == 200
        os.truncate(copy / "passages.jsonl", 4096)
        try:
            r = httpx.post(url + "/retrieve", json={"queries": ["a market town"], "topk": 3}, timeout=30)
            status, error = r.status_code, r.json().get("error", "")
        except (httpx.HTTPError, ValueError) as e:
            status, error = None, type(e).__name__
        time.sleep(0.5)
        return status, error, proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)


def post(url: str, body: bytes, headers: dict | None = None, timeout: float = 60) -> tuple[int | None, bool, str]:
    """(status or None, answer is JSON with 'error' or 'result', note)."""
    try:
        r = httpx.post(url + "/retrieve", content=body, headers={"Content-Type": "application/json", **(headers or {})},
                       timeout=timeout)
    except httpx.HTTPError as e:
        return None, False, f"{type(e).__name__}"
    try:
        payload = r.json()
        ok = isinstance(payload, dict) and ("error" in payload or "result" in payload)
    except ValueError:
        ok = False
    return r.status_code, ok, r.text[:80].replace("\n", " ")


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def reset_hwm(pid: int) -> None:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def concurrent(url: str, body: bytes, n: int, pid: int) -> tuple[list[int | None], int, int, float]:
    """n requests at once -> (statuses, peak RSS KiB sampled, RSS KiB 2 s after, seconds)."""
    statuses: list[int | None] = [None] * n
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_kib(pid)[0])
            time.sleep(0.01)

    def one(i: int) -> None:
        statuses[i] = post(url, body, timeout=600)[0]

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.time() - t
    done.set()
    sampler.join()
    time.sleep(2)
    return statuses, max(peak[0], rss_kib(pid)[1]), rss_kib(pid)[0], dt


def slow_head(host: str, port: int) -> tuple[bool, float]:
    s = socket.create_connection((host, port), timeout=60)
    t = time.time()
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
    try:
        for _ in range(60):
            s.sendall(b"X-Slow: 1\r\n")
            time.sleep(0.5)
        dropped = False
    except OSError:
        dropped = True
    s.close()
    return dropped, time.time() - t


def slow_body(host: str, port: int) -> tuple[bytes, float]:
    s = socket.create_connection((host, port), timeout=60)
    t = time.time()
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    reply = b""
    try:
        for _ in range(120):
            s.sendall(b" ")
            time.sleep(0.5)
            s.setblocking(False)
            try:
                reply += s.recv(4096)
            except BlockingIOError:
                pass
            s.setblocking(True)
            if reply:
                break
    except OSError:
        pass
    s.close()
    return reply.split(b"\r\n", 1)[0], time.time() - t


def aborted_upload(host: str, port: int) -> None:
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
              + b'{"queries": [' + b'"a",' * 1000)
    time.sleep(0.3)
    s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    ap.add_argument("--unread-seconds", type=float, default=60.0, help="how long the 48 non-reading clients hold")
    args = ap.parse_args()

    from hindsearch.data.world import generate_world, write_world
    from hindsearch.retrieval.factory import build_index

    tmp = Path(tempfile.mkdtemp(prefix="fuzz-server-"))
    world = write_world(generate_world(seed=0), tmp / "world")
    build_index(world / "corpus.jsonl", tmp / "index", show_progress=False)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / "server.log"
    with log_path.open("w") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "hindsearch.cli", "serve", "--index", str(tmp / "index"),
                                 "--port", str(port)], stdout=logf, stderr=subprocess.STDOUT)
    rows: list[dict] = []
    try:
        wait_healthy(url, proc)
        base_rss = rss_kib(proc.pid)[0]
        for name, body in bad_bodies():
            status, is_json, note = post(url, body)
            kind = ("clean 4xx" if status is not None and 400 <= status < 500 and is_json
                    else "silent acceptance" if status is not None and status < 300 else "5xx / bad answer")
            rows.append({"case": name, "bytes": len(body), "status": status, "kind": kind, "note": note})
        # hostile clients
        dropped, t_head = slow_head("127.0.0.1", port)
        rows.append({"case": "slow request head (1 header line / 0.5 s)", "status": None,
                     "kind": "clean 4xx" if dropped else "5xx / bad answer", "note": f"dropped after {t_head:.1f} s"})
        line, t_body = slow_body("127.0.0.1", port)
        rows.append({"case": "slow body (1 byte / 0.5 s)", "status": int(line.split()[1]) if line else None,
                     "kind": "clean 4xx" if line.startswith(b"HTTP/1.1 408") else "5xx / bad answer",
                     "note": f"{line.decode(errors='replace')} after {t_body:.1f} s"})
        lines_before = len(log_path.read_text().splitlines())
        aborted_upload("127.0.0.1", port)
        time.sleep(1.0)
        new_log = log_path.read_text().splitlines()[lines_before:]
        rows.append({"case": "aborted upload", "status": None,
                     "kind": "clean 4xx" if len(new_log) <= 1 and not any("Traceback" in x for x in new_log)
                     else "5xx / bad answer", "note": f"{len(new_log)} log line(s)"})
        # memory under 16 maximal concurrent requests
        reset_hwm(proc.pid)
        # 4 MiB that parse to the most memory the server allows (objects/arrays are refused before parsing):
        # 838k two-character strings, ~52 MiB per parse
        huge = b'{"queries": [' + b'"ab",' * 838_000 + b'"a"]}'
        assert len(huge) <= 4 << 20
        st1, peak1, after1, dt1 = concurrent(url, huge, 16, proc.pid)
        words = "several years later widely published private collection society"  # in 700-1,500 passages each
        maximal = json.dumps({"queries": [f"{i} {words}"[:60] for i in range(4096)], "topk": 16}).encode()
        reset_hwm(proc.pid)
        st2, peak2, after2, dt2 = concurrent(url, maximal, 16, proc.pid)
        # valid requests: every one must get a 200 with a result
        valid = []
        for name, body in valid_bodies():
            status, is_json, note = post(url, body)
            valid.append({"case": name, "bytes": len(body), "status": status, "refused": status != 200 or not is_json})
        answer_mib = len(httpx.post(url + "/retrieve", content=maximal, timeout=600).content) / 2**20
        # slow uploads from one address do not lock out another
        up_refused, up_statuses, up_slowest = slow_uploads(port, url)
        # unread answers
        unread = unread_answers(port, url, proc.pid, maximal, seconds=args.unread_seconds)
        bound = stated_bound_mib(base_rss / 1024, answer_mib, connections=48 + 1)
        trunc_status, trunc_error, trunc_alive = truncated_store(tmp / "index", tmp)
        alive = (httpx.get(url + "/health", timeout=10).status_code == 200
                 and post(url, json.dumps({"queries": ["a market town"]}).encode())[0] == 200 and proc.poll() is None)
        log_text = log_path.read_text()
    finally:
        proc.terminate()
        proc.wait(30)

    tried = len(rows)
    count = {k: sum(r["kind"] == k for r in rows) for k in ("clean 4xx", "5xx / bad answer", "silent acceptance")}
    print(f"{'case':<44}{'bytes':>10}{'status':>8}  result")
    for r in rows:
        print(f"{r['case'][:43]:<44}{r.get('bytes', ''):>10}{str(r['status']):>8}  {r['kind']}"
              + ("" if r["kind"] == "clean 4xx" and not r["case"].startswith(("slow", "aborted")) else f"  ({r['note']})"))
    print()
    summary = {
        "bad inputs tried": tried,
        "clean 4xx / dropped": count["clean 4xx"],
        "5xx or bad answer": count["5xx / bad answer"],
        "silent acceptance": count["silent acceptance"],
        "tracebacks in server log": log_text.count("Traceback"),
        "server alive afterwards": "yes" if alive else "NO",
        "RSS at start (MiB)": round(base_rss / 1024),
        "16 x 4 MiB worst-parse bodies: statuses": sorted({s for s in st1 if True}, key=str),
        "16 x 4 MiB worst-parse bodies: peak RSS (MiB)": round(peak1 / 1024),
        "16 x 4 MiB worst-parse bodies: RSS after (MiB)": round(after1 / 1024),
        "16 x maximal valid (4096 q, topk 16): statuses": sorted({s for s in st2}, key=str),
        "16 x maximal valid: peak RSS (MiB)": round(peak2 / 1024),
        "16 x maximal valid: RSS after (MiB)": round(after2 / 1024),
        "16 x maximal valid: seconds": round(dt2, 1),
        "valid requests tried": len(valid),
        "valid requests refused": sum(v["refused"] for v in valid),
        "68 slow uploads from one address: answered 503 at once": up_refused,
        "... meanwhile 10 requests from another address: statuses": sorted(set(up_statuses), key=str),
        "... slowest of them (s)": round(up_slowest, 2),
        "maximal answer (MiB)": round(answer_mib, 1),
        f"48 non-reading clients x {args.unread_seconds:g} s: peak RSS (MiB)": round(unread["peak_kib"] / 1024),
        "... stated bound (MiB)": round(bound),
        "... RSS after (MiB)": round(unread["after_kib"] / 1024),
        "... clients dropped by the server": unread["dropped"],
        "... reading probe (every 5 s): statuses": sorted({s for s, _, _ in unread["probes"]}, key=str),
        "... reading probe: slowest (s)": round(max(t for _, t, _ in unread["probes"]), 1),
        "truncated passage store: status": trunc_status,
        "truncated passage store: server alive": "yes" if trunc_alive else "NO",
    }
    w = max(len(k) for k in summary)
    print(f"{'measure':<{w}}  value")
    for k, v in summary.items():
        print(f"{k:<{w}}  {v}")
    for v in valid:
        if v["refused"]:
            print(f"REFUSED valid request: {v['case']} -> {v['status']}")
    for status, dt, note in unread["probes"]:
        if status != 200:
            print(f"reading probe during the unread answers: {status} after {dt:.1f} s: {note}")
    if trunc_status != 503:
        print(f"truncated store answer: {trunc_status} {trunc_error}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "valid": valid, "summary": summary}, indent=1,
                                              default=str) + "\n")
    ok = (count["5xx / bad answer"] == 0 and count["silent acceptance"] == 0 and alive and tried >= 60
          and not any(v["refused"] for v in valid) and set(up_statuses) == {200}
          and unread["peak_kib"] / 1024 <= bound and trunc_status == 503 and trunc_alive)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
