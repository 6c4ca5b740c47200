"""A small HTTP/1.1 client for the API server's request/response calls: kept-alive connections, one
request at a time on each.

Why not urllib3 for these: the extender's bind is one API call per pod on kube-scheduler's hot path,
and urllib3 over http.client spends about 0.9 ms of CPU on one such call (header containers, the
email parser for response headers, retry and timeout objects) where writing the request and reading
the answer directly spends about 0.2 ms, TLS included (measured against a real kube-apiserver; see
docs/policies.md "How the policy meets kube-scheduler"). Streams (watches) stay on urllib3: they are opened once per
resource, not once per pod.

What is implemented is what the API server speaks: HTTP/1.1 with Content-Length or chunked bodies,
`Connection: close`, and nothing else (no redirects, proxies or compression; we never ask for gzip).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADER_LINE = 64 * 1024
MAX_HEADERS = 200


class TransportError(OSError):
    """The request could not be sent or its answer not read (refused, reset, timed out, garbled)."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    data: bytes


class _Connection:
    __slots__ = ("reader", "reused", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.reused = False

    def close(self) -> None:
        try:
            self.reader.close()
        finally:
            self.sock.close()


class ConnectionPool:
    """Connections to one server, kept open between requests; thread-safe.

    A request takes an idle connection or opens one, and gives it back once the answer is read in
    full; `max_idle` bounds how many wait open. A kept-alive connection the server closed in the
    meantime fails before any answer arrives: the request is then sent once more on a fresh
    connection (what Go's net/http does for a reused connection), never after part of an answer."""

    def __init__(
        self,
        url: str,
        ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        server_hostname: str | None = None,
        max_idle: int = 16,
    ) -> None:
        """`ssl_context` may be a function that makes it: called at the first connection, so that
        credentials are read when used (as urllib3 does), not when the client is built."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.netloc = parts.netloc
        self._ssl_context = (
            ssl_context if ssl_context is not None else (ssl.create_default_context if self.https else None)
        )
        self.server_hostname = server_hostname or self.host
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
    ) -> Response:
        """Send one request (`target`: path and query) and read its whole answer.

        `timeout` bounds connecting and each read or write on the socket. Raises TransportError."""
        head = [f"{method} {target} HTTP/1.1\r\nHost: {self.netloc}\r\n"]
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body or b'')}\r\n")
        head.append("\r\n")
        raw = "".join(head).encode("latin-1") + (body or b"")
        conn = self._take(timeout)
        try:
            return self._exchange(conn, method, raw, timeout)
        except _StaleConnection:
            conn = self._connect(timeout)
            return self._exchange(conn, method, raw, timeout)

    # -- internals -------------------------------------------------------------------------------

    def _take(self, timeout: float) -> _Connection:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        return conn if conn is not None else self._connect(timeout)

    def _give_back(self, conn: _Connection) -> None:
        conn.reused = True
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def _context(self) -> ssl.SSLContext:
        with self._lock:
            made = self._ssl_context
            if callable(made) and not isinstance(made, ssl.SSLContext):
                try:
                    made = self._ssl_context = made()
                except (OSError, ssl.SSLError) as exc:
                    raise TransportError(f"TLS settings for {self.netloc} cannot be loaded: {exc}") from exc
            assert isinstance(made, ssl.SSLContext)
            return made

    def _connect(self, timeout: float) -> _Connection:
        context = self._context() if self.https else None
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.netloc}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=self.server_hostname)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise TransportError(f"TLS handshake with {self.netloc} failed: {exc}") from exc
        return _Connection(sock)

    def _exchange(self, conn: _Connection, method: str, raw: bytes, timeout: float) -> Response:
        answered = False
        try:
            conn.sock.settimeout(timeout)
            conn.sock.sendall(raw)
            status_line = conn.reader.readline(MAX_HEADER_LINE)
            if not status_line:
                raise ConnectionResetError("connection closed before any answer")
            answered = True
            status = _parse_status(status_line)
            headers = read_headers(conn.reader)
            data = _read_body(conn.reader, method, status, headers)
        except (OSError, ssl.SSLError, ValueError) as exc:
            conn.close()
            if conn.reused and not answered and not isinstance(exc, TimeoutError):
                raise _StaleConnection from exc
            what = "timed out" if isinstance(exc, TimeoutError) else f"failed: {exc}"
            raise TransportError(f"{method} to {self.netloc} {what}") from exc
        except BaseException:
            conn.close()
            raise
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        body_ended_by_close = _has_body(method, status) and not chunked and "content-length" not in headers
        if body_ended_by_close or headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self._give_back(conn)
        return Response(status, headers, data)


class _StaleConnection(Exception):
    """A kept-alive connection turned out closed before the request was answered."""


def _parse_status(line: bytes) -> int:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"malformed status line {line[:80]!r}")
    return int(parts[1])


def read_headers(reader: object) -> dict[str, str]:
    headers: dict[str, str] = {}
    readline = reader.readline  # type: ignore[attr-defined]
    for _ in range(MAX_HEADERS):
        line = readline(MAX_HEADER_LINE)
        if not line:
            raise ConnectionResetError("connection closed inside the response headers")
        if line in (b"\r\n", b"\n"):
            return headers
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    raise ValueError(f"more than {MAX_HEADERS} response headers")


def _has_body(method: str, status: int) -> bool:
    return method != "HEAD" and status >= 200 and status not in (204, 304)


def _read_exact(reader: object, n: int) -> bytes:
    data = reader.read(n)  # type: ignore[attr-defined]
    if len(data) != n:
        raise ConnectionResetError(f"connection closed after {len(data)} of {n} body bytes")
    return data  # type: ignore[no-any-return]


class BodyTooLarge(ValueError):
    """A chunked body went past the reader's limit."""


def read_chunked(reader: object, limit: int | None = None) -> bytes:
    """A chunked body (RFC 9112 7.1), trailers skipped. ValueError when malformed, BodyTooLarge past `limit`."""
    chunks, total = [], 0
    readline = reader.readline  # type: ignore[attr-defined]
    while True:
        size_line = readline(MAX_HEADER_LINE)
        if not size_line:
            raise ConnectionResetError("connection closed inside a chunked body")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while readline(MAX_HEADER_LINE) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        total += size
        if limit is not None and total > limit:
            raise BodyTooLarge(f"body larger than {limit} bytes")
        chunks.append(_read_exact(reader, size))
        _read_exact(reader, 2)  # CRLF after the chunk


def _read_body(reader: object, method: str, status: int, headers: dict[str, str]) -> bytes:
    if not _has_body(method, status):
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return read_chunked(reader)
    length = headers.get("content-length")
    if length is not None:
        return _read_exact(reader, int(length))
    return reader.read()  # type: ignore[attr-defined, no-any-return]  # delimited by the connection's close
