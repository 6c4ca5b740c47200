"""share_core.httpserver's thread-per-connection mode (the webhook's; the worker pool is the extender's,
tests/unit/scheduler/test_sched_server.py): routes, fallback, the connection cap, stop."""

from __future__ import annotations

import http.client
import socket
import time

from share_core.httpserver import HttpServer
from share_core.httpserver import Request


def test_per_connection_threads_routes_fallback_and_the_cap() -> None:
    def echo(body: bytes) -> tuple[int, bytes]:
        return 201, b'{"got":' + str(len(body)).encode() + b"}"

    def fallback(req: Request) -> tuple[str, list[tuple[str, str]], bytes]:
        return "200 OK", [("Content-Type", "text/plain")], f"{req.method} {req.path} {req.query}".encode()

    server = HttpServer({"/echo": echo}, "127.0.0.1", 0, fallback=fallback, per_connection=True, max_connections=2)
    server.start()
    try:
        a = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        a.request("POST", "/echo", b"12345")
        resp = a.getresponse()
        assert (resp.status, resp.read()) == (201, b'{"got":5}')
        a.request("GET", "/x?y=1")
        assert a.getresponse().read() == b"GET /x y=1"
        b = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # the second: held open
        deadline = time.monotonic() + 5
        while len(server._connections) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        third = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        assert third.recv(1) == b"", "over max_connections: closed at once"
        a.request("GET", "/still")  # the open ones carry on
        assert a.getresponse().read() == b"GET /still "
        b.close()
    finally:
        started = time.monotonic()
        server.stop()
        assert time.monotonic() - started < 3, "idle kept-alive connections do not hold stop up"
