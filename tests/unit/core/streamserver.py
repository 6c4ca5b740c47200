"""A loopback server that writes a watch stream in the chunks a test chooses, and a client of it: reads
then end wherever a test wants them to, mid-event included."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client

from share_core.kube import ApiServerClient


class StreamServer(http.server.ThreadingHTTPServer):
    pieces: list[bytes]
    content_type: str
    accepts: list[str]  # the Accept header of each request


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        server: StreamServer = self.server  # type: ignore[assignment]
        server.accepts.append(self.headers.get("Accept", ""))
        self.send_response(200)
        self.send_header("Content-Type", server.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, piece in enumerate(server.pieces):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            if n % 25 == 0:
                time.sleep(0.002)  # let the client read what it has: reads end mid-event
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(content_type: str) -> Iterator[StreamServer]:
    server = StreamServer(("127.0.0.1", 0), Handler)
    server.pieces, server.content_type, server.accepts = [], content_type, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def watcher(server: StreamServer) -> ApiServerClient:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    return ApiServerClient(cfg)
