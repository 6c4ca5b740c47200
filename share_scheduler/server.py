"""The extender's HTTP server: kube-scheduler's calls answered straight from the verb functions, every
other request (inspect, metrics, health) passed to the Flask application as WSGI.

Why not gunicorn: kube-scheduler's scheduling cycle is serial and waits on our filter, and on two
shared cores every millisecond we spend is one kube-scheduler does not get. Under gunicorn's threaded
worker, reading a request, building its WSGI environ, routing it through Flask and writing the answer
cost about 1.8 ms of CPU per pod (filter and bind) on top of the 2 ms the verbs themselves take
(measured per thread in bench/bench_throughput.py runs, 1,000 nodes); here a request is read with a
few socket reads and answered with one write. See docs/policies.md "How the policy meets kube-scheduler".

Threads: `threads` workers each accept connections on the one listening socket and serve a
connection's requests in turn (kube-scheduler keeps its connections alive; its binds arrive on
several at once). A connection idle for KEEPALIVE_IDLE seconds is closed, so idle clients cannot
hold the workers. One process holds the cache, so the invariants of DESIGN.md need nothing between
processes. SIGTERM/SIGINT stop accepting; requests in progress finish (up to `grace` seconds).
"""

from __future__ import annotations

import io
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import orjson

from share_core.httpconn import MAX_HEADER_LINE, BodyTooLarge, read_chunked, read_headers

log = logging.getLogger(__name__)

Verb = Callable[[bytes], tuple[int, bytes]]
KEEPALIVE_IDLE = 30.0  # seconds a kept-alive connection may sit idle (kube-scheduler's Go client keeps 2)
READ_TIMEOUT = 60.0  # seconds to receive a whole request once it started


class BadHttp(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ExtenderServer:
    def __init__(
        self,
        wsgi_app: Callable[..., Iterable[bytes]],
        verbs: dict[str, Verb],
        host: str,
        port: int,
        threads: int = 32,
        max_body: int = 64 * 1024 * 1024,
        grace: float = 10.0,
    ) -> None:
        self.app = wsgi_app
        self.verbs = verbs
        self.threads = threads
        self.max_body = max_body
        self.grace = grace
        # Blocking accept, no timeout: the kernel then wakes ONE waiting worker per connection. With a
        # timeout, Python polls the socket first, and every idle worker's poll wakes on each new
        # connection, takes the GIL, finds nothing to accept and polls again: with 32 workers that was
        # ~39 context switches per connection (kube-scheduler's Go client keeps 2 idle connections, so
        # about a third of its binds open a new one). stop() shuts the socket down to wake the workers.
        self.sock = socket.create_server((host, port), reuse_port=False, backlog=256)
        self.host, self.port = host, self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._idle: set[socket.socket] = set()  # kept-alive connections waiting for their next request
        self._idle_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

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
        with self._idle_lock:
            for conn in self._idle:  # wake the workers parked on idle connections: they close them
                try:
                    conn.shutdown(socket.SHUT_RD)
                except OSError:
                    pass
        for t in self._workers:
            t.join(self.grace)
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
        log.info("serving on %s:%d with %d threads", self.host, self.port, self.threads)
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
            try:
                self._serve(conn, peer)
            except Exception:  # a bug must not take a worker thread with it
                log.exception("connection from %s failed", peer)
            finally:
                conn.close()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = conn.makefile("rb")
        try:
            while not self._stop.is_set():
                conn.settimeout(KEEPALIVE_IDLE)
                with self._idle_lock:
                    if self._stop.is_set():
                        return
                    self._idle.add(conn)
                try:
                    line = reader.readline(MAX_HEADER_LINE)
                except (TimeoutError, OSError):
                    return  # idle too long, or the client went away
                finally:
                    with self._idle_lock:
                        self._idle.discard(conn)
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    continue  # tolerated between requests (RFC 9112 2.2)
                conn.settimeout(READ_TIMEOUT)
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
                _send(conn, status, orjson.dumps({"Error": str(exc)}), close=True)
            except OSError:
                pass
            return False
        except (TimeoutError, OSError):
            return False
        close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        path, _, query = target.partition("?")
        verb = self.verbs.get(path) if method == "POST" else None
        try:
            if verb is not None:
                try:
                    status, payload = verb(body)
                except Exception as exc:  # a bug: answer it as one, as the Flask routes do
                    log.exception("unhandled error serving %s %s", method, path)
                    status, payload = 500, orjson.dumps({"Error": f"internal error: {exc!r}"})
                _send(conn, status, payload, close=close)
            else:
                status = self._wsgi(conn, method, path, query, headers, body, peer, close)
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

    def _wsgi(
        self,
        conn: socket.socket,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        peer: Any,
        close: bool,
    ) -> str:
        """Everything but the scheduling verbs: the Flask application, as any WSGI server would call it."""
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": self.host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": str(peer[0]) if isinstance(peer, tuple) else "",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for name, value in headers.items():
            key = name.upper().replace("-", "_")
            if key == "CONTENT_TYPE":
                environ["CONTENT_TYPE"] = value
            elif key != "CONTENT_LENGTH":
                environ[f"HTTP_{key}"] = value
        started: list[Any] = []

        def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            started[:] = [status, response_headers]

        result = self.app(environ, start_response)
        try:
            payload = b"".join(result)
        finally:
            closer = getattr(result, "close", None)
            if closer is not None:
                closer()
        status, response_headers = started
        _send_raw(conn, status, response_headers, payload, close)
        return str(status)


def _request_line(line: bytes) -> tuple[str, str, str]:
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadHttp(400, f"malformed request line {line[:80]!r}")
    return parts[0], parts[1], parts[2]


def _send(conn: socket.socket, status: int, payload: bytes, close: bool) -> None:
    """A JSON answer (the verbs' and our own errors)."""
    _send_raw(conn, f"{status} {_reason(status)}", [("Content-Type", "application/json")], payload, close)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _send_raw(conn: socket.socket, status: str, headers: list[tuple[str, str]], payload: bytes, close: bool) -> None:
    lines = [f"HTTP/1.1 {status}\r\n"]
    for name, value in headers:
        if name.lower() not in ("content-length", "connection", "transfer-encoding"):
            lines.append(f"{name}: {value}\r\n")
    lines.append(f"Content-Length: {len(payload)}\r\n")
    if close:
        lines.append("Connection: close\r\n")
    lines.append("\r\n")
    conn.sendall("".join(lines).encode("latin-1") + payload)
