"""Used memory, enforcement and device list strategies on the real node (upstream kubelet, containerd 2, runc).

The sim backend stands in for NVML only: it lists, as the GPU's compute process, the REAL host PID of a
running container (found with `ctr task ls`, containerd's own view). The plugin maps that PID through the
real `/proc/<pid>/cgroup` kubelet and containerd made, and the real pod status, to the pod and container;
its metrics endpoint is scraped over HTTP, its Event and node annotation read from the API server, and in
kill mode it really ends the container's process. Each device list strategy's Allocate response is read back
from kubelet's own device checkpoint (what kubelet hands the runtime), and the container starts with it:
with cdi-cri, containerd applies a CDI spec from the node's CDI directory.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.contract import EVENT_OVER_LIMIT
from share_core.contract import EVENT_OVER_LIMIT_KILLED
from share_core.gpus import node_gpus
from share_core.gpuusage import parse_gpu_usage
from share_inspect.report import build_report
from share_inspect.report import report_to_dict
from share_plugin.api import deviceplugin_v1beta1_pb2 as pb
from share_plugin.cgroups import status_container_id
from tests.controlplane.cluster import free_ports
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import Pod
from tests.controlplane.gpucluster import wait_for
from tests.controlplane.realgpunode import ENV_END
from tests.controlplane.realgpunode import RealGpuNode
from tests.controlplane.realgpunode import delete_pods
from tests.controlplane.realgpunode import env_from_log
from tests.node import RealNode
from tests.node.realnode import DEVICE_CHECKPOINT

pytestmark = [pytest.mark.integration, pytest.mark.realkubelet]

SIM_GPUS = "1xA100:80GiB,1xT4:16GiB"
MIB = 1024**2


class Monitored:
    def __init__(self, node: RealGpuNode, processes: Path, port: int) -> None:
        self.node, self.processes, self.port = node, processes, port

    def args(self, *more: str) -> list[str]:
        return [
            "--sim-processes-file",
            str(self.processes),
            "--metrics-port",
            str(self.port),
            "--monitor-interval",
            "0.5",
            "--usage-annotation-interval",
            "1",
            *more,
        ]

    def restart(self, *more: str) -> None:
        self.node.stop_plugin()
        self.node.start_plugin(extra_args=self.args(*more))

    def simulate(self, processes: list[dict[str, Any]]) -> None:
        tmp = self.processes.with_suffix(".tmp")
        tmp.write_text(json.dumps(processes))
        tmp.replace(self.processes)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }


@pytest.fixture(scope="module")
def mon(gpu_cluster: GpuCluster, real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    processes = tmp_path_factory.mktemp("monitor") / "processes.json"
    processes.write_text("[]")
    node = RealGpuNode(gpu_cluster, real_node, SIM_GPUS)
    m = Monitored(node, processes, free_ports(1)[0])
    with node.running(extra_args=m.args()):
        yield m


@pytest.fixture
def rns(mon: Monitored, ns: str) -> Iterator[str]:
    yield ns
    mon.simulate([])
    delete_pods(mon.node.cluster, ns)


def run_pod(mon: Monitored, ns: str, name: str, gib: int, command: list[str] | None = None) -> Pod:
    pod = mon.node.pod(name, ns, gib)
    if command is not None:
        pod["spec"]["containers"][0]["command"] = command
    mon.node.cluster.create_pod(pod)
    return mon.node.cluster.wait_phase(ns, name, ["Running"], timeout=120)


def container_pid(node: RealNode, pod: Pod) -> int:
    """The container's main process on the host, as containerd reports it (not through our cgroup code)."""
    cid = status_container_id(pod["status"]["containerStatuses"][0]["containerID"])
    for line in node.ctr("task", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise AssertionError(f"containerd lists no task {cid}")


def gpu_of(pod: Pod) -> tuple[int, str]:
    a = parse_assignment(pod_annotations(pod))
    assert a is not None
    return a.gpu_indices[0], a.gpu_uuids[0]


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def events(cluster: GpuCluster, ns: str, pod: str, reason: str) -> list[dict[str, Any]]:
    items = cluster.admin.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == pod and e["reason"] == reason]


def test_metrics_show_a_running_containers_memory(mon: Monitored, rns: str) -> None:
    cluster, node = mon.node.cluster, mon.node.node
    pod = run_pod(mon, rns, "measured", 4)
    index, uuid = gpu_of(pod)
    pid = container_pid(node, pod)
    # the container's real process "uses" 3000 MiB; this test process, in no pod, 100 MiB of the same GPU
    mon.simulate([{"pid": pid, "gpu": index, "usedMiB": 3000}, {"pid": os.getpid(), "gpu": index, "usedMiB": 100}])
    who = {"namespace": rns, "pod": "measured", "container": "c0", "node": mon.node.name}
    who |= {"gpu": str(index), "uuid": uuid}
    used = ("gpushare_container_gpu_memory_used_bytes", labels(**who))
    samples = wait_for(lambda: (s := mon.scrape()).get(used) and s, 30, "the container's series on /metrics")
    assert samples[used] == 3000 * MIB
    assert samples[("gpushare_container_gpu_memory_limit_bytes", labels(**who))] == 4 * 1024 * MIB
    assert samples[("gpushare_container_gpu_memory_over_limit", labels(**who))] == 0
    gpu = labels(node=mon.node.name, gpu=str(index), uuid=uuid)
    assert samples[("gpushare_gpu_memory_outside_pods_bytes", gpu)] == 100 * MIB
    assert samples[("gpushare_gpu_memory_used_bytes", gpu)] == 3100 * MIB

    # the node annotation, and kubectl inspect gpushare reading it
    def usage_of_pod() -> Any:
        raw = (cluster.admin.get_node(mon.node.name)["metadata"].get("annotations") or {}).get(ANN_NODE_GPU_USAGE)
        return parse_gpu_usage(raw) if raw and f"{rns}/measured" in raw else None

    published = wait_for(usage_of_pod, 30, "the usage annotation")
    assert published.pods[f"{rns}/measured"] == {index: 3000}
    report = report_to_dict(build_report(cluster.admin.list_nodes().items, cluster.admin.list_pods().items))
    row = next(n for n in report["nodes"] if n["name"] == mon.node.name)
    assert next(p for p in row["pods"] if p["name"] == "measured")["usedMiB"] == 3000
    # over the limit: one Warning Event on the pod (warn mode: the container keeps running)
    mon.simulate([{"pid": pid, "gpu": index, "usedMiB": 5000}])
    over = wait_for(lambda: events(cluster, rns, "measured", EVENT_OVER_LIMIT), 30, "the over-limit Event")
    assert over[0]["type"] == "Warning" and "--over-limit warn" in over[0]["message"]
    assert cluster.admin.get_pod(rns, "measured")["status"]["phase"] == "Running"


def test_kill_ends_only_the_offending_container(mon: Monitored, rns: str) -> None:
    cluster, node = mon.node.cluster, mon.node.node
    mon.restart("--over-limit", "kill", "--over-limit-grace", "1")
    try:
        offender = run_pod(mon, rns, "offender", 2)
        neighbour = run_pod(mon, rns, "neighbour", 2)
        o_index, _ = gpu_of(offender)
        n_index, _ = gpu_of(neighbour)
        mon.simulate(
            [
                {"pid": container_pid(node, offender), "gpu": o_index, "usedMiB": 4000},
                {"pid": container_pid(node, neighbour), "gpu": n_index, "usedMiB": 1000},
            ]
        )
        ended = cluster.wait_phase(rns, "offender", ["Failed"], timeout=60)
        state = ended["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 137  # SIGKILL
        killed = wait_for(lambda: events(cluster, rns, "offender", EVENT_OVER_LIMIT_KILLED), 30, "the kill Event")
        assert "no other container or pod was touched" in killed[0]["message"]
        assert cluster.admin.get_pod(rns, "neighbour")["status"]["phase"] == "Running"
    finally:
        mon.restart()


LIST_MOUNTS = [
    "sh",
    "-c",
    'env; for f in /var/run/nvidia-container-devices/*; do [ -c "$f" ] && echo GPUSHARE_TEST_MOUNT=$f; done; '
    f"echo {ENV_END}; exec sleep 86400",
]


def checkpointed_response(node: RealNode, pod: Pod) -> pb.ContainerAllocateResponse:
    """The Allocate response kubelet keeps for the container (its device checkpoint, what it gives the runtime)."""
    data = json.loads((node.device_plugin_dir / DEVICE_CHECKPOINT).read_text())["Data"]
    for entry in data["PodDeviceEntries"]:
        if entry["PodUID"] == pod["metadata"]["uid"] and entry["ContainerName"] == "c0":
            return pb.ContainerAllocateResponse.FromString(base64.b64decode(entry["AllocResp"]))
    raise AssertionError("kubelet checkpointed no response for the container")


def test_volume_mounts_reach_the_container(mon: Monitored, rns: str) -> None:
    mon.restart("--device-list-strategy", "volume-mounts")
    try:
        pod = run_pod(mon, rns, "mounts", 2, LIST_MOUNTS)
        _, uuid = gpu_of(pod)
        resp = checkpointed_response(mon.node.node, pod)
        assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == [
            (f"/var/run/nvidia-container-devices/{uuid}", "/dev/null", True)
        ]
        env = wait_for(lambda: env_from_log(mon.node.container_log(pod, "c0")), 60, "the container's env")
        # the device list is in the mount (a character device: /dev/null), not in the env a pod could forge
        assert env["GPUSHARE_TEST_MOUNT"] == f"/var/run/nvidia-container-devices/{uuid}"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
        assert env["GPUSHARE_MEM_LIMIT_MIB"] == "2048"
    finally:
        mon.restart()


CDI_MOUNT_DIR = "/run/gpushare-cdi"
LIST_CDI = [
    "sh",
    "-c",
    f'env; for f in {CDI_MOUNT_DIR}/*; do [ -f "$f" ] && echo GPUSHARE_TEST_MOUNT=$(cat "$f"); done; '
    f"echo {ENV_END}; exec sleep 86400",
]


def write_test_cdi_spec(node: RealNode, uuids: list[str]) -> Path:
    """A test-only CDI spec (format: the CDI spec, cdiVersion 0.6.0) in the node's CDI directory, in the
    place of the one `nvidia-ctk cdi generate` writes: each `nvidia.com/gpu=<uuid>` injects an env variable
    and a read-only bind mount of a file holding its UUID. Returns the spec file."""
    files = node.workdir / "cdi-files"
    files.mkdir(exist_ok=True)
    devices = []
    for uuid in uuids:
        (files / uuid).write_text(uuid)
        edits = {
            "env": [f"GPUSHARE_TEST_CDI_DEVICE={uuid}"],
            "mounts": [
                {"hostPath": str(files / uuid), "containerPath": f"{CDI_MOUNT_DIR}/{uuid}", "options": ["ro", "bind"]}
            ],
        }
        devices.append({"name": uuid, "containerEdits": edits})
    spec = node.cdi_dir / "gpushare-test-nvidia.json"
    spec.write_text(json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": devices}))
    return spec


def test_cdi_devices_are_injected_by_containerd(mon: Monitored, rns: str) -> None:
    """cdi-cri end to end: kubelet puts the plugin's CDI names in the CRI CreateContainer request
    (kuberuntime_container.go makeCDIDevices) and containerd 2 resolves them against the specs in its
    cdi_spec_dirs: the container sees the env and the mount the spec of its GPU defines, and no
    NVIDIA_VISIBLE_DEVICES (the device list is in the CDI name, not in an env a pod could forge)."""
    uuids = [g.uuid for g in node_gpus(mon.node.cluster.admin.get_node(mon.node.name))]
    assert len(uuids) == 2 and all(uuids)
    spec = write_test_cdi_spec(mon.node.node, uuids)
    mon.restart("--device-list-strategy", "cdi-cri")
    try:
        pod = run_pod(mon, rns, "cdi", 2, LIST_CDI)
        _, uuid = gpu_of(pod)
        resp = checkpointed_response(mon.node.node, pod)
        assert [d.name for d in resp.cdi_devices] == [f"nvidia.com/gpu={uuid}"]
        env = wait_for(lambda: env_from_log(mon.node.container_log(pod, "c0")), 60, "the container's env")
        assert env["GPUSHARE_TEST_CDI_DEVICE"] == uuid  # the spec's containerEdits.env
        assert env["GPUSHARE_TEST_MOUNT"] == uuid  # its mount: only this GPU's file
        assert "NVIDIA_VISIBLE_DEVICES" not in env and env["GPUSHARE_MEM_LIMIT_MIB"] == "2048"
    finally:
        spec.unlink(missing_ok=True)
        mon.restart()


def test_a_cdi_device_without_a_spec_fails_the_container(mon: Monitored, rns: str) -> None:
    """With CDI applied, a name no spec defines is an error, not a silent no-op (containerd 1.6 started
    such containers without the device): the container is not created and the pod says why."""
    mon.restart("--device-list-strategy", "cdi-cri")
    try:
        pod = mon.node.pod("nospec", rns, 2)
        mon.node.cluster.create_pod(pod)

        def waiting() -> dict[str, Any] | None:
            status = mon.node.cluster.admin.get_pod(rns, "nospec").get("status") or {}
            for c in status.get("containerStatuses") or []:
                w = (c.get("state") or {}).get("waiting") or {}
                if w.get("reason") == "CreateContainerError":
                    return w
            return None

        w = wait_for(waiting, 60, "CreateContainerError")
        _, uuid = gpu_of(mon.node.cluster.admin.get_pod(rns, "nospec"))
        assert "unresolvable CDI devices" in w["message"] and f"nvidia.com/gpu={uuid}" in w["message"]
    finally:
        mon.restart()


def test_envvar_is_the_default_response(mon: Monitored, rns: str) -> None:
    pod = run_pod(mon, rns, "envvar", 2)
    _, uuid = gpu_of(pod)
    resp = checkpointed_response(mon.node.node, pod)
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == uuid and not resp.mounts and not resp.cdi_devices
