"""The HTTP search service and client on loopback: parity, dead and slow servers, malformed answers."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from searchjax.search import HttpBackend, MemoryBackend, SearchError, SearchHTTPServer, SearchTool
from searchjax.search.http import serving_in_background as running

DOCS = [{"title": f"Doc {i}", "url": f"https://e.example/{i}", "text": f"river stone {i} lantern"} for i in range(20)]


class SlowBackend:
    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.release = threading.Event()

    def search(self, query, k=10):
        self.release.wait(self.delay_s)
        return []


def test_http_matches_the_backend_it_serves():
    backend = MemoryBackend(DOCS)
    with running(SearchHTTPServer(backend, port=0)) as server:
        client = HttpBackend(server.url, timeout_s=2.0, retries=1)
        for query in ("river 3", "lantern", "stone 12 river", "nothing-here", 'a:"(b'):
            assert client.search(query, 10) == backend.search(query, 10)
        assert len(client.search("river", 4)) == 4
        result = SearchTool(client).call({"query": "stone 5"})
        assert result.ok and "[1] Doc 5" in result.text


def test_tantivy_through_http(tantivy_backend):
    with running(SearchHTTPServer(tantivy_backend, port=0)) as server:
        client = HttpBackend(server.url, timeout_s=2.0)
        assert client.search("capital of France") == tantivy_backend.search("capital of France")


def test_killed_server_gives_tool_errors_and_the_rollout_goes_on():
    server = SearchHTTPServer(MemoryBackend(DOCS), port=0)
    url, port = server.url, server.server_address[1]
    tool = SearchTool(HttpBackend(url, timeout_s=1.0, retries=2, backoff_s=0.01), max_calls=5)
    with running(server):
        assert tool.call({"query": "river"}).ok
    start = time.monotonic()
    dead = tool.call({"query": "river"})
    assert not dead.ok and dead.error == "search_failed" and "3 attempts" in dead.text
    assert time.monotonic() - start < 3.0
    with running(SearchHTTPServer(MemoryBackend(DOCS), port=port)):  # the service comes back
        assert tool.call({"query": "lantern"}).ok
    assert (tool.calls, tool.failures) == (3, 1)


def test_slow_server_times_out_with_bounded_retries():
    backend = SlowBackend(delay_s=10.0)
    try:
        with running(SearchHTTPServer(backend, port=0)) as server:
            tool = SearchTool(HttpBackend(server.url, timeout_s=0.3, retries=1, backoff_s=0.01))
            start = time.monotonic()
            result = tool.call({"query": "river"})
            elapsed = time.monotonic() - start
            assert not result.ok and result.error == "search_failed" and "timed out" in result.text
            assert 0.6 <= elapsed < 2.0  # two attempts of 0.3 s each, no more
            assert tool.call({"query": "again"}).error == "search_failed"
            assert (tool.calls, tool.failures) == (2, 2)
    finally:
        backend.release.set()


def _garbage_server(body: bytes, status: int = 200) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


@pytest.mark.parametrize(
    "body, status",
    [(b"not json", 200), (b'{"results": 3}', 200), (b'{"results": [{"title": 1, "url": "u", "snippet": "s"}]}', 200),
     (b'{"hits": []}', 200), (b"[]", 200), (b'{"error": "bad"}', 404), (b"oops", 503)],
)
def test_malformed_or_failed_responses_are_search_errors(body, status):
    server = _garbage_server(body, status)
    with running(server):
        client = HttpBackend(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=1.0, retries=1,
                             backoff_s=0.01)
        with pytest.raises(SearchError):
            client.search("q")
        assert SearchTool(client).call({"query": "q"}).error == "search_failed"


def test_server_rejects_bad_requests():
    import http.client

    with running(SearchHTTPServer(MemoryBackend(DOCS), port=0)) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=2)
        cases = [(b"{}", "missing field 'query'"), (b'{"query": 5}', "'query' must be a string, got int"),
                 (b'{"query": "x", "k": 50}', "'k' must be in 1..10, got 50"),
                 (b'{"query": "x", "k": true}', "'k' must be an integer in 1..10, got bool"),
                 (b"nope", "invalid JSON: Expecting value at line 1 column 1"),
                 (b"\xff\xfe", "not UTF-8"), (b"[1]", "must be a JSON object"),
                 (b'{"query": "x", "top": 3}', "unknown field(s) 'top'")]
        messages = set()
        for body, message in cases:
            conn.request("POST", "/search", body=body)
            response = conn.getresponse()
            error = json.loads(response.read())["error"]
            assert response.status == 400 and message in error, (body, error)
            messages.add(error)
        assert len(messages) == len(cases)  # each problem is named, not one catch-all message
        for length in ("abc", "-5", "999999"):  # unparsable, negative, too large: 400, and the server lives on
            conn.request("POST", "/search", body=b"{}", headers={"Content-Length": length})
            response = conn.getresponse()
            assert response.status == 400 and "Content-Length" in json.loads(response.read())["error"]
            conn.close()
        conn.request("GET", "/health")
        assert json.loads(conn.getresponse().read()) == {"ok": True}
        conn.close()


def test_client_rejects_bad_urls():
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        HttpBackend("localhost:80")


def test_wait_until_serving_gives_up_on_a_dead_port():
    import portpicker

    from searchjax.search.http import wait_until_serving

    start = time.monotonic()
    with pytest.raises(SearchError, match="did not come up"):
        wait_until_serving(f"http://127.0.0.1:{portpicker.pick_unused_port()}", timeout_s=0.3)
    assert time.monotonic() - start < 3.0


def test_concurrent_clients_share_one_service(tantivy_backend):
    from concurrent.futures import ThreadPoolExecutor

    queries = [f"capital population {w}" for w in ("France", "Peru", "Japan", "Kenya", "Chile", "Nepal")] * 5
    expected = {q: tantivy_backend.search(q) for q in set(queries)}
    with running(SearchHTTPServer(tantivy_backend, port=0)) as server:
        client = HttpBackend(server.url, timeout_s=5.0)  # one keep-alive connection per worker thread
        with ThreadPoolExecutor(max_workers=6) as pool:
            got = list(pool.map(client.search, queries))
    assert got == [expected[q] for q in queries]


def test_backend_crash_is_a_500_and_the_service_survives():
    class Flaky:
        def __init__(self):
            self.calls = 0

        def search(self, query, k=10):
            self.calls += 1
            if query == "crash":
                raise ZeroDivisionError("bug in a backend")
            return []

    backend = Flaky()
    with running(SearchHTTPServer(backend, port=0)) as server:
        client = HttpBackend(server.url, timeout_s=2.0, retries=1, backoff_s=0.01)
        with pytest.raises(SearchError, match="ZeroDivisionError"):
            client.search("crash")
        assert backend.calls == 2  # a 5xx is retried once, then reported
        assert client.search("fine") == []


def test_client_disconnects_leave_no_traceback_but_bugs_do(capsys):
    server = SearchHTTPServer(MemoryBackend(DOCS), port=0)
    try:
        for exc in (BrokenPipeError(), ConnectionResetError(), TimeoutError()):
            try:
                raise exc
            except OSError:
                server.handle_error(None, ("127.0.0.1", 1))
        assert capsys.readouterr().err == ""
        try:
            raise KeyError("a bug")
        except KeyError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "KeyError" in capsys.readouterr().err
    finally:
        server.server_close()


def _raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[int, dict, bytes]:
    """Send raw bytes, read until the server closes: (status, headers, body)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "BREW"])
def test_other_methods_get_a_json_405(method):
    with running(SearchHTTPServer(MemoryBackend(DOCS), port=0)) as server:
        status, headers, body = _raw_exchange(server.server_address[1],
                                              f"{method} /search HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status == 405 and headers["Allow"] == "GET, POST" and headers["Content-Type"] == "application/json"
    assert method in json.loads(body)["error"]


def test_head_gets_a_405_without_a_body():
    with running(SearchHTTPServer(MemoryBackend(DOCS), port=0)) as server:
        status, headers, body = _raw_exchange(server.server_address[1], b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and body == b"" and headers["Allow"] == "GET, POST"


@pytest.mark.parametrize("garbage", [b"\x00\x01\x02 garbage garbage garbage\r\n\r\n", b"GET\r\n\r\n",
                                     b"GET / HTTP/9.x\r\n\r\n"])
def test_raw_garbage_gets_a_json_400(garbage):
    with running(SearchHTTPServer(MemoryBackend(DOCS), port=0)) as server:
        status, headers, body = _raw_exchange(server.server_address[1], garbage)
        assert HttpBackend(server.url).search("river") != []  # and the service lives on
    assert status == 400 and headers["Content-Type"] == "application/json" and json.loads(body)["error"]


def test_a_short_body_does_not_hold_a_thread(monkeypatch):
    """A client that sends less than its Content-Length gets 408 after the body timeout; others are served."""
    from searchjax.search import http as http_mod

    monkeypatch.setattr(http_mod, "BODY_TIMEOUT_S", 0.3)
    with running(SearchHTTPServer(MemoryBackend(DOCS), port=0)) as server:
        start = time.monotonic()
        status, _, body = _raw_exchange(server.server_address[1],
                                        b"POST /search HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"query\"")
        assert time.monotonic() - start < 3.0
        assert status == 408 and "8 of the 100 bytes" in json.loads(body)["error"]
        assert HttpBackend(server.url).search("river") != []


def test_listen_backlog_is_not_5():
    from searchjax.search.http import LISTEN_BACKLOG

    assert SearchHTTPServer.request_queue_size == LISTEN_BACKLOG >= 128


def test_client_reopens_a_connection_the_server_closed_when_idle(monkeypatch):
    """The server closes idle keep-alive connections; the client's next search reopens one, without retries."""
    from searchjax.search import http as http_mod

    monkeypatch.setattr(http_mod._Handler, "timeout", 0.2)
    with running(SearchHTTPServer(MemoryBackend(DOCS), port=0)) as server:
        client = HttpBackend(server.url, retries=0)
        first = client.search("river")
        time.sleep(0.6)
        assert client.search("river") == first
