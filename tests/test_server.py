"""Retrieval server (real uvicorn on a loopback port): Search-R1 JSON shapes, bad inputs, client."""

import json
import socket
import time

import httpx
import pytest

from hindsearch.data.corpus import write_corpus
from hindsearch.records import Passage, make_contents
from hindsearch.retrieval.factory import build_index, load_index
from hindsearch.retrieval.client import RemoteRetriever, RetrieverUnavailable
from hindsearch.retrieval.server import BackgroundServer, ServerLimits, create_app

TOWNS = ["Aldmere", "Brightwater", "Coldharbor", "Dunmore", "Eastfold", "Fenwick", "Glenhaven", "Highmoor"]


def compact(obj) -> bytes:
    """How FastAPI (and so Search-R1's server) serialises a returned dict."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()




@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    d = tmp_path_factory.mktemp("srv")
    ps = [Passage(f"t{i}", make_contents(t, f"{t} is a market town famous for its {w} festival."))
          for i, (t, w) in enumerate(zip(TOWNS, ["cheese", "kite", "lantern", "apple", "boat", "honey", "music", "wool"]))]
    ps.append(Passage("odd\tid", make_contents('Zürich "Quoted"', 'Tabs\there, a backslash \\ , emoji 🎉, <tag> & "quotes" \u2028 zebra')))
    write_corpus(d / "c.jsonl", ps)
    build_index(d / "c.jsonl", d / "idx", show_progress=False)
    return load_index(d / "idx")


@pytest.fixture(scope="module")
def server(retriever):
    s = BackgroundServer(create_app(retriever, default_topk=3, limits=ServerLimits(max_queries=4, max_topk=5, max_query_chars=200, max_body_bytes=4000)))
    yield s
    s.stop()


HTTP = httpx.Client(timeout=10)  # one client: creating one per request costs ~0.3 s (TLS context)


def post(server, body, raw=False) -> httpx.Response:
    if raw:
        return HTTP.post(server.url + "/retrieve", content=body, headers={"content-type": "application/json"})
    return HTTP.post(server.url + "/retrieve", json=body)


def test_response_shapes_are_search_r1(server, retriever):
    r = post(server, {"queries": ["cheese festival", "kite town"], "topk": 2, "return_scores": True})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    hits = retriever.retrieve(["cheese festival", "kite town"], 2)
    expected = {"result": [[{"document": {"id": p.id, "contents": p.contents}, "score": p.score} for p in h] for h in hits]}
    assert r.content == compact(expected)
    assert r.json()["result"][0][0]["document"]["id"] == "t0"

    r = post(server, {"queries": ["lantern"], "topk": 1})  # return_scores defaults to false (Search-R1)
    assert r.content == compact({"result": [[{"id": "t2", "contents": '"Coldharbor"\nColdharbor is a market town famous for its lantern festival.'}]]})


@pytest.mark.parametrize("topk", ["missing", 0, None])
def test_topk_default(server, topk):
    body = {"queries": ["market town festival"], "return_scores": True}
    if topk != "missing":
        body["topk"] = topk
    r = post(server, body)
    assert r.status_code == 200 and len(r.json()["result"][0]) == 3


def test_empty_queries(server):
    r = post(server, {"queries": [], "topk": 3})
    assert r.status_code == 200 and r.json() == {"result": []}
    r = post(server, {"queries": ["", "wool"], "topk": 3})
    assert r.json()["result"][0] == [] and r.json()["result"][1][0]["id"] == "t7"


@pytest.mark.parametrize("body, status, needle", [
    (b'{"queries": ["a"', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b'["a", "b"]', 422, "request body: Input should be a valid dictionary"),
    (b'{"topk": 3}', 422, "queries: Field required"),
    (b'{"queries": "one string"}', 422, "queries: Input should be a valid list"),
    (b'{"queries": ["ok", 5]}', 422, "queries[1]: Input should be a valid string"),
    (b'{"queries": ["a","b","c","d","e"]}', 422, "queries: List should have at most 4 items"),
    (b'{"queries": ["a"], "topk": 1000000}', 422, "topk: Input should be less than or equal to 5"),
    (b'{"queries": ["a"], "topk": -1}', 422, "topk: Input should be greater than or equal to 0"),
    (b'{"queries": ["a"], "topk": "three"}', 422, "topk: Input should be a valid integer"),
    (b'{"queries": ["a"], "topk": 1.5}', 422, "topk: Input should be a valid integer, got a number with a fract"),
    (b'{"queries": ["a"], "topk": "-2"}', 422, "topk: Input should be greater than or equal to 0"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 422, "return_scores: Input should be a valid boolean"),
    (json.dumps({"queries": ["x" * 201]}).encode(), 422, "queries[0]: String should have at most 200 characters"),
    (json.dumps({"queries": ["x" * 100] * 50}).encode(), 413, "limit is 4000"),
])
def test_bad_inputs_get_json_errors(server, body, status, needle):
    r = post(server, body, raw=True)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_lone_surrogate_query_is_answered_as_search_r1_does(server):
    """Search-R1's server (json.loads, then ``List[str]``) takes a lone surrogate in a query; so does ours
    (pydantic's own string ``max_length`` refuses it: the query-length check is a validator of ours)."""
    r = post(server, b'{"queries": ["cheese \\ud800 festival"], "topk": 1}', raw=True)
    assert r.status_code == 200, r.text
    assert r.json()["result"][0][0]["id"] == "t0"


def test_chunked_body_over_limit(server):
    def parts():
        yield b'{"queries": ["'
        for _ in range(100):
            yield b"x" * 100
        yield b'"]}'

    r = HTTP.post(server.url + "/retrieve", content=parts(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit of 4000 bytes" in r.json()["error"]


def test_health_and_survives_bad_input(server):
    post(server, b"garbage", raw=True)
    h = HTTP.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["n_docs"] == 9 and h["max_queries"] == 4 and h["default_topk"] == 3


def test_client_matches_in_process(server, retriever):
    client = RemoteRetriever(server.url, timeout_s=5, retries=1)
    queries = [f"{w} festival" for w in ["cheese", "kite", "lantern", "apple", "boat", "honey", "music", "wool"]] + ["", "  "]
    remote = client.retrieve(queries, 3)  # 8 live queries > max_queries=4: chunked after reading /health
    assert client.max_batch == 4
    local = retriever.retrieve(queries, 3)
    assert [[p.id for p in h] for h in remote] == [[p.id for p in h] for h in local]
    assert [[round(p.score, 5) for p in h] for h in remote] == [[round(p.score, 5) for p in h] for h in local]
    assert remote[-1] == [] and remote[0][0].bare_title == "Aldmere"
    with pytest.raises(ValueError, match="rejected the request .*topk: Input should be less than or equal to 5"):
        client.retrieve(["wool"], 50)
    assert RemoteRetriever(server.url + "/retrieve/").url == server.url + "/retrieve"


def test_client_dead_port_is_clear_and_fast():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}"
    t = time.time()
    with pytest.raises(RetrieverUnavailable, match=rf"{url}/retrieve unavailable after 2 attempts: ConnectError") as e:
        RemoteRetriever(url, timeout_s=0.5, retries=1, backoff=0.01).retrieve(["q"], 3)
    assert isinstance(e.value, ConnectionError) and time.time() - t < 5


class BrokenRetriever:
    """A retriever whose backend fails, to check the server answers 500 and the client retries."""

    calls = 0

    def retrieve(self, queries, k):
        BrokenRetriever.calls += 1
        raise RuntimeError("index file vanished")


def test_retriever_failure_is_500_and_client_gives_up():
    s = BackgroundServer(create_app(BrokenRetriever()))
    try:
        r = post(s, {"queries": ["q"]})
        assert r.status_code == 500 and "index file vanished" in r.json()["error"]
        with pytest.raises(RetrieverUnavailable, match="after 3 attempts: HTTP 500"):
            RemoteRetriever(s.url, timeout_s=2, retries=2, backoff=0.01).retrieve(["q"], 3)
        assert BrokenRetriever.calls == 4
    finally:
        s.stop()


def test_fast_path_is_byte_identical(retriever):
    from fastapi.responses import JSONResponse

    from hindsearch.retrieval.server import format_result, render_ids

    queries = ["cheese festival", "", "market town", "zürich \"quoted\" zebra emoji"]
    for scores in (True, False):
        assert render_ids(retriever, queries, 5, scores) == JSONResponse(format_result(retriever.retrieve(queries, 5), scores)).body
    assert retriever.retrieve(["zebra"], 1)[0][0].id == "odd\tid"


def test_cli_search_and_config_over_http(server, capsys):
    from hindsearch.cli import main
    from hindsearch.config import RetrievalConfig
    from hindsearch.retrieval.factory import load_retriever

    assert main(["search", "--retrieval-url", server.url, "honey festival", "-k", "1"]) == 0
    new = capsys.readouterr()
    assert "Fenwick" in new.out and "deprecated" not in new.err
    with pytest.raises(SystemExit):  # a name no release shipped: an unknown flag
        main(["search", "--url", server.url, "honey festival", "-k", "1"])
    assert "unrecognized arguments: --url" in capsys.readouterr().err
    r = load_retriever(RetrievalConfig(kind="remote", url=server.url + "/retrieve", timeout_s=5.0, retries=0))
    assert isinstance(r, RemoteRetriever) and r.retrieve(["music"], 1)[0][0].id == "t6"
