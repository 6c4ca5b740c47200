"""The extender's HTTP server: kube-scheduler's calls answered straight from the verb functions by the
lean server both hot-path programs share (share_core.httpserver, where the why is), every other request
(inspect, metrics, health) passed to the Flask application as WSGI.

Threads: `threads` workers each accept connections on the one listening socket and serve a
connection's requests in turn (kube-scheduler keeps its connections alive; its binds arrive on
several at once). One process holds the cache, so the invariants of DESIGN.md need nothing between
processes. SIGTERM/SIGINT stop accepting; requests in progress finish (up to `grace` seconds).
See docs/policies.md "How the policy meets kube-scheduler".
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

from share_core.httpserver import Answer
from share_core.httpserver import HttpServer
from share_core.httpserver import Request
from share_core.httpserver import Route


class ExtenderServer(HttpServer):
    def __init__(
        self,
        wsgi_app: Callable[..., Iterable[bytes]],
        verbs: dict[str, Route],
        host: str,
        port: int,
        threads: int = 32,
        max_body: int = 64 * 1024 * 1024,
        grace: float = 10.0,
    ) -> None:
        super().__init__(verbs, host, port, fallback=self._wsgi, threads=threads, max_body=max_body, grace=grace)
        self.app = wsgi_app
        self.verbs = self.routes

    def _wsgi(self, req: Request) -> Answer:
        """Everything but the scheduling verbs: the Flask application, as any WSGI server would call it."""
        environ: dict[str, Any] = {
            "REQUEST_METHOD": req.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": req.path,
            "QUERY_STRING": req.query,
            "SERVER_NAME": self.host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": str(req.peer[0]) if isinstance(req.peer, tuple) else "",
            "CONTENT_LENGTH": str(len(req.body)),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(req.body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for name, value in req.headers.items():
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
        return str(status), response_headers, payload
