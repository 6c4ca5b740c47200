"""The CLI shell: errors a person understands, exit codes, colour rules, and the real adapter over loopback."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs
from urllib.parse import urlparse

import pytest
import yaml

from share_core.fake import FakeKube
from share_core.kube import Forbidden
from share_core.kube import KubeError
from share_core.kube import Unavailable
from share_inspect.cli import EXIT_ERROR
from share_inspect.cli import EXIT_FORBIDDEN
from share_inspect.cli import EXIT_NO_NODES
from share_inspect.cli import EXIT_UNREACHABLE
from share_inspect.cli import EXIT_USAGE
from share_inspect.cli import main
from share_inspect.cli import style_for
from tests.unit.inspect.inspect_cluster import NODES
from tests.unit.inspect.inspect_cluster import PODS
from tests.unit.inspect.inspect_cluster import fake_cluster
from tests.unit.inspect.inspect_cluster import node


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(argv: list[str], kube: FakeKube | None = None, **kw) -> tuple[int, str, str]:
    out, err = kw.pop("stdout", io.StringIO()), io.StringIO()
    code = main(argv, client=kube if kube is not None else fake_cluster(), stdout=out, stderr=err, **kw)
    return code, out.getvalue(), err.getvalue()


def test_unreachable_cluster() -> None:
    kube = fake_cluster()
    kube.fail("list_nodes", Unavailable("GET /api/v1/nodes: API server unreachable or timed out: refused"))
    code, out, err = run([], kube)
    assert code == EXIT_UNREACHABLE and out == ""
    assert err.startswith("error: cannot reach the Kubernetes API server: ")


def test_forbidden_pods_names_the_rbac_verb() -> None:
    kube = fake_cluster()
    kube.fail("list_pods", Forbidden('pods is forbidden: User "bob" cannot list resource "pods"', 403, "Forbidden"))
    code, out, err = run([], kube)
    assert code == EXIT_FORBIDDEN and out == ""
    assert "list pods" in err and "RBAC verb 'list' on 'pods'" in err
    assert 'User "bob"' in err


def test_forbidden_nodes_names_the_rbac_verb() -> None:
    kube = fake_cluster()
    kube.fail("list_nodes", Forbidden("nodes is forbidden", 403, "Forbidden"))
    code, _, err = run([], kube)
    assert code == EXIT_FORBIDDEN and "list nodes" in err and "'nodes'" in err


def test_other_api_error() -> None:
    kube = fake_cluster()
    kube.fail("list_pods", KubeError("GET /api/v1/pods: HTTP 400: bad selector", 400))
    code, _, err = run([], kube)
    assert code == EXIT_ERROR and err.startswith("error: list pods failed: ")


def test_no_gpu_share_nodes() -> None:
    kube = FakeKube()
    kube.add_node(node("cpu-1", "10.0.0.1", None, {"cpu": "4"}))
    code, out, err = run([], kube)
    assert code == EXIT_NO_NODES and out == ""
    assert "no GPU-share nodes in this cluster" in err


def test_unknown_node_filter() -> None:
    code, out, err = run(["gpu-a", "cpu-1", "nope"])
    assert code == EXIT_NO_NODES and out == ""
    assert err.rstrip().endswith("cpu-1, nope")


def test_usage_error() -> None:
    code, _, _ = run(["-o", "xml"])
    assert code == EXIT_USAGE


def test_bad_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    out, err = io.StringIO(), io.StringIO()
    assert main(["--kubeconfig", str(missing)], stdout=out, stderr=err) == EXIT_ERROR
    assert err.getvalue().startswith("error: cannot load Kubernetes configuration:")


def test_style_rules() -> None:
    assert style_for(io.StringIO(), False, {}).bar_width == 0  # not a terminal: plain
    assert style_for(io.StringIO(), False, {}).color is False
    assert style_for(Tty(), False, {}).color is True
    assert style_for(Tty(), True, {}).color is False  # --no-color
    assert style_for(Tty(), False, {"NO_COLOR": "1"}).color is False
    assert style_for(Tty(), True, {}).bar_width > 0  # bars stay without colour


def test_no_color_flag_on_terminal() -> None:
    code, out, _ = run(["--no-color"], stdout=Tty(), env={})
    assert code == 0 and "\x1b[" not in out and "\u2588" in out


def test_json_and_yaml_parse_to_the_same_data() -> None:
    _, j, err_j = run(["-o", "json"])
    _, y, _ = run(["-o", "yaml"])
    assert json.loads(j) == yaml.safe_load(y)
    assert err_j == ""  # problems live in the document, not on stderr


def test_broken_pipe_is_not_an_error() -> None:
    class Closed(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError

    assert main([], client=fake_cluster(), stdout=Closed(), stderr=io.StringIO()) == 0


# -- the real ApiServerClient over loopback ------------------------------------------------------


class FakeApiServer(BaseHTTPRequestHandler):
    """Serves the fixed cluster as the API server would: paginated lists, field selectors ignored."""

    pods_status = 200
    requests: list[str] = []
    # DRA lists by path; empty: this server has no resource.k8s.io/v1 (Kubernetes < 1.34), so 404
    dra: dict[str, list[dict]] = {}
    forbidden: set[str] = set()  # paths answered 403

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        type(self).requests.append(self.path)
        if url.path in self.forbidden:
            self._send(403, {"kind": "Status", "reason": "Forbidden", "message": f"{url.path} is forbidden"})
            return
        if url.path == "/api/v1/pods" and self.pods_status == 403:
            self._send(403, {"kind": "Status", "reason": "Forbidden", "message": 'pods is forbidden: User "bob"'})
            return
        items = {"/api/v1/nodes": NODES, "/api/v1/pods": PODS, **self.dra}.get(url.path)
        if items is None:
            self._send(404, {"kind": "Status", "reason": "NotFound", "message": "not found"})
            return
        # Pages of at most 3, whatever the client asks: the server may always return fewer than `limit`.
        start, limit = int(q.get("continue") or 0), min(int(q.get("limit") or 1000), 3)
        page = items[start : start + limit]
        more = start + limit < len(items)
        meta = {"resourceVersion": "7", **({"continue": str(start + limit)} if more else {})}
        self._send(200, {"kind": "List", "metadata": meta, "items": page})


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[Path, type[FakeApiServer]]]:
    handler = type("Handler", (FakeApiServer,), {"requests": [], "pods_status": 200, "dra": {}, "forbidden": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        yield kubeconfig, handler
    finally:
        server.shutdown()
        server.server_close()


def kubeconfig_text(server: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        }
    )


def test_real_adapter_end_to_end(api_server) -> None:
    kubeconfig, handler = api_server
    out, err = io.StringIO(), io.StringIO()
    assert main(["--kubeconfig", str(kubeconfig), "--context", "ctx"], stdout=out, stderr=err) == 0
    assert "82/208 (39%)" in out.getvalue()
    paths = [r.split("?")[0] for r in handler.requests]
    # one paginated list each, nothing per node; then the DRA slices, which this server lacks (404: no DRA)
    assert paths == ["/api/v1/nodes"] * 2 + ["/api/v1/pods"] * 4 + ["/apis/resource.k8s.io/v1/resourceslices"]
    assert all(
        "fieldSelector=status.phase%21%3DFailed%2Cstatus.phase%21%3DSucceeded" in r for r in handler.requests[2:6]
    )
    assert "fieldSelector=spec.driver%3Dgpushare.io" in handler.requests[6]
    assert "resource" not in err.getvalue(), "a cluster without DRA is no problem"


def test_real_adapter_forbidden(api_server) -> None:
    kubeconfig, handler = api_server
    handler.pods_status = 403
    out, err = io.StringIO(), io.StringIO()
    assert main(["--kubeconfig", str(kubeconfig)], stdout=out, stderr=err) == EXIT_FORBIDDEN
    assert "list pods" in err.getvalue() and 'User "bob"' in err.getvalue()


def test_real_adapter_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(f"http://127.0.0.1:{port}"))
    out, err = io.StringIO(), io.StringIO()
    assert main(["--kubeconfig", str(kubeconfig)], stdout=out, stderr=err) == EXIT_UNREACHABLE
    assert err.getvalue().startswith(f"error: cannot reach the Kubernetes API server at http://127.0.0.1:{port}: ")
    assert out.getvalue() == ""
