"""One workload, both modes, on the same nodes: the device plugin with our extender, then DRA (share-dra's
ResourceSlices, kube-scheduler's own allocator). Each pod must get exactly its size, on a GPU its node has,
and no GPU may be promised more than its memory, in either mode. Then DRA with the policy (the extender
with --dra chooses the node, share-dra --policy lists each node's GPUs in the policy's order so the
allocator's first fit takes the policy's GPU): every pod lands on the same node and GPU as in
device-plugin mode.

Device-plugin mode runs the session's GpuCluster (our plugin and a kubelet stand-in per node, the extender,
kube-scheduler); DRA mode runs one `share-dra` per node (sim backend, the same GPUs: sim UUIDs derive from
node and index) and a second kube-scheduler with a profile of its own. The modes run one after the other:
neither sees the other's allocations, as on a real cluster where a node is in one mode.
"""

from __future__ import annotations

import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.contract import DRA_ATTR_UUID
from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.kube import KubeError
from share_dra.claims import quantity_bytes
from share_node.backend.sim import sim_uuid
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import make_policy
from share_placement.draorder import device_order
from share_scheduler.config import scheduler_config
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import free_port
from tests.controlplane.draworkload import RESOURCE_API
from tests.controlplane.draworkload import claim_pod
from tests.controlplane.draworkload import device_class
from tests.controlplane.draworkload import memory_claim
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import pod_spec
from tests.controlplane.gpucluster import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.k8s_min("1.36", "consumable capacity (DRAConsumableCapacity) is on by default from 1.36"),
]

GPUS = {"a": "1xT4:16GiB,1xV100:32GiB", "b": "2xT4:16GiB", "c": "1xA10:24GiB"}
MEMORY_GIB = {"a": [16, 32], "b": [16, 16], "c": [24]}
SIZES = [8, 4, 12, 2, 16, 6, 3, 10, 1, 5, 7, 9]  # 83 of the 104 GiB
DRA_SCHEDULER = "gpushare-dra-side-by-side"
DRA_POLICY_SCHEDULER = "gpushare-dra-policy-side-by-side"


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status == 200
    except OSError:
        return False


def affinity(nodes: list[str]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def bound_node(cluster: GpuCluster, ns: str, name: str) -> str:
    def check() -> str | None:
        pod = cluster.admin.get_pod(ns, name)
        conditions = (pod.get("status") or {}).get("conditions") or []
        for c in conditions:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                raise AssertionError(f"{ns}/{name} unschedulable: {c.get('message')}")
        return (pod.get("spec") or {}).get("nodeName") or None

    return wait_for(check, 60, f"{ns}/{name} bound")


def run_dra_plugins(gpu_cluster: GpuCluster, ns: str, tmp_path: Path, extra: list[str]) -> Iterator[dict[str, str]]:
    """The three nodes, in device-plugin mode (GpuCluster) and published by share-dra at once."""
    nodes = {suffix: f"{ns}-{suffix}" for suffix in GPUS}
    for suffix, name in nodes.items():
        gpu_cluster.add_node(name, GPUS[suffix])
    admin = gpu_cluster.admin
    try:
        admin.request("POST", f"{RESOURCE_API}/deviceclasses", body=device_class())
    except KubeError as exc:
        if exc.status != 409:  # another test made it already
            raise
    procs = []
    try:
        for suffix, name in nodes.items():
            work = tmp_path / name
            for d in ("registry", "plugins", "cdi"):
                (work / d).mkdir(parents=True)
            argv = [sys.executable, "-m", "share_dra", f"--node-name={name}",
                    f"--kubeconfig={gpu_cluster.cp.admin_kubeconfig}", "--backend=sim", f"--sim-gpus={GPUS[suffix]}",
                    f"--plugins-registry-dir={work / 'registry'}", f"--plugin-dir={work / 'plugins'}",
                    f"--cdi-dir={work / 'cdi'}", f"--cdi-spec-dirs={work / 'cdi'}", *extra]  # fmt: skip
            procs.append(ManagedProcess(f"share-dra-{name}", argv, tmp_path / f"share-dra-{name}.log"))
        for name in nodes.values():
            wait_for(lambda n=name: admin.request("GET", f"{RESOURCE_API}/resourceslices",
                     query={"fieldSelector": f"spec.nodeName={n}"})["items"], 30, f"slice of {name}")  # fmt: skip
        yield nodes
    finally:
        for proc in procs:
            proc.stop()
        for name in nodes.values():
            admin.request("DELETE", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={name}"})


@pytest.fixture
def dra_plugins(gpu_cluster: GpuCluster, ns: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """share-dra as DRA mode with kube-scheduler's placement runs it: GPUs in index order."""
    yield from run_dra_plugins(gpu_cluster, ns, tmp_path, [])


@pytest.fixture
def ordered_dra_plugins(gpu_cluster: GpuCluster, ns: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """share-dra as DRA mode with the policy runs it: GPUs in the session extender's policy's order."""
    yield from run_dra_plugins(gpu_cluster, ns, tmp_path, [f"--policy={gpu_cluster.policy}"])


def device_plugin_placements(gpu_cluster: GpuCluster, ns: str, nodes: list[str]) -> dict[str, tuple[str, int, int]]:
    """Device-plugin mode: nvidia.com/gpu-mem limits, the extender picks and records the GPU; then the pods go."""
    admin = gpu_cluster.admin
    memory = {(n, i): gib for n, sizes in zip(nodes, MEMORY_GIB.values(), strict=True) for i, gib in enumerate(sizes)}
    uuid_index = {sim_uuid(node, i): (node, i) for node, i in memory}
    plugin_mode: dict[str, tuple[str, int, int]] = {}
    for k, gib in enumerate(SIZES):
        pod = pod_spec(f"dp-{k}", gib, ns)
        pod["spec"]["affinity"] = affinity(nodes)
        gpu_cluster.create_pod(pod)
        node = bound_node(gpu_cluster, ns, f"dp-{k}")
        got = parse_assignment(pod_annotations(admin.get_pod(ns, f"dp-{k}")))
        assert got is not None and len(got.gpu_uuids) == 1, got
        assert uuid_index[got.gpu_uuids[0]] == (node, got.gpu_indices[0]), f"dp-{k}: {got} is not a GPU of {node}"
        plugin_mode[f"pod-{k}"] = (node, got.gpu_indices[0], got.total)
    gpu_cluster.wait_all_running(ns, len(SIZES))
    gpu_cluster.check_invariants()  # env matches annotations; no GPU over its memory
    for k in range(len(SIZES)):
        admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/dp-{k}", query={"gracePeriodSeconds": 0})
    wait_for(lambda: not [p for p in gpu_cluster.pods(ns) if p["metadata"]["name"].startswith("dp-")], 60, "dp gone")
    return plugin_mode


def dra_placements(
    gpu_cluster: GpuCluster, ns: str, nodes: list[str], scheduler: str, prefix: str, settle: Any = None
) -> dict[str, tuple[str, int, int]]:
    """The same sizes as claims, one pod at a time through `scheduler`; `settle(placed)` runs after each."""
    admin = gpu_cluster.admin
    slices = admin.request("GET", f"{RESOURCE_API}/resourceslices")["items"]
    device_uuid = {
        (s["spec"]["nodeName"], d["name"]): d["attributes"][DRA_ATTR_UUID]["string"]
        for s in slices
        for d in s["spec"].get("devices") or []
    }
    memory = {(n, i): gib for n, sizes in zip(nodes, MEMORY_GIB.values(), strict=True) for i, gib in enumerate(sizes)}
    uuid_index = {sim_uuid(node, i): (node, i) for node, i in memory}
    placed: dict[str, tuple[str, int, int]] = {}
    for k, gib in enumerate(SIZES):
        name = f"{prefix}-{k}"
        admin.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", body=memory_claim(ns, name, gib))
        pod = claim_pod(ns, name, name)
        pod["spec"].update(schedulerName=scheduler, affinity=affinity(nodes))
        admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)
        node = bound_node(gpu_cluster, ns, name)
        claim = admin.request("GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{name}")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 1, results
        r = results[0]
        assert r["pool"] == node, f"{name} bound to {node}, its device is in pool {r['pool']}"
        gpu_node, index = uuid_index[device_uuid[(node, r["device"])]]
        assert gpu_node == node
        consumed = quantity_bytes(r["consumedCapacity"][DRA_CAPACITY_MEMORY]) >> 30
        placed[f"pod-{k}"] = (node, index, consumed)
        if settle is not None:
            settle(placed)
    return placed


def test_same_workload_same_sizes_on_valid_gpus_in_both_modes(
    gpu_cluster: GpuCluster, ns: str, dra_plugins: dict[str, str]
) -> None:
    nodes = list(dra_plugins.values())
    memory = {(n, i): gib for n, sizes in zip(nodes, MEMORY_GIB.values(), strict=True) for i, gib in enumerate(sizes)}
    plugin_mode = device_plugin_placements(gpu_cluster, ns, nodes)

    # DRA mode: the same sizes as claims, kube-scheduler's DynamicResources plugin picks the device.
    sched = gpu_cluster.cp.launch_scheduler(f"profiles: [{{schedulerName: {DRA_SCHEDULER}}}]\n", "dra-scheduler")
    try:
        dra_mode = dra_placements(gpu_cluster, ns, nodes, DRA_SCHEDULER, "dra")
    finally:
        sched.process.stop()

    # Same pods, same sizes (each its request), never over a GPU, in both modes.
    assert set(plugin_mode) == set(dra_mode) == {f"pod-{k}" for k in range(len(SIZES))}
    for mode, placed in (("device plugin", plugin_mode), ("dra", dra_mode)):
        assert_valid(mode, placed, memory)


def assert_valid(mode: str, placed: dict[str, tuple[str, int, int]], memory: dict[tuple[str, int], int]) -> None:
    assert [placed[f"pod-{k}"][2] for k in range(len(SIZES))] == SIZES, (mode, placed)
    used: Counter[tuple[str, int]] = Counter()
    for node, index, gib in placed.values():
        used[(node, index)] += gib
    over = {gpu: (u, memory[gpu]) for gpu, u in used.items() if u > memory[gpu]}
    assert not over, f"{mode}: GPUs over their memory: {over}"


def test_dra_with_the_policy_lands_where_the_device_plugin_mode_does(
    gpu_cluster: GpuCluster, ns: str, ordered_dra_plugins: dict[str, str], tmp_path: Path
) -> None:
    nodes = list(ordered_dra_plugins.values())
    memory = {(n, i): gib for n, sizes in zip(nodes, MEMORY_GIB.values(), strict=True) for i, gib in enumerate(sizes)}
    plugin_mode = device_plugin_placements(gpu_cluster, ns, nodes)
    admin = gpu_cluster.admin

    # DRA mode with the policy, as the chart runs it: the extender with --dra (the same policy as the
    # session's), kube-scheduler's gpushare-scheduler profile calling it to filter only.
    port = free_port()
    extender = ManagedProcess("extender-dra", [sys.executable, "-m", "share_scheduler.cli", "--port", str(port),
                              "--bind-address", "127.0.0.1", "--kubeconfig", str(gpu_cluster.cp.admin_kubeconfig),
                              "--policy", gpu_cluster.policy, "--dra"], tmp_path / "extender-dra.log")  # fmt: skip
    sched = None
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "the DRA extender ready")
        config = scheduler_config(f"http://127.0.0.1:{port}/gpushare-scheduler", leader_elect=False,
                                  scheduler_name=DRA_POLICY_SCHEDULER, bind=False)  # fmt: skip
        sched = gpu_cluster.cp.launch_scheduler(yaml.safe_dump(config), "dra-policy-scheduler")

        def orders_settled(placed: dict[str, tuple[str, int, int]]) -> None:
            """share-dra rewrites a node's slice in the policy's order once its watch shows the claim: wait for
            that before the next pod (as pods a second apart would), so each pod meets the order it would."""
            used: Counter[tuple[str, int]] = Counter()
            for node, index, gib in placed.values():
                used[(node, index)] += gib
            policy = make_policy(gpu_cluster.policy)
            want = {}
            for node, sizes in zip(nodes, MEMORY_GIB.values(), strict=True):
                state = NodeState(node, tuple(GpuSlot(i, "T4", g, g - used[(node, i)]) for i, g in enumerate(sizes)))
                want[node] = [f"gpu-{i}" for i in device_order(policy, state, Demand(1))]

            seen: dict[str, list[str]] = {}

            def listed() -> bool:
                seen.clear()
                seen.update({s["spec"]["nodeName"]: [d["name"] for d in s["spec"]["devices"]]
                             for s in admin.request("GET", f"{RESOURCE_API}/resourceslices")["items"]})  # fmt: skip
                return all(seen.get(n) == want[n] for n in nodes)

            try:
                wait_for(listed, 30, "share-dra's slices in the policy's order")
            except TimeoutError as exc:
                lists = f"share-dra lists {seen}, {gpu_cluster.policy} wants {want}"
                raise AssertionError(f"after {placed}: {lists}") from exc

        dra_mode = dra_placements(gpu_cluster, ns, nodes, DRA_POLICY_SCHEDULER, "pol", orders_settled)
    finally:
        if sched is not None:
            sched.process.stop()
        extender.stop()
    assert_valid("dra with the policy", dra_mode, memory)
    assert dra_mode == plugin_mode, {
        k: (plugin_mode[k], dra_mode[k]) for k in plugin_mode if plugin_mode[k] != dra_mode[k]
    }
