"""Our device plugin on the real kubelet node, inside a GpuCluster: the production path, end to end.

`RealGpuNode` runs `share-plugin --backend sim` as a process under the chart's device-plugin service
account, registering with the real kubelet of a `RealNode` through its device-plugin directory and reading
its PodResources socket, exactly as the DaemonSet does on a node. Pods run real containers that print
their env; what a container saw is read back through the API's `pods/log` and checked against the pod's
annotations.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from collections.abc import Iterator
from io import StringIO
from typing import Any
from typing import Self

import grpc

from share_core.accounting import node_usage
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_key
from share_core.contract import ANN_NODE_GPUS
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import RESOURCE_MEM
from share_core.contract import MemoryUnit
from share_core.gpus import node_gpus
from share_core.kube import KubeError
from share_core.request import pod_request
from share_node.backend.sim import parse_sim_gpus
from share_plugin.api import podresources_v1_pb2 as prpb
from share_plugin.api import podresources_v1_pb2_grpc as prgrpc
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import Pod
from tests.controlplane.gpucluster import plugin_argv
from tests.controlplane.gpucluster import wait_for
from tests.node import RealNode

ENV_END = "GPUSHARE-ENV-END"
# Print the env once, then stay up (app containers and sidecars) or exit (init containers).
PRINT_ENV_AND_SLEEP = ["sh", "-c", f"env; echo {ENV_END}; exec sleep 86400"]
PRINT_ENV = ["sh", "-c", f"env; echo {ENV_END}"]


def real_pod(
    name: str,
    namespace: str,
    gib: int | list[int],
    *,
    image: str,
    init_gib: int | list[int] = 0,
    sidecar_gib: int = 0,
    gpu_count: int = 1,
    scheduler: str = "gpushare-scheduler",
    extra: dict[str, Any] | None = None,
) -> Pod:
    """A pod of real busybox containers, each asking gpu-mem and printing what it was given."""

    def ctr(cname: str, units: int, command: list[str], **more: Any) -> dict[str, Any]:
        limits = {RESOURCE_MEM: str(units)} if units else {}
        return {
            "name": cname,
            "image": image,
            "imagePullPolicy": "Never",
            "command": command,
            "resources": {"limits": limits},
            **more,
        }

    amounts = gib if isinstance(gib, list) else [gib]
    inits = init_gib if isinstance(init_gib, list) else ([init_gib] if init_gib else [])
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [ctr(f"c{i}", a, PRINT_ENV_AND_SLEEP) for i, a in enumerate(amounts)],
    }
    init_ctrs = [ctr(f"init{i}", a, PRINT_ENV) for i, a in enumerate(inits)]
    if sidecar_gib:
        init_ctrs.append(ctr("sidecar", sidecar_gib, PRINT_ENV_AND_SLEEP, restartPolicy="Always"))
    if init_ctrs:
        spec["initContainers"] = init_ctrs
    annotations = {"gpushare.io/gpu-count": str(gpu_count)} if gpu_count != 1 else {}
    pod: Pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }
    if extra:
        pod["spec"].update(extra)
    return pod


def env_from_log(text: str) -> dict[str, str] | None:
    """The env a container printed; None until it printed all of it."""
    if ENV_END not in text:
        return None
    env: dict[str, str] = {}
    for line in text.split(ENV_END, 1)[0].splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            env[key] = value
    return env


class RealGpuNode:
    """A RealNode with our device plugin process; `stop()` leaves the RealNode running."""

    def __init__(self, cluster: GpuCluster, node: RealNode, sim_gpus: str) -> None:
        self.cluster = cluster
        self.node = node
        self.name = node.name
        self.sim_gpus = sim_gpus
        self.plugin: ManagedProcess | None = None
        self.plugin_starts = 0
        self.plugin_pod_resources: str | None = None  # set when the plugin was given another socket
        self.plugin_args: list[str] = []  # extra share-plugin flags, kept across restarts

    @property
    def units(self) -> int:
        return sum(n_bytes // 1024**3 for _model, n_bytes in parse_sim_gpus(self.sim_gpus))

    @property
    def image(self) -> str:
        """The test image imported into the node's containerd (built here, never pulled)."""
        return self.node.images.busybox.ref

    def pod(self, name: str, namespace: str, gib: int | list[int], **kw: Any) -> Pod:
        """`real_pod` with this node's test image."""
        return real_pod(name, namespace, gib, image=self.image, **kw)

    # -- the plugin ------------------------------------------------------------------------------

    def start_plugin(
        self, pod_resources_socket: str | None = None, timeout: float = 60.0, extra_args: list[str] | None = None
    ) -> None:
        """Start the plugin and wait until kubelet advertises its devices on the Node."""
        if extra_args is not None:
            self.plugin_args = list(extra_args)
        if self.cluster.plugin_kubeconfig is None:
            self.cluster.install_rbac()
        self.plugin_starts += 1
        self.plugin_pod_resources = pod_resources_socket
        self.plugin = ManagedProcess(
            f"plugin-{self.name}",
            plugin_argv(
                self.name,
                self.sim_gpus,
                self.node.device_plugin_dir,
                pod_resources_socket or self.node.pod_resources_socket,
                self.cluster.plugin_kubeconfig,
                extra=self.plugin_args,
            ),
            self.cluster.workdir / "logs" / f"plugin-{self.name}.log",
        )
        try:
            self.wait_advertised(timeout)
        except TimeoutError as exc:
            raise self.plugin.fail(f"{exc}\n--- node ---\n{self.node.logs()}") from exc

    def wait_advertised(self, timeout: float = 60.0) -> None:
        """This plugin process registered, kubelet's device manager holds its devices as healthy
        (PodResources GetAllocatableResources, no status lag), and the Node's allocatable says so too."""

        def ready() -> bool:
            if self.plugin is not None and not self.plugin.alive():
                raise self.plugin.fail("exited")
            if self.plugin is not None and self.registrations() == 0:
                return False
            if self.allocatable_devices() < self.units:
                return False
            node = self.cluster.admin.get_node(self.name)
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            published = ANN_NODE_GPUS in (node["metadata"].get("annotations") or {})
            return published and allocatable.get(RESOURCE_MEM) == str(self.units)

        wait_for(ready, timeout, f"kubelet on {self.name} to advertise {self.units} {RESOURCE_MEM}")

    def allocatable_devices(self) -> int:
        """Healthy devices of our resource in kubelet's device manager, asked over PodResources."""
        with grpc.insecure_channel(f"unix://{self.node.pod_resources_socket}") as channel:
            try:
                resp = prgrpc.PodResourcesListerStub(channel).GetAllocatableResources(
                    prpb.AllocatableResourcesRequest(), timeout=5
                )
            except grpc.RpcError:
                return 0
        return sum(len(d.device_ids) for d in resp.devices if d.resource_name == RESOURCE_MEM)

    def registrations(self) -> int:
        """How often the running plugin registered with kubelet (it logs each registration)."""
        if self.plugin is None:
            return 0
        text = self.plugin.log_path.read_text(errors="replace")
        return text.rsplit("### ", 1)[-1].count(" with kubelet (")

    def stop_plugin(self) -> None:
        if self.plugin is not None:
            self.plugin.stop()
            self.plugin = None

    def restart_plugin(self, pod_resources_socket: str | None = None) -> None:
        self.stop_plugin()
        self.start_plugin(pod_resources_socket)

    def stop(self) -> None:
        self.stop_plugin()

    @contextlib.contextmanager
    def running(self, extra_args: list[str] | None = None) -> Iterator[Self]:
        """The plugin started (`start_plugin`) for the with-block, stopped after it."""
        self.start_plugin(extra_args=extra_args)
        try:
            yield self
        finally:
            self.stop()

    def logs(self, lines: int = 60) -> str:
        plugin = self.plugin.log_tail(lines) if self.plugin else "<plugin not running>"
        return f"--- plugin-{self.name} ---\n{plugin}\n{self.node.logs()}"

    # -- what containers saw ---------------------------------------------------------------------

    def container_log(self, pod: Pod, container: str) -> str:
        return self.cluster.admin.pod_log(pod["metadata"]["namespace"], pod["metadata"]["name"], container)

    def env_of(self, pod: Pod, timeout: float = 60.0) -> dict[str, dict[str, str]]:
        """container -> the env it printed, for every container of the pod that asks gpu-mem."""
        request = pod_request(pod)
        out: dict[str, dict[str, str]] = {}
        for creq in request.containers if request else ():
            if creq.units == 0:
                continue
            out[creq.name] = wait_for(
                lambda c=creq.name: env_from_log(self.container_log(pod, c)),
                timeout,
                f"{pod_key(pod)} container {creq.name} to print its env",
                interval=0.5,
            )
        return out

    # -- invariants --------------------------------------------------------------------------------

    def pods(self) -> list[Pod]:
        return [p for p in self.cluster.admin.list_pods().items if (p.get("spec") or {}).get("nodeName") == self.name]

    def check_invariants(self, namespaces: Iterable[str] | None = None) -> dict[int, int]:
        """Every running container's env names its pod's GPU(s) with its own limit; no GPU is promised
        more than it has; `kubectl inspect gpushare` agrees with the API. Returns GPU index -> used."""
        pods = self.pods()
        wanted = set(namespaces) if namespaces is not None else None
        usage = node_usage(node_gpus(self.cluster.admin.get_node(self.name)), pods)
        assert not usage.problems, usage.problems
        for gpu in usage.gpus:
            assert gpu.used <= gpu.total, f"{self.name} GPU {gpu.index} over-committed: {gpu.used}/{gpu.total}"
        uuid_of = {g.index: g.uuid for g in usage.gpus}
        for pod in pods:
            if wanted is not None and pod["metadata"]["namespace"] not in wanted:
                continue
            if (pod.get("status") or {}).get("phase") != "Running":
                continue
            assignment = parse_assignment(pod_annotations(pod))
            request = pod_request(pod)
            assert assignment is not None and request is not None, f"{pod_key(pod)} runs without an assignment"
            assert assignment.gpu_uuids == tuple(uuid_of[i] for i in assignment.gpu_indices), pod_key(pod)
            for cname, env in self.env_of(pod).items():
                creq = next(c for c in request.containers if c.name == cname)
                assert env.get(ENV_VISIBLE_DEVICES, "").split(",") == list(assignment.gpu_uuids), (
                    f"{pod_key(pod)}/{cname}: saw {ENV_VISIBLE_DEVICES}={env.get(ENV_VISIBLE_DEVICES)!r}, "
                    f"annotations name {assignment.gpu_uuids}"
                )
                per_gpu_mib = creq.units * MemoryUnit.GiB.mib // request.gpu_count
                assert env.get(ENV_MEM_LIMIT_MIB) == str(per_gpu_mib), (pod_key(pod), cname, env)
        used = {g.index: g.used for g in usage.gpus}
        self.check_inspect_agrees(used)
        return used

    def check_inspect_agrees(self, used: dict[int, int]) -> None:
        from share_inspect.cli import main as inspect_main

        out, err = StringIO(), StringIO()
        code = inspect_main(
            ["--kubeconfig", str(self.cluster.cp.admin_kubeconfig), "-o", "json", self.name], stdout=out, stderr=err
        )
        assert code == 0, err.getvalue()
        report = json.loads(out.getvalue())
        node = next(n for n in report["nodes"] if n["name"] == self.name)
        assert {g["index"]: g["allocated"] for g in node["gpus"]} == used, (node["gpus"], used)


def delete_pods(cluster: GpuCluster, namespace: str, timeout: float = 120.0) -> None:
    """Delete every pod of the namespace and wait until the API has none left (kubelet confirmed)."""
    for pod in cluster.pods(namespace):
        try:
            cluster.admin.request(
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                query={"gracePeriodSeconds": 0},
            )
        except KubeError:
            pass
    deadline = time.monotonic() + timeout
    while cluster.pods(namespace) and time.monotonic() < deadline:
        time.sleep(0.5)
