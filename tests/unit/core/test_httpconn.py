"""share_core.httpconn against a local HTTP/1.1 server that answers as scripted: bodies by length and
by chunks, kept-alive connections, a kept-alive connection the server closed, `Connection: close`,
timeouts and garbage. (TLS and the real API server: every integration test goes through it.)"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest

from share_core.httpconn import ConnectionPool
from share_core.httpconn import TransportError

Handler = Callable[[socket.socket, bytes], bool]  # answers one request; False: close the connection


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


class Server:
    """Accepts connections; each request is answered by the next handler in `script` (or the default)."""

    def __init__(self, default: Handler) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.default = default
        self.script: list[Handler] = []
        self.connections = 0
        self.requests: list[bytes] = []
        self.live: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.live.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    req = read_request(conn)
                except OSError:
                    return
                if not req:
                    return
                self.requests.append(req)
                handler = self.script.pop(0) if self.script else self.default
                if not handler(conn, req):
                    return

    def close_idle(self) -> None:
        """What an API server does to a connection idle too long (or on restart)."""
        for conn in self.live:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.live.clear()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def raw(answer: bytes, keep: bool) -> Handler:
    """A handler that sends `answer` as it is, then keeps the connection open (`keep`) or closes it."""

    def handle(conn: socket.socket, _: bytes) -> bool:
        conn.sendall(answer)
        return keep

    return handle


def ok(body: bytes = b'{"kind":"Status"}', status: str = "201 Created") -> Handler:
    def handle(conn: socket.socket, _: bytes) -> bool:
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return True

    return handle


@pytest.fixture
def server():
    srv = Server(ok())
    yield srv
    srv.sock.close()


def test_request_and_keep_alive(server):
    pool = ConnectionPool(server.url())
    for i in range(5):
        answer = pool.request("POST", f"/x/{i}", b'{"a":1}', {"Content-Type": "application/json"})
        assert answer.status == 201 and answer.data == b'{"kind":"Status"}'
        assert answer.headers["content-type"] == "application/json"
    assert server.connections == 1, "one kept-alive connection serves every request in turn"
    first = server.requests[0]
    assert first.startswith(b"POST /x/0 HTTP/1.1\r\n")
    assert b"\r\nContent-Length: 7\r\n" in first and first.endswith(b'{"a":1}')
    assert f"Host: 127.0.0.1:{server.port}".encode() in first


def test_chunked_body(server):
    server.script.append(
        raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n", keep=True)
    )
    pool = ConnectionPool(server.url())
    assert pool.request("GET", "/c").data == b"hello!"
    assert pool.request("GET", "/after").status == 201  # the connection is still usable after it
    assert server.connections == 1


def test_server_closed_kept_alive_connection_is_retried_once(server):
    pool = ConnectionPool(server.url())
    pool.request("GET", "/one")
    server.close_idle()
    assert pool.request("POST", "/binding", b"{}").status == 201
    assert server.connections == 2
    assert [r.split(b" ")[1] for r in server.requests] == [b"/one", b"/binding"], "sent once on the fresh connection"


def test_no_retry_once_an_answer_started(server):
    half = raw(b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\npartial", keep=False)
    pool = ConnectionPool(server.url())
    pool.request("GET", "/warm")
    server.script.append(half)
    with pytest.raises(TransportError, match="failed"):
        pool.request("POST", "/binding", b"{}")
    assert len(server.requests) == 2, "a half-answered request is not sent again"
    assert pool.request("GET", "/next").status == 201  # the broken connection was not kept


def test_connection_close_is_honoured(server):
    server.script.append(raw(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", keep=False))
    pool = ConnectionPool(server.url())
    assert pool.request("GET", "/a").data == b"ok"
    assert pool.request("GET", "/b").status == 201
    assert server.connections == 2


def test_body_until_close_and_no_body_statuses(server):
    until_close = raw(b"HTTP/1.1 200 OK\r\n\r\nall of it", keep=False)
    no_content = raw(b"HTTP/1.1 204 No Content\r\n\r\n", keep=True)
    server.script += [until_close, no_content]
    pool = ConnectionPool(server.url())
    assert pool.request("GET", "/a").data == b"all of it"
    answer = pool.request("DELETE", "/b")
    assert (answer.status, answer.data) == (204, b"")


def test_timeout_is_a_transport_error():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) but never answers
    try:
        pool = ConnectionPool(f"http://127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(TransportError, match="timed out"):
            pool.request("GET", "/", timeout=0.3)
    finally:
        silent.close()


def test_refused_and_garbage_are_transport_errors(server):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(TransportError, match="cannot connect"):
        ConnectionPool(f"http://127.0.0.1:{port}").request("GET", "/")

    server.script.append(raw(b"SMTP ready\r\n\r\n", keep=False))
    with pytest.raises(TransportError, match="malformed status line"):
        ConnectionPool(server.url()).request("GET", "/")


def test_bad_tls_settings_fail_at_use_not_at_construction(tmp_path):
    import ssl

    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate")
    pool = ConnectionPool("https://127.0.0.1:1", ssl_context=lambda: ssl.create_default_context(cafile=str(bad)))
    with pytest.raises(TransportError, match="TLS settings"):
        pool.request("GET", "/")


def test_rejects_non_http_urls():
    with pytest.raises(ValueError):
        ConnectionPool("ftp://example")
