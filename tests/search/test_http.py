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
        for body in (b"{}", b'{"query": 5}', b'{"query": "x", "k": 50}', b'{"query": "x", "k": true}', b"nope"):
            conn.request("POST", "/search", body=body)
            response = conn.getresponse()
            assert response.status == 400 and "error" in json.loads(response.read())
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
