"""A whole gpushare cluster on loopback: the real control plane plus our programs as real processes.

On top of `ControlPlane` (etcd, kube-apiserver, kube-scheduler built from upstream) this starts:

* the chart's RBAC (rendered by helm from charts/gpushare), and runs the extender and each device
  plugin under exactly the service-account identity the chart grants those rules to;
* the extender (`share-scheduler`) and kube-scheduler configured by `share-scheduler print-config`;
* simulated GPU nodes: a Node object, a `share-plugin --backend sim` process and a kubelet stand-in that
  speaks the real device plugin protocol, admits pods bound to its node (in an order a test picks) and
  reports their phase.

Used by the integration tests and by `make demo`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from share_core.accounting import node_usage
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_key
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import NODE_LABEL
from share_core.contract import NODE_LABEL_VALUE
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_core.gpus import node_gpus
from share_core.kube import ApiServerClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.request import pod_request
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.cluster import ControlPlaneError
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import free_port
from tests.controlplane.cluster import http_status
from tests.kubelet import KubeletStandIn
from tests.kubelet import set_pod_phase
from tests.unit.chart.helm import render_chart

log = logging.getLogger(__name__)

Pod = dict[str, Any]
Order = Callable[[list[Pod]], list[Pod]]

NAMESPACE = "gpushare-system"
RELEASE = "gpushare"
PLUGIN_SA = f"{RELEASE}-device-plugin"
EXTENDER_SA = f"{RELEASE}-scheduler"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def sa_identity(namespace: str, name: str) -> tuple[str, list[str]]:
    """The user name and groups a service account's token authenticates as."""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    return f"system:serviceaccount:{namespace}:{name}", groups


def install_chart_rbac(cp: ControlPlane, set_values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Apply the chart's service accounts and RBAC (release RELEASE in NAMESPACE, with `set_values`, e.g.
    {"consolidation.enabled": True}); returns every object the chart rendered."""
    objects = render_chart(set_values=set_values, release=RELEASE, namespace=NAMESPACE)
    cp.kubectl("create", "namespace", NAMESPACE, check=False)
    rbac = [o for o in objects if o.get("kind") in RBAC_KINDS]
    if not any(o["kind"] == "ClusterRole" for o in rbac):
        raise ControlPlaneError("the chart rendered no ClusterRole")
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    return objects


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `check` until it returns something truthy; raise naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (KubeError, OSError) as exc:
            last_error = exc
        time.sleep(interval)
    why = f" ({last_error})" if last_error else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{why}")


@dataclass
class SimNode:
    name: str
    sim_gpus: str
    dir: Path
    kubelet: KubeletStandIn
    plugin: ManagedProcess | None = None
    stop_admission: threading.Event = field(default_factory=threading.Event)
    order: Order | None = None
    paused: bool = False  # kubelet admits nothing while its device plugin is away (restarts)

    @property
    def health_file(self) -> Path:
        return self.dir / "unhealthy-gpus"


class GpuCluster:
    """Our programs on a running ControlPlane; stop() ends everything it started, by PID."""

    def __init__(self, cp: ControlPlane, workdir: Path, policy: str = "binpack") -> None:
        self.cp = cp
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.policy = policy
        self.admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-tests")
        self.nodes: dict[str, SimNode] = {}
        self.extender: ManagedProcess | None = None
        self.extender_port = 0
        self.plugin_kubeconfig: Path | None = None
        self.extender_kubeconfig: Path | None = None
        self.chart_objects: list[dict[str, Any]] = []

    # -- RBAC from the chart ------------------------------------------------------------------------

    def install_rbac(self) -> None:
        """Apply the chart's service accounts and RBAC; our processes then run as those accounts."""
        self.chart_objects = install_chart_rbac(self.cp)
        self.plugin_kubeconfig = self.cp.kubeconfig_for(*sa_identity(NAMESPACE, PLUGIN_SA))
        self.extender_kubeconfig = self.cp.kubeconfig_for(*sa_identity(NAMESPACE, EXTENDER_SA))

    # -- extender and kube-scheduler -----------------------------------------------------------------

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.extender_port}"

    def start_extender(self, timeout: float = 60.0) -> None:
        if self.extender_kubeconfig is None:
            self.install_rbac()
        if not self.extender_port:
            self.extender_port = free_port()
        self.extender = ManagedProcess(
            "extender",
            [
                sys.executable,
                "-m",
                "share_scheduler.cli",
                "--port",
                str(self.extender_port),
                "--bind-address",
                "127.0.0.1",
                "--kubeconfig",
                str(self.extender_kubeconfig),
                "--policy",
                self.policy,
                "--log-level",
                "INFO",
            ],
            self.workdir / "logs" / "extender.log",
        )
        try:
            wait_for(lambda: self._http_status("/readyz") == 200, timeout, "the extender to be ready")
        except (TimeoutError, ControlPlaneError) as exc:
            error = exc if isinstance(exc, ControlPlaneError) else self.extender.fail(str(exc))
            self.stop_extender()  # a later test starts its own (`ensure_extender`), not on a half-started one
            raise error from exc

    def stop_extender(self) -> None:
        if self.extender is not None:
            self.extender.stop()
            self.extender = None

    def ensure_extender(self) -> None:
        """Start the extender again if it is not running (a test stopped or lost it), so that one test's
        failure does not fail every later test of the session."""
        if self.extender is None or not self.extender.alive():
            if self.extender is not None:
                log.warning("the extender had exited (%s); starting it again", self.extender.popen.returncode)
            self.stop_extender()
            self.start_extender()

    def restart_extender(self) -> None:
        self.stop_extender()
        self.start_extender()

    def _http_status(self, path: str) -> int:
        if self.extender is not None and not self.extender.alive():
            raise self.extender.fail("exited")
        return http_status(self.extender_url + path, timeout=3)

    def extender_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.extender_url + path, timeout=10) as resp:
            return json.loads(resp.read())

    def scheduler_config(self) -> str:
        out = self._run_cli(
            "share_scheduler.cli",
            "print-config",
            "--extender-url",
            f"{self.extender_url}/gpushare-scheduler",
            "--no-leader-elect",
        )
        return out

    def start_scheduler(self) -> None:
        self.cp.start_scheduler(self.scheduler_config())

    @staticmethod
    def _run_cli(module: str, *args: str) -> str:
        import subprocess

        result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ControlPlaneError(f"{module} {' '.join(args)} failed: {result.stderr[-2000:]}")
        return result.stdout

    def start(self) -> GpuCluster:
        self.install_rbac()
        self.start_extender()
        self.start_scheduler()
        return self

    # -- simulated GPU nodes --------------------------------------------------------------------------

    def add_node(self, name: str, sim_gpus: str, order: Order | None = None, timeout: float = 30.0) -> SimNode:
        """A Node with a device plugin and a kubelet stand-in; returns once kubelet sees its devices
        and the plugin has published the node's GPUs."""
        node_dir = self.workdir / "nodes" / name
        (node_dir / "device-plugins").mkdir(parents=True, exist_ok=True)
        node = SimNode(
            name=name,
            sim_gpus=sim_gpus,
            dir=node_dir,
            kubelet=KubeletStandIn(str(node_dir / "device-plugins"), str(node_dir / "pod-resources" / "kubelet.sock")),
            order=order,
        )
        self.nodes[name] = node
        self.admin.request(
            "POST",
            "/api/v1/nodes",
            body={
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {NODE_LABEL: NODE_LABEL_VALUE, "kubernetes.io/hostname": name}},
            },
        )
        resources = {"cpu": "64", "memory": "512Gi", "pods": "250"}
        # An address for `kubectl inspect gpushare` to show; nothing is ever sent to it.
        address = {"type": "InternalIP", "address": f"127.0.1.{len(self.nodes)}"}
        self._patch_node_status(name, {"capacity": resources, "allocatable": resources, "addresses": [address]})
        node.kubelet.start()
        self.start_plugin(name, timeout)
        node.kubelet.run_with_kube(
            self.admin, name, order=lambda batch: self._ordered(node, batch), stop=node.stop_admission
        )
        return node

    def _ordered(self, node: SimNode, batch: list[Pod]) -> list[Pod]:
        if node.paused:
            return []
        return node.order(batch) if node.order else batch

    def restart_plugin(self, name: str) -> None:
        """Stop and start a node's device plugin; kubelet admits no pod meanwhile, as it has no endpoint."""
        node = self.nodes[name]
        node.paused = True
        try:
            with node.kubelet._admit_lock:  # an admission already under way finishes first
                self.stop_plugin(name)
                self.start_plugin(name)
        finally:
            node.paused = False

    def restart_kubelet(self, name: str) -> float:
        """A kubelet restart (sockets recreated, plugin re-registers); returns seconds to re-registration."""
        node = self.nodes[name]
        node.paused = True
        try:
            with node.kubelet._admit_lock:
                return node.kubelet.restart()
        finally:
            node.paused = False

    def start_plugin(self, name: str, timeout: float = 30.0) -> None:
        node = self.nodes[name]
        registrations = node.kubelet.registrations
        node.plugin = ManagedProcess(
            f"plugin-{name}",
            plugin_argv(
                name,
                node.sim_gpus,
                node.dir / "device-plugins",
                node.dir / "pod-resources" / "kubelet.sock",
                self.plugin_kubeconfig,
                health_file=node.health_file,
            ),
            self.workdir / "logs" / f"plugin-{name}.log",
        )
        try:
            node.kubelet.wait_for(
                lambda: node.kubelet.registrations > registrations and bool(node.kubelet.healthy_devices()),
                timeout,
                f"plugin on {name} to register",
            )
            self.sync_node_capacity(name)
            wait_for(
                lambda: ANN_NODE_GPUS in (self.admin.get_node(name)["metadata"].get("annotations") or {}),
                timeout,
                f"plugin on {name} to publish {ANN_NODE_GPUS}",
            )
        except TimeoutError as exc:
            raise node.plugin.fail(str(exc)) from exc

    def stop_plugin(self, name: str) -> None:
        node = self.nodes[name]
        if node.plugin is not None:
            node.plugin.stop()
            node.plugin = None

    def sync_node_capacity(self, name: str) -> None:
        """What kubelet does after ListAndWatch: node capacity = healthy devices of our resource."""
        healthy = len(self.nodes[name].kubelet.healthy_devices())
        resources = {RESOURCE_MEM: str(healthy)}
        self._patch_node_status(name, {"capacity": resources, "allocatable": resources})

    def _patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.admin.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
        )

    def remove_node(self, name: str) -> None:
        node = self.nodes[name]
        node.stop_admission.set()
        self.stop_plugin(name)
        node.kubelet.stop()
        del self.nodes[name]
        with contextlib.suppress(NotFound):
            self.admin.request("DELETE", f"/api/v1/nodes/{name}")

    # -- pods ---------------------------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        self.cp.kubectl("create", "namespace", name, check=False)

    def create_pod(self, pod: Pod) -> Pod:
        ns = pod["metadata"].setdefault("namespace", "default")
        return self.admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)

    def pods(self, namespace: str) -> list[Pod]:
        return [p for p in self.admin.list_pods().items if p["metadata"]["namespace"] == namespace]

    def wait_phase(self, namespace: str, name: str, phases: Iterable[str], timeout: float = 60.0) -> Pod:
        wanted = set(phases)
        return wait_for(
            lambda: (p := self.admin.get_pod(namespace, name)) and p.get("status", {}).get("phase") in wanted and p,
            timeout,
            f"pod {namespace}/{name} to reach {sorted(wanted)}",
        )

    def wait_all_running(self, namespace: str, count: int, timeout: float = 180.0) -> list[Pod]:
        def done() -> list[Pod] | None:
            pods = self.pods(namespace)
            running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
            return running if len(running) >= count else None

        return wait_for(done, timeout, f"{count} pods Running in {namespace}", interval=0.5)

    def finish_pod(self, namespace: str, name: str) -> None:
        """The pod's containers exited: kubelet reports Succeeded and frees its devices."""
        pod = self.admin.get_pod(namespace, name)
        set_pod_phase(self.admin, namespace, name, "Succeeded")
        node = self.nodes.get(pod["spec"].get("nodeName", ""))
        if node is not None:
            node.kubelet.remove_pod(namespace, name)

    def env_of(self, pod: Pod) -> dict[str, dict[str, str]]:
        node = self.nodes[pod["spec"]["nodeName"]]
        return node.kubelet.envs().get((pod["metadata"]["namespace"], pod["metadata"]["name"]), {})

    # -- the invariants -----------------------------------------------------------------------------

    def check_invariants(self) -> dict[str, Any]:
        """Every running pod's env names the GPU(s) its annotations name, with its own limit; no GPU
        is promised more than it has. Returns per-GPU use (for the test's own assertions)."""
        pods = self.admin.list_pods().items
        used: dict[str, Any] = {}
        for name in self.nodes:
            node_obj = self.admin.get_node(name)
            on_node = [p for p in pods if p.get("spec", {}).get("nodeName") == name]
            usage = node_usage(node_gpus(node_obj), on_node)
            assert not usage.problems, usage.problems
            for gpu in usage.gpus:
                assert gpu.used <= gpu.total, f"{name} GPU {gpu.index} over-committed: {gpu.used}/{gpu.total}"
            used[name] = {g.index: g.used for g in usage.gpus}
            uuid_of = {g.index: g.uuid for g in usage.gpus}
            for pod in on_node:
                if pod.get("status", {}).get("phase") != "Running":
                    continue
                assignment = parse_assignment(pod_annotations(pod))
                request = pod_request(pod)
                assert assignment is not None and request is not None, f"{pod_key(pod)} runs without an assignment"
                assert assignment.gpu_uuids == tuple(uuid_of[i] for i in assignment.gpu_indices), pod_key(pod)
                env = self.env_of(pod)
                for creq in request.containers:
                    if creq.units == 0:
                        continue
                    got = env.get(creq.name)
                    assert got is not None, f"{pod_key(pod)} container {creq.name} got no Allocate"
                    assert got[ENV_VISIBLE_DEVICES].split(",") == list(assignment.gpu_uuids), (
                        f"{pod_key(pod)}/{creq.name}: env {got[ENV_VISIBLE_DEVICES]} vs annotations "
                        f"{assignment.gpu_uuids}"
                    )
                    per_gpu_mib = creq.units * MemoryUnit.GiB.mib // request.gpu_count
                    assert int(got[ENV_MEM_LIMIT_MIB]) == per_gpu_mib, (pod_key(pod), creq.name, got)
        return used

    # -- teardown -----------------------------------------------------------------------------------

    def stop(self) -> None:
        for name in list(self.nodes):
            with contextlib.suppress(Exception):
                self.remove_node(name)
        with contextlib.suppress(Exception):
            self.cp.stop_scheduler()
        self.stop_extender()

    def logs(self, lines: int = 40) -> str:
        procs = [p for p in [self.extender, *(n.plugin for n in self.nodes.values())] if p is not None]
        return "\n".join(f"--- {p.name} ---\n{p.log_tail(lines)}" for p in procs)


def plugin_argv(
    node: str,
    sim_gpus: str,
    device_plugin_dir: str | Path,
    pod_resources_socket: str | Path,
    kubeconfig: str | Path | None,
    health_file: str | Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`share-plugin --backend sim` for one node, as the DaemonSet runs it (one place for every harness).

    Metrics go to an ephemeral port on loopback (many plugins share this host); `extra` flags come last
    and win.
    """
    argv = [sys.executable, "-m", "share_plugin", "--backend", "sim", "--sim-gpus", sim_gpus, "--node-name", node]
    if health_file is not None:
        argv += ["--sim-health-file", str(health_file)]
    argv += ["--device-plugin-dir", str(device_plugin_dir), "--pod-resources-socket", str(pod_resources_socket)]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    argv += ["--metrics-address", "127.0.0.1", "--metrics-port", "0"]
    return [*argv, "--log-level", "INFO", *extra]


def pod_spec(
    name: str,
    gib: int | list[int],
    namespace: str,
    *,
    gpu_count: int = 1,
    model: str = "",
    init_gib: int = 0,
    scheduler: str = "gpushare-scheduler",
) -> Pod:
    """A pod asking `gib` (one container) or a list of per-container amounts."""
    amounts = gib if isinstance(gib, list) else [gib]
    annotations: dict[str, str] = {}
    if gpu_count != 1:
        annotations["gpushare.io/gpu-count"] = str(gpu_count)
    if model:
        annotations["gpushare.io/gpu-model"] = model
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        "containers": [
            {"name": f"c{i}", "image": "busybox", "resources": {"limits": {RESOURCE_MEM: str(a)}}}
            for i, a in enumerate(amounts)
        ],
    }
    if init_gib:
        spec["initContainers"] = [
            {"name": "init", "image": "busybox", "resources": {"limits": {RESOURCE_MEM: str(init_gib)}}}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def with_scheduler(doc: dict[str, Any], scheduler: str = SCHEDULER_NAME) -> dict[str, Any]:
    """A sample with `schedulerName` set, for a cluster without the admission webhook that would set it
    (samples/ leave it out: the webhook gives it). A pod, or a workload's pod template."""
    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    spec.setdefault("schedulerName", scheduler)
    return doc
