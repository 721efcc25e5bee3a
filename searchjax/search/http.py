"""The HTTP search service and its client, so rollout workers on many hosts can share one index.

Protocol (JSON over HTTP/1.1, keep-alive):
- `POST /search` with body `{"query": str, "k": int (optional, 1..10, default 10)}` answers
  `200 {"results": [{"title", "url", "snippet"}, ...]}`; a bad request answers 400 and a failed search 500,
  both as `{"error": str}`.
- `GET /health` answers `200 {"ok": true}`.
The client turns every failure (refused connection, timeout, HTTP error, malformed body) into SearchError,
after at most `retries` further attempts for the transient ones (connection errors, timeouts, 5xx).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable, Iterator
from pathlib import Path

from searchjax.search.tool import MAX_RESULTS
from searchjax.search.types import SearchBackend, SearchError, SearchResult, check_k

DEFAULT_PORT = 8765
_MAX_BODY = 1 << 16


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "SearchHTTPServer"

    def setup(self):
        super().setup()
        # Responses go out as header + body writes; without NODELAY, Nagle + delayed ACK cost ~40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 - keep per-request lines off stderr
        pass

    def _reply(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": f"unknown path {self.path!r}; use POST /search or GET /health"})

    def do_POST(self):  # noqa: N802
        if self.path != "/search":
            self._reply(404, {"error": f"unknown path {self.path!r}; use POST /search"})
            return
        header = self.headers.get("Content-Length") or "0"
        length = int(header) if header.isdigit() else -1
        if not 0 < length <= _MAX_BODY:
            self.close_connection = True  # an unread or unknown-length body would desynchronise keep-alive
            self._reply(400, {"error": f"Content-Length must be 1..{_MAX_BODY} bytes, got {header!r}"})
            return
        try:
            request = json.loads(self.rfile.read(length))
            query, k = request["query"], request.get("k", MAX_RESULTS)
            if not isinstance(query, str) or type(k) is not int or not 1 <= k <= MAX_RESULTS:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self._reply(400, {"error": f'expected {{"query": str, "k": int in 1..{MAX_RESULTS}}}'})
            return
        try:
            results = self.server.backend.search(query, k)
        # Whatever the backend raises, the client must get an answer (500) rather than a dropped connection.
        except Exception as e:  # noqa: BLE001
            self._reply(500, {"error": f"{type(e).__name__}: {e}"})
            return
        self._reply(200, {"results": [r.to_dict() for r in results]})


class SearchHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server answering /search from `backend` (one thread per connection)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, backend: SearchBackend, host: str = "127.0.0.1", port: int = DEFAULT_PORT):
        self.backend = backend
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__((host, port), _Handler)

    def process_request(self, request, client_address):
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        """A client that hung up (timed out, killed) or a connection cut by server_close is routine: no
        traceback on the service's stderr. Anything else keeps socketserver's report."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def server_close(self):
        """Stop listening and cut every open keep-alive connection, as a stopped process would."""
        super().server_close()
        with self._open_lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


@contextlib.contextmanager
def serving_in_background(server: ThreadingHTTPServer, poll_interval: float = 0.05) -> Iterator:
    """Serve `server` on a daemon thread for the duration of a with-block; always shut down and closed."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def serve_search(index_dir: str | Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the tantivy index at `index_dir` until interrupted; `on_ready(url)` runs once it listens."""
    from searchjax.search.tantivy_index import TantivyBackend

    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    server = SearchHTTPServer(TantivyBackend(index_dir), host, port)
    if on_ready is not None:
        on_ready(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _parse_results(body: bytes, k: int) -> list[SearchResult]:
    try:
        payload = json.loads(body)
        rows = payload["results"]
        if not isinstance(rows, list):
            raise TypeError("'results' is not a list")
        results = []
        for row in rows[:k]:
            fields = (row["title"], row["url"], row["snippet"])
            if not all(isinstance(f, str) for f in fields):
                raise TypeError("title, url and snippet must be strings")
            results.append(SearchResult(*fields))
    except (ValueError, KeyError, TypeError) as e:
        raise SearchError(f"malformed response from search service: {e!r}") from None
    return results


class _NoDelayConnection(http.client.HTTPConnection):
    """http.client sends a request's headers and body in two writes: disable Nagle (see _Handler.setup)."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def wait_until_serving(url: str, timeout_s: float = 30.0) -> None:
    """Poll GET url/health until it answers (a service starting in another process); SearchError after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
                response.read()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise SearchError(f"search service at {url} did not come up in {timeout_s} s: {e}") from None
            time.sleep(0.05)


class _Transient(Exception):
    """A failure worth retrying."""


class HttpBackend:
    """Client of the search service: one keep-alive connection per thread, timeouts, bounded retries."""

    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 2, backoff_s: float = 0.05):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"search service url must look like http://HOST:PORT, got {url!r}")
        if timeout_s <= 0 or retries < 0:
            raise ValueError(f"need timeout_s > 0 and retries >= 0, got {timeout_s}, {retries}")
        self.url = url
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _NoDelayConnection(self.host, self.port, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _attempt(self, body: bytes) -> tuple[int, bytes]:
        try:
            conn = self._connection()
            conn.request("POST", "/search", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException, socket.timeout) as e:
            self._drop_connection()
            raise _Transient(f"{type(e).__name__}: {e}") from None
        if response.status >= 500:
            raise _Transient(f"HTTP {response.status}: {data[:200]!r}")
        return response.status, data

    def search(self, query: str, k: int = 10) -> list[SearchResult]:
        if not isinstance(query, str):
            raise SearchError(f"query must be a string, got {type(query).__name__}")
        k = check_k(min(k, MAX_RESULTS))
        body = json.dumps({"query": query, "k": k}).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, data = self._attempt(body)
            except _Transient as e:
                last = str(e)
                continue
            if status != 200:
                raise SearchError(f"search service at {self.url} answered HTTP {status}: {data[:200]!r}")
            return _parse_results(data, k)
        raise SearchError(f"search service at {self.url} failed after {self.retries + 1} attempts: {last}")
