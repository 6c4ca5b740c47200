"""The lean HTTP/1.1 server both hot-path programs serve through: the extender (kube-scheduler's filter
and bind, plain HTTP) and the admission webhook (the API server's AdmissionReviews, HTTPS).

Why not gunicorn, Flask or http.server on these paths: kube-scheduler's scheduling cycle is serial and
waits on our filter, and the API server waits on admission for every GPU pod it creates; on two shared
cores every millisecond we spend is one they do not get. Under gunicorn's threaded worker, reading a
request, building its WSGI environ, routing it through Flask and writing the answer cost the extender
about 1.8 ms of CPU per pod (filter and bind) on top of the 2 ms the verbs take (bench/bench_throughput.py,
1,000 nodes); http.server's BaseHTTPRequestHandler (the email parser for the headers, a Date header,
its own logging) cost the webhook a third of its CPU: 1.04 ms per pod (two reviews) against 0.70 here,
called by kube-apiserver (bench/bench_admission.py; docs/operations.md, "The server"). Here a request is
read with a few socket reads and answered with one write.

What is implemented is what those clients speak: HTTP/1.1 keep-alive, Content-Length or chunked bodies,
`Expect: 100-continue` (curl), `Connection: close`. A POST to one of `routes` calls it with the body and
sends its (status, JSON) answer; everything else goes to `fallback` (the extender's Flask application,
the webhook's health and metrics).

Threads, one of two ways:
- `threads` workers (the extender): each accepts connections on the one listening socket and serves a
  connection's requests in turn. kube-scheduler keeps two connections alive and opens one for about a
  third of its binds, so a fixed pool spares a thread start per connection.
- `per_connection` (the webhook): one thread accepts, each connection gets a thread of its own, at most
  `max_connections`. One kube-apiserver kept 25 connections open to the webhook through a burst of
  pod creates (bench/bench_throughput.py --webhook), several API servers keep more, and kubelet's probes
  open new ones: a fixed pool whose workers all sat on idle kept-alive connections would leave a probe or
  a new API server waiting.
A connection idle for `idle_timeout` seconds is closed. `stop()` stops accepting, closes idle
connections at once and lets requests in progress finish (up to `grace` seconds).

HTTPS (`https=True`): each connection accepted is wrapped with the context `use_tls` last set, so a
renewed certificate is served without a restart while open connections keep theirs; the handshake runs
in the connection's own thread, so a slow client holds no other. Until a context is set, connections are
closed at once.
"""

from __future__ import annotations

import io
import logging
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import orjson

from share_core.httpconn import MAX_HEADER_LINE
from share_core.httpconn import BodyTooLarge
from share_core.httpconn import read_chunked
from share_core.httpconn import read_headers

log = logging.getLogger(__name__)

Route = Callable[[bytes], tuple[int, bytes]]  # POST body -> (status, JSON answer)
KEEPALIVE_IDLE = 30.0  # seconds a kept-alive connection may sit idle (kube-scheduler's Go client keeps 2)
READ_TIMEOUT = 60.0  # seconds to receive a whole request (and, over HTTPS, the handshake) once it started


@dataclass(frozen=True, slots=True)
class Request:
    """A request that is not one of the POST routes, for the fallback."""

    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    peer: Any


Answer = tuple[str, list[tuple[str, str]], bytes]  # ("200 OK", headers, payload)
Fallback = Callable[[Request], Answer]


class BadHttp(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def not_found(_: Request) -> Answer:
    return "404 Not Found", [("Content-Type", "application/json")], b'{"Error":"not found"}'


class HttpServer:
    def __init__(
        self,
        routes: dict[str, Route],
        host: str,
        port: int,
        fallback: Fallback = not_found,
        threads: int = 32,
        per_connection: bool = False,
        max_connections: int = 1024,
        max_body: int = 64 * 1024 * 1024,
        grace: float = 10.0,
        idle_timeout: float = KEEPALIVE_IDLE,
        read_timeout: float = READ_TIMEOUT,
        https: bool = False,
    ) -> None:
        self.routes = routes
        self.fallback = fallback
        self.threads = 1 if per_connection else threads
        self.per_connection = per_connection
        self.max_connections = max_connections
        self.max_body = max_body
        self.grace = grace
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self.https = https
        self._tls: ssl.SSLContext | None = None
        # Blocking accept, no timeout: the kernel then wakes ONE waiting worker per connection. With a
        # timeout, Python polls the socket first, and every idle worker's poll wakes on each new
        # connection, takes the GIL, finds nothing to accept and polls again: with 32 workers that was
        # ~39 context switches per connection (kube-scheduler's Go client keeps 2 idle connections, so
        # about a third of its binds open a new one). stop() shuts the socket down to wake the workers.
        self.sock = socket.create_server((host, port), reuse_port=False, backlog=256)
        self.host, self.port = host, self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._connections: set[threading.Thread] = set()  # per_connection: the threads serving one
        self._idle: set[socket.socket] = set()  # kept-alive connections waiting for their next request
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

    def use_tls(self, context: ssl.SSLContext) -> None:
        """Serve connections accepted from now on with this context (those open keep theirs)."""
        with self._lock:
            self._tls = context

    @property
    def tls_ready(self) -> bool:
        return self._tls is not None

    def start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._accept_loop, name=f"http-{i}", daemon=True)
            t.start()
            self._workers.append(t)

    def stop(self) -> None:
        """Stop accepting; wait up to `grace` seconds for requests in progress."""
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes every worker blocked in accept() (Linux: EINVAL)
        except OSError:
            pass
        with self._lock:
            for conn in self._idle:  # wake the threads parked on idle connections: they close them
                try:
                    socket.socket.shutdown(conn, socket.SHUT_RD)  # the socket's, not TLS's (no close_notify)
                except OSError:
                    pass
            threads = self._workers + list(self._connections)
        deadline = time.monotonic() + self.grace
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.sock.close()

    def serve_forever(self) -> None:
        """Serve until SIGTERM or SIGINT (call from the main thread)."""
        done = threading.Event()

        def on_signal(signum: int, _: Any) -> None:
            log.info("signal %d: finishing requests in progress, then exiting", signum)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        how = "a thread per connection" if self.per_connection else f"{self.threads} threads"
        log.info("serving on %s:%d with %s", self.host, self.port, how)
        done.wait()
        self.stop()

    # -- connections -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                # ECONNABORTED (a client gave up before we accepted) or EMFILE: try again, without
                # spinning on an error that stays.
                self._stop.wait(0.01)
                continue
            if not self.per_connection:
                self._connection(conn, peer)
                continue
            with self._lock:
                full = len(self._connections) >= self.max_connections
                if not full:
                    t = threading.Thread(target=self._connection, args=(conn, peer), daemon=True)
                    self._connections.add(t)
            if full:
                log.warning("%d connections open: closing a new one from %s", self.max_connections, peer)
                conn.close()
                continue
            t.start()

    def _connection(self, conn: socket.socket, peer: Any) -> None:
        try:
            if self.https:
                with self._lock:
                    context = self._tls
                if context is None:
                    return  # no certificate yet: the client sees the connection closed
                conn.settimeout(self.read_timeout)  # a stalled handshake must not hold the thread
                conn = context.wrap_socket(conn, server_side=True)
            self._serve(conn, peer)
        except (ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.debug("connection from %s ended: %s", peer, exc)
        except Exception:  # a bug must not take a worker thread with it
            log.exception("connection from %s failed", peer)
        finally:
            conn.close()
            if self.per_connection:
                with self._lock:
                    self._connections.discard(threading.current_thread())

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = conn.makefile("rb")
        try:
            while not self._stop.is_set():
                conn.settimeout(self.idle_timeout)
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._idle.add(conn)
                try:
                    line = reader.readline(MAX_HEADER_LINE)
                except (TimeoutError, OSError):
                    return  # idle too long, or the client went away
                finally:
                    with self._lock:
                        self._idle.discard(conn)
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    continue  # tolerated between requests (RFC 9112 2.2)
                conn.settimeout(self.read_timeout)
                keep_alive = self._one(conn, reader, line, peer)
                if not keep_alive:
                    return
        finally:
            reader.close()

    def _one(self, conn: socket.socket, reader: io.BufferedReader, line: bytes, peer: Any) -> bool:
        """Read one request, answer it; False when the connection must close."""
        try:
            method, target, version = _request_line(line)
            headers = read_headers(reader)
            if headers.get("expect", "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl asks before sending a body over 1 KiB
            body = self._body(reader, headers)
        except (BadHttp, ValueError) as exc:  # ValueError: headers malformed or too many
            status = exc.status if isinstance(exc, BadHttp) else 400
            try:
                send(conn, status, orjson.dumps({"Error": str(exc)}), close=True)
            except OSError:
                pass
            return False
        except (TimeoutError, OSError):
            return False
        close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        path, _, query = target.partition("?")
        route = self.routes.get(path) if method == "POST" else None
        try:
            if route is not None:
                try:
                    status, payload = route(body)
                except Exception as exc:  # a bug: answer it as one, as the Flask routes do
                    log.exception("unhandled error serving %s %s", method, path)
                    status, payload = 500, orjson.dumps({"Error": f"internal error: {exc!r}"})
                send(conn, status, payload, close=close)
            else:
                answer = self.fallback(Request(method, path, query, headers, body, peer))
                send_raw(conn, *answer, close=close)
                status = answer[0]
        except OSError:
            return False  # the client went away while we answered
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s %s -> %s (%d bytes in)", peer, method, path, status, len(body))
        return not close

    def _body(self, reader: io.BufferedReader, headers: dict[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            try:
                return read_chunked(reader, self.max_body)
            except BodyTooLarge as exc:
                raise BadHttp(413, f"request {exc}") from exc
            except ValueError as exc:
                raise BadHttp(400, "malformed chunked body") from exc
        length = headers.get("content-length")
        if length is None:
            return b""
        if not length.isdigit():
            raise BadHttp(400, f"bad Content-Length {length!r}")
        n = int(length)
        if n > self.max_body:
            raise BadHttp(413, f"request body larger than {self.max_body} bytes")
        data = reader.read(n)
        if len(data) != n:
            raise ConnectionResetError("request body cut short")
        return data


def _request_line(line: bytes) -> tuple[str, str, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadHttp(400, f"malformed request line {line[:80]!r}")
    return parts[0], parts[1], parts[2]


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def send(conn: socket.socket, status: int, payload: bytes, close: bool) -> None:
    """A JSON answer (the routes' and our own errors)."""
    send_raw(conn, status_line(status), [("Content-Type", "application/json")], payload, close)


def send_raw(conn: socket.socket, status: str, headers: list[tuple[str, str]], payload: bytes, close: bool) -> None:
    """Headers and body in one write: one TCP segment (one TLS record) for a small answer. Written as
    headers then body, a call waited out the client's delayed ACK (40 ms on Linux) whenever the first
    write was still unacknowledged (Nagle; TCP_NODELAY is set too)."""
    lines = [f"HTTP/1.1 {status}\r\n"]
    for name, value in headers:
        if name.lower() not in ("content-length", "connection", "transfer-encoding"):
            lines.append(f"{name}: {value}\r\n")
    lines.append(f"Content-Length: {len(payload)}\r\n")
    if close:
        lines.append("Connection: close\r\n")
    lines.append("\r\n")
    conn.sendall("".join(lines).encode("latin-1") + payload)
