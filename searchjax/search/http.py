"""The HTTP search service and its client, so rollout workers on many hosts can share one index.

Protocol (JSON over HTTP/1.1, keep-alive; README.md "HTTP search service" states it for users):
- `POST /search` with body `{"query": str, "k": int (optional, 1..10, default 10)}` answers
  `200 {"results": [{"title", "url", "snippet"}, ...]}`;
- `GET /health` answers `200 {"ok": true}`;
- every error is JSON `{"error": str}` naming what was wrong: 400 for a bad request (invalid JSON, a body that is
  not an object, a missing or unknown field, a field of the wrong type or range, a bad Content-Length, a
  malformed request line), 404 for an unknown path, 405 for another method (with `Allow: GET, POST`), 408 when
  a declared body does not arrive within BODY_TIMEOUT_S, 500 for a failed search.
An idle keep-alive connection is closed after IDLE_TIMEOUT_S. The client turns every failure (refused
connection, timeout, HTTP error, malformed body) into SearchError, after at most `retries` further attempts for
the transient ones (connection errors, timeouts, 5xx); a kept-alive connection the server has closed is
reopened once without counting as an attempt.
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
BODY_TIMEOUT_S = 10.0  # a client that declares a body must send it within this time
IDLE_TIMEOUT_S = 300.0  # an idle keep-alive connection (or one that stalls mid-headers) is closed after this
LISTEN_BACKLOG = 128
_ALLOW = "GET, POST"


class _BadRequest(Exception):
    """A request body that is not `{"query": str, "k": int}`; the message says what is wrong."""


def parse_search_request(body: bytes) -> tuple[str, int]:
    """(query, k) of a POST /search body; _BadRequest naming the problem otherwise."""
    try:
        request = json.loads(body.decode("utf-8"))  # json.loads(bytes) would also accept UTF-16 and UTF-32
    except UnicodeDecodeError as e:
        raise _BadRequest(f"invalid JSON: the body is not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _BadRequest(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(request, dict):
        raise _BadRequest(f'the body must be a JSON object {{"query": str, "k": int}}, got {type(request).__name__}')
    unknown = sorted(set(request) - {"query", "k"})
    if unknown:
        raise _BadRequest(f"unknown field(s) {', '.join(map(repr, unknown))}; the fields are 'query' and 'k'")
    if "query" not in request:
        raise _BadRequest("missing field 'query' (a string)")
    query, k = request["query"], request.get("k", MAX_RESULTS)
    if not isinstance(query, str):
        raise _BadRequest(f"field 'query' must be a string, got {type(query).__name__}")
    if type(k) is not int:
        raise _BadRequest(f"field 'k' must be an integer in 1..{MAX_RESULTS}, got {type(k).__name__}")
    if not 1 <= k <= MAX_RESULTS:
        raise _BadRequest(f"field 'k' must be in 1..{MAX_RESULTS}, got {k}")
    return query, k


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "SearchHTTPServer"
    timeout = IDLE_TIMEOUT_S  # StreamRequestHandler sets it on the socket: no connection holds a thread forever

    def setup(self):
        super().setup()
        # Responses go out as header + body writes; without NODELAY, Nagle + delayed ACK cost ~40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 - keep per-request lines off stderr
        pass

    def _reply(self, status: int, payload: dict, headers: tuple[tuple[str, str], ...] = ()) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (a malformed request line or header, an unsupported method) as JSON, like
        ours; an unknown method is 405 rather than http.server's 501."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9" or not self.command:
            self.request_version = "HTTP/1.1"  # http.server would answer 0.9 without a status line
        if code == 501 and self.command:
            self._not_allowed()
            return
        self._reply(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def _not_allowed(self):
        self.close_connection = True  # the body of an unexpected method is never read
        self._reply(405, {"error": f"method {self.command} is not allowed; use GET /health or POST /search"},
                    (("Allow", _ALLOW),))

    do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": f"unknown path {self.path!r}; use POST /search or GET /health"})

    def do_POST(self):  # noqa: N802
        if self.path != "/search":
            self._reply(404, {"error": f"unknown path {self.path!r}; use POST /search"})
            return
        header = self.headers.get("Content-Length")
        length = int(header) if header is not None and header.isdigit() else -1
        if not 0 < length <= _MAX_BODY:
            self.close_connection = True  # an unread or unknown-length body would desynchronise keep-alive
            got = "no Content-Length header" if header is None else f"{header!r}"
            self._reply(400, {"error": f"Content-Length must be 1..{_MAX_BODY} bytes, got {got}"})
            return
        body = self._read_body(length)
        if body is None:
            return
        try:
            query, k = parse_search_request(body)
        except _BadRequest as e:
            self._reply(400, {"error": str(e)})
            return
        try:
            results = self.server.backend.search(query, k)
        # Whatever the backend raises, the client must get an answer (500) rather than a dropped connection.
        except Exception as e:  # noqa: BLE001
            self._reply(500, {"error": f"{type(e).__name__}: {e}"})
            return
        self._reply(200, {"results": [r.to_dict() for r in results]})

    def _read_body(self, length: int) -> bytes | None:
        """The declared body, or None after answering 408 when it does not arrive within BODY_TIMEOUT_S."""
        self.connection.settimeout(BODY_TIMEOUT_S)
        body = b""
        try:
            while len(body) < length:  # read1 keeps what arrived before a timeout (read would drop it)
                chunk = self.rfile.read1(length - len(body))
                if not chunk:
                    break
                body += chunk
        except TimeoutError:
            pass
        finally:
            self.connection.settimeout(self.timeout)
        if len(body) < length:
            self.close_connection = True
            self._reply(408, {"error": f"the body ended after {len(body)} of the {length} bytes of its "
                                       f"Content-Length (or did not arrive within {BODY_TIMEOUT_S:g} s)"})
            return None
        return body


class SearchHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server answering /search from `backend` (one thread per connection)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

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
        reused = getattr(self._local, "conn", None) is not None
        try:
            response, data = self._post(body)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            self._drop_connection()
            if not reused:
                raise _Transient(f"{type(e).__name__}: {e}") from None
            try:  # the server closed an idle keep-alive connection: reopen it once
                response, data = self._post(body)
            except (OSError, http.client.HTTPException) as e2:
                self._drop_connection()
                raise _Transient(f"{type(e2).__name__}: {e2}") from None
        except (OSError, http.client.HTTPException) as e:
            self._drop_connection()
            raise _Transient(f"{type(e).__name__}: {e}") from None
        if response.status >= 500:
            raise _Transient(f"HTTP {response.status}: {data[:200]!r}")
        return response.status, data

    def _post(self, body: bytes) -> tuple[http.client.HTTPResponse, bytes]:
        conn = self._connection()
        conn.request("POST", "/search", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response, response.read()

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
