"""The `kubernetes` Service for a real node's pods, without kube-proxy.

kubelet gives every container KUBERNETES_SERVICE_HOST/PORT: the ClusterIP of the `kubernetes`
Service (10.0.0.1:443 here), which in-cluster clients (client-go, the Python client) dial. kube-proxy
would turn that into the API server's address with iptables rules; the test machine's iptables are
left alone, so this stands in for that one Service instead: an empty bridge of our own holds the
ClusterIP (/32) on the host, and a TCP forwarder on ClusterIP:443 splices each connection to the
API server on 127.0.0.1 (TLS passes through untouched: the API server's certificate names 10.0.0.1).
Pods reach the host through their node's bridge when the RealNode has `pod_gateway=True`.

`stop()` closes every connection and deletes the interface (the address goes with it).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import threading
from typing import Self

from tests.controlplane.cluster import StartStop


class ServiceProxyError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip") or "/usr/sbin/ip"
    result = subprocess.run([ip, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ServiceProxyError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


class KubernetesServiceProxy(StartStop):
    """ClusterIP:port on the host (an empty bridge holds it: the dummy module may be missing) -> target."""

    def __init__(self, cluster_ip: str, port: int, target_host: str, target_port: int) -> None:
        self.cluster_ip, self.port = cluster_ip, port
        self.target = (target_host, target_port)
        self.interface = f"gpsapi{secrets.token_hex(2)}"
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.connections = 0  # accepted so far

    def start(self) -> Self:
        owned = _ip("-o", "-4", "addr", "show").stdout
        if f" {self.cluster_ip}/" in owned:
            raise ServiceProxyError(f"{self.cluster_ip} is already an address of this host:\n{owned}")
        try:
            _ip("link", "add", self.interface, "type", "bridge")  # no ports: it only holds the address
            _ip("addr", "add", f"{self.cluster_ip}/32", "dev", self.interface)
            _ip("link", "set", self.interface, "up")
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.cluster_ip, self.port))
            listener.listen(64)
            self._listener = listener
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=self._accept, name="kubernetes-service-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()
        if _ip("link", "show", self.interface, check=False).returncode == 0:
            _ip("link", "del", self.interface)

    def _accept(self) -> None:
        while not self._stopping.is_set() and self._listener is not None:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self.connections += 1
            with self._lock:
                self._conns.update((client, upstream))
            done = threading.Semaphore(0)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, done), daemon=True).start()
            threading.Thread(target=self._close_after, args=(client, upstream, done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            done.release()

    def _close_after(self, a: socket.socket, b: socket.socket, done: threading.Semaphore) -> None:
        done.acquire()
        done.acquire()
        with self._lock:
            self._conns.discard(a)
            self._conns.discard(b)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.close()
