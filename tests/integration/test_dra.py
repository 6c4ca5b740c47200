"""share-dra against the real kube-apiserver, kube-scheduler (its own DynamicResources plugin, no extender)
and kube-controller-manager's resourceclaim controller (claims from ResourceClaimTemplates, freed when their
pod goes).

No kubelet: each `share-dra` publishes its node's ResourceSlice itself (sim backend, GPUs of a few sizes) and
serves its DRA socket in a work dir, which the test calls as kubelet's DRA manager does
(pkg/kubelet/cm/dra/manager.go: NodePrepareResources with the claim's namespace, UID and name).

Gates: resource.k8s.io/v1 is served by default from 1.34; consumable capacity (DRAConsumableCapacity) is on by
default from 1.36, so on 1.34 and 1.35 the control plane is started with DRAConsumableCapacity=true. 1.33 has
no resource.k8s.io/v1: these tests are deselected there, with the reason printed (tests/integration/conftest.py);
on 1.34 the packing tests are, as its scheduler cannot place a claim on a node's second shared GPU once the
first is full (kubernetes/kubernetes#133705, fixed in 1.35).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_CDI_KIND
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_MEM_TOTAL_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import dra_cdi_spec_file
from share_core.kube import ApiServerClient
from share_core.kube import NotFound
from share_dra.api import dra_v1_pb2 as pb
from share_dra.api import dra_v1_pb2_grpc as pbgrpc
from share_dra.api import pluginregistration_v1_pb2 as regpb
from share_dra.api import pluginregistration_v1_pb2_grpc as reggrpc
from share_dra.claims import quantity_bytes
from share_node.backend.sim import sim_uuid
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_node
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.draworkload import device_class
from tests.controlplane.draworkload import memory_claim
from tests.controlplane.gpucluster import wait_for
from tests.unit.chart.helm import cluster_role_rules
from tests.unit.chart.helm import render_chart

pytestmark = [pytest.mark.integration, pytest.mark.k8s_min("1.34", "no resource.k8s.io/v1 before 1.34 (DRA GA)")]
# v1.34's scheduler (consumable capacity alpha) stops at a node's first shared device once it is full and never
# tries the next (kubernetes/kubernetes#133705, fixed in 1.35 by #133706): 15 GiB waited with 32 GiB free.
NEEDS_NEXT_DEVICE_FIX = pytest.mark.k8s_min("1.35", "kube-scheduler skips a full shared device's siblings (k8s#133705)")

RES = "/apis/resource.k8s.io/v1"
PLUGIN_USER = "gpushare-dra-plugin"
# Three nodes, four sizes of GPU: 16 + 32, 16 + 16, 24 GiB.
NODES = {"dra-0": "1xT4:16GiB,1xV100:32GiB", "dra-1": "2xT4:16GiB", "dra-2": "1xA10:24GiB"}
GIB = {"dra-0": [16, 32], "dra-1": [16, 16], "dra-2": [24]}
LARGEST_GIB = 32


def plugin_rules(version: tuple[int, int]) -> list[dict]:
    """What the chart grants the plugin (charts/gpushare, mode dra; share_dra/kubeapi.py's calls): the test
    runs the plugin with exactly these rules."""
    docs = render_chart(
        set_values={"mode": "dra", "dra.consumableCapacityGate": True}, kube_version=f"v{version[0]}.{version[1]}.0"
    )
    return cluster_role_rules(docs, "dra-plugin")


def grant_plugin_rbac(admin: ApiServerClient, version: tuple[int, int]) -> None:
    """Bind PLUGIN_USER to exactly the chart's rules for the plugin (`plugin_rules`)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    admin.request(
        "POST", f"{rbac}/clusterroles", body={"metadata": {"name": "gpushare-dra"}, "rules": plugin_rules(version)}
    )
    admin.request(
        "POST",
        f"{rbac}/clusterrolebindings",
        body={
            "metadata": {"name": "gpushare-dra"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpushare-dra"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PLUGIN_USER}],
        },
    )


def start_dra_control_plane(workdir: Path, k8s_bin_dir: Path) -> tuple[ControlPlane, tuple[int, int]]:
    """A control plane for DRA, started, and its version: DRAConsumableCapacity on before 1.36 (its default
    from then), the default kube-scheduler (its DynamicResources plugin) and the resourceclaim controller."""
    version = ControlPlane(workdir / "probe", k8s_bin_dir).version()
    gates = {"DRAConsumableCapacity": True} if version < (1, 36) else {}
    cp = ControlPlane(workdir / "controlplane", k8s_bin_dir, feature_gates=gates)
    cp.start()
    try:
        cp.start_scheduler("profiles: [{schedulerName: default-scheduler}]\n")
        cp.start_controller_manager(controllers=("resourceclaim-controller",))
    except BaseException:
        cp.stop()
        raise
    return cp, version


def claim_template(ns: str, gib: int) -> dict[str, Any]:
    """The ResourceClaimTemplate `gpu-<gib>gi`: the claim draworkload.memory_claim makes, one GPU, gib GiB of it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpu-{gib}gi", "namespace": ns},
        "spec": {"spec": memory_claim(ns, f"gpu-{gib}gi", gib)["spec"]},
    }


@dataclass
class DraNode:
    name: str
    workdir: Path
    process: ManagedProcess | None = None

    @property
    def registry(self) -> Path:
        return self.workdir / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.workdir / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    @property
    def health_file(self) -> Path:
        return self.workdir / "unhealthy"


class DraCluster:
    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp = cp
        self.workdir = workdir
        self.admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig))
        self.nodes = {n: DraNode(n, workdir / n) for n in NODES}

    def start_plugin(self, name: str, *extra: str) -> None:
        node = self.nodes[name]
        for d in (node.registry, node.plugin_dir, node.cdi_dir):
            d.mkdir(parents=True, exist_ok=True)
        node.process = ManagedProcess(
            f"share-dra-{name}",
            [
                sys.executable,
                "-m",
                "share_dra",
                f"--node-name={name}",
                f"--kubeconfig={self.cp.kubeconfig_for(PLUGIN_USER)}",
                "--backend=sim",
                f"--sim-gpus={NODES[name]}",
                f"--sim-health-file={node.health_file}",
                f"--plugins-registry-dir={node.registry}",
                f"--plugin-dir={node.plugin_dir}",
                f"--cdi-dir={node.cdi_dir}",
                f"--cdi-spec-dirs={node.cdi_dir}",
                "--log-level=DEBUG",
                *extra,
            ],
            self.cp.log_dir / f"share-dra-{name}.log",
        )
        wait_for(lambda: (node.plugin_dir / "dra.sock").exists(), 30, f"share-dra on {name} serving")

    def stop_plugin(self, name: str) -> None:
        node = self.nodes[name]
        if node.process is not None:
            rc = node.process.stop()
            node.process = None
            assert rc == 0, f"share-dra on {name} exited with {rc}"

    def slice_of(self, node: str) -> dict[str, Any] | None:
        items = self.admin.request(
            "GET", f"{RES}/resourceslices", query={"fieldSelector": f"spec.nodeName={node}"}
        ).get("items")
        assert len(items or []) <= 1, f"node {node} has {len(items)} slices"
        return items[0] if items else None

    def claims(self) -> list[dict[str, Any]]:
        return self.admin.request("GET", f"{RES}/resourceclaims").get("items") or []

    def pods(self, ns: str) -> list[dict[str, Any]]:
        return self.admin.request("GET", f"/api/v1/namespaces/{ns}/pods").get("items") or []

    def logs(self) -> str:
        return self.cp.logs(60)


def consumed_by_device(claims: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """MiB allocated on each (node pool, device) over every allocated claim of the cluster."""
    used: Counter[tuple[str, str]] = Counter()
    for c in claims:
        alloc = (c.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r["driver"] == DRA_DRIVER_NAME:
                mem = (r.get("consumedCapacity") or {}).get(DRA_CAPACITY_MEMORY)
                assert mem is not None, f"claim {c['metadata']['name']}: no consumedCapacity in {r}"
                used[(r["pool"], r["device"])] += quantity_bytes(mem) // 2**20
    return dict(used)


def capacity_mib() -> dict[tuple[str, str], int]:
    return {(n, f"gpu-{i}"): g * 1024 for n, sizes in GIB.items() for i, g in enumerate(sizes)}


def assert_never_overcommitted(cluster: DraCluster) -> dict[tuple[str, str], int]:
    used = consumed_by_device(cluster.claims())
    cap = capacity_mib()
    for dev, mib in used.items():
        assert dev in cap, f"allocated on {dev}, which no node offers"
        assert mib <= cap[dev], f"{dev}: {mib} MiB allocated of {cap[dev]} MiB"
    return used


def dra_pod(ns: str, name: str, gib: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"gib": str(gib)}},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": f"gpu-{gib}gi"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def create_pods(cluster: DraCluster, ns: str, sizes: list[int], prefix: str) -> list[str]:
    for gib in sorted(set(sizes)):
        try:
            cluster.admin.request("POST", f"{RES}/namespaces/{ns}/resourceclaimtemplates", body=claim_template(ns, gib))
        except Exception as exc:  # already there from an earlier wave
            if "AlreadyExists" not in str(exc) and "already exists" not in str(exc):
                raise
    names = []
    for i, gib in enumerate(sizes):
        name = f"{prefix}-{i}-{gib}gi"
        cluster.admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=dra_pod(ns, name, gib))
        names.append(name)
    return names


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it found no place for the pod, else None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def settle(cluster: DraCluster, ns: str, names: list[str], timeout: float = 120.0) -> dict[str, dict[str, Any]]:
    """Wait until every pod of `names` is bound or marked unschedulable, and the picture holds still for 3s."""
    last: list[Any] = [None, 0.0]

    def steady() -> dict[str, dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in cluster.pods(ns) if p["metadata"]["name"] in names}
        if len(pods) != len(names):
            return None
        if not all(p["spec"].get("nodeName") or unschedulable(p) is not None for p in pods.values()):
            return None
        shot = sorted((n, p["spec"].get("nodeName")) for n, p in pods.items())
        if shot != last[0]:
            last[0], last[1] = shot, time.monotonic()
            return None
        return pods if time.monotonic() - last[1] >= 3.0 else None

    return wait_for(steady, timeout, f"{len(names)} pods in {ns} bound or unschedulable, steady")


def pod_claim(cluster: DraCluster, ns: str, pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    assert statuses, f"pod {pod['metadata']['name']} has no resourceClaimStatuses"
    return cluster.admin.request("GET", f"{RES}/namespaces/{ns}/resourceclaims/{statuses[0]['resourceClaimName']}")


def free_mib(cluster: DraCluster) -> dict[tuple[str, str], int]:
    used = consumed_by_device(cluster.claims())
    return {d: cap - used.get(d, 0) for d, cap in capacity_mib().items()}


def delete_pods(cluster: DraCluster, ns: str, names: list[str]) -> None:
    for n in names:
        try:
            cluster.admin.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{n}", query={"gracePeriodSeconds": 0})
        except NotFound:
            pass


def no_claims_left(cluster: DraCluster, ns: str) -> bool:
    return not [
        c for c in cluster.claims() if c["metadata"]["namespace"] == ns and (c.get("status") or {}).get("allocation")
    ]


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def dra_cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraCluster]:
    workdir = tmp_path_factory.mktemp("dra")
    cp, version = start_dra_control_plane(workdir, k8s_bin_dir)
    cluster = DraCluster(cp, workdir)
    try:
        admin = cluster.admin
        grant_plugin_rbac(admin, version)
        admin.request("POST", f"{RES}/deviceclasses", body=device_class())
        for name in NODES:
            create_node(admin, name, {"cpu": "64", "memory": "256Gi", "pods": "110"})
            cluster.start_plugin(name)
        for name in NODES:
            wait_for(lambda n=name: cluster.slice_of(n), 30, f"ResourceSlice of {name}")
        yield cluster
    finally:
        for name in NODES:
            try:
                cluster.stop_plugin(name)
            except AssertionError:
                pass
        cp.stop()


@pytest.fixture
def dra_ns(dra_cluster: DraCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"dra-{request.node.name.replace('_', '-')[5:40].strip('-')}"
    dra_cluster.admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    # Waiting pods first, and gone, before the bound ones: deleting a bound pod frees capacity, and kube-scheduler
    # would then place a waiting pod that is being deleted, leaving its claim allocated to a pod that is gone.
    waiting = [p["metadata"]["name"] for p in dra_cluster.pods(name) if not p["spec"].get("nodeName")]
    delete_pods(dra_cluster, name, waiting)
    wait_for(
        lambda: not set(waiting) & {p["metadata"]["name"] for p in dra_cluster.pods(name)}, 60, "waiting pods gone"
    )
    delete_pods(dra_cluster, name, [p["metadata"]["name"] for p in dra_cluster.pods(name)])
    wait_for(lambda: no_claims_left(dra_cluster, name), 120, f"claims of {name} freed")


# ------------------------------------------------------------------------------------------------ tests


def test_slices_list_each_gpu_with_shared_memory(dra_cluster: DraCluster) -> None:
    for node, sizes in GIB.items():
        s = dra_cluster.slice_of(node)
        assert s is not None
        spec = s["spec"]
        assert spec["driver"] == DRA_DRIVER_NAME and spec["nodeName"] == node
        assert spec["pool"]["name"] == node and spec["pool"]["resourceSliceCount"] == 1
        devices = {d["name"]: d for d in spec["devices"]}
        assert sorted(devices) == [f"gpu-{i}" for i in range(len(sizes))]
        for i, gib in enumerate(sizes):
            d = devices[f"gpu-{i}"]
            # Served back by the API server: the gate is on (or set) and the fields survived validation.
            assert d["allowMultipleAllocations"] is True
            mem = d["capacity"][DRA_CAPACITY_MEMORY]
            assert quantity_bytes(mem["value"]) == gib * 2**30
            policy = mem["requestPolicy"]
            assert quantity_bytes(policy["default"]) == 2**30
            assert quantity_bytes(policy["validRange"]["min"]) == 2**30
            assert quantity_bytes(policy["validRange"]["step"]) == 2**30
            assert d["attributes"]["uuid"] == {"string": sim_uuid(node, i)}
            assert d["attributes"]["index"] == {"int": i}
            assert d["attributes"]["model"]["string"]


@NEEDS_NEXT_DEVICE_FIX
def test_claims_packed_never_over_a_gpu_and_freed_by_deleting_pods(dra_cluster: DraCluster, dra_ns: str) -> None:
    rng = random.Random(14)
    sizes = [rng.randint(1, 16) for _ in range(36)]  # ~306 GiB asked of 104 GiB: many must wait
    names = create_pods(dra_cluster, dra_ns, sizes, "w1")
    too_big = create_pods(dra_cluster, dra_ns, [LARGEST_GIB + 8], "big")
    pods = settle(dra_cluster, dra_ns, names + too_big)
    used = assert_never_overcommitted(dra_cluster)
    bound = [n for n in names if pods[n]["spec"].get("nodeName")]
    waiting = [n for n in names if not pods[n]["spec"].get("nodeName")]
    assert bound and waiting, f"expected some pods placed and some waiting: {len(bound)} bound, {len(waiting)} waiting"
    # Every bound pod's claim sits on a GPU of its node, with exactly what it asked for.
    for n in bound:
        claim = pod_claim(dra_cluster, dra_ns, pods[n])
        (r,) = claim["status"]["allocation"]["devices"]["results"]
        assert r["pool"] == pods[n]["spec"]["nodeName"]
        assert (
            quantity_bytes(r["consumedCapacity"][DRA_CAPACITY_MEMORY])
            == int(pods[n]["metadata"]["labels"]["gib"]) * 2**30
        )
    # Packed: a waiting pod fits on no GPU (the scheduler left nothing it could have used).
    free = {d: capacity_mib()[d] - used.get(d, 0) for d in capacity_mib()}
    for n in waiting:
        gib = int(pods[n]["metadata"]["labels"]["gib"])
        assert max(free.values()) < gib * 1024, f"{n} waits though a GPU has {max(free.values())} MiB free"
        assert "cannot allocate all claims" in (unschedulable(pods[n]) or "")
    # A claim larger than any GPU stays pending, and says so.
    big = pods[too_big[0]]
    assert not big["spec"].get("nodeName")
    msg = unschedulable(big) or ""
    assert f"0/{len(NODES)} nodes are available" in msg and "cannot allocate all claims" in msg, msg
    print(f"\nwave 1: {len(bound)} bound, {len(waiting)} waiting; used MiB per GPU {sorted(used.items())}")
    print(f"oversize pod: {msg}")

    # Deleting the bound pods frees their claims; the waiting pods then land, never over a GPU.
    delete_pods(dra_cluster, dra_ns, bound)
    wait_for(
        lambda: any(p["spec"].get("nodeName") for p in dra_cluster.pods(dra_ns)),
        120,
        "a waiting pod bound once the first wave's pods were deleted",
    )
    pods2 = settle(dra_cluster, dra_ns, waiting + too_big)
    used2 = assert_never_overcommitted(dra_cluster)
    bound2 = [n for n in waiting if pods2[n]["spec"].get("nodeName")]
    assert len(bound2) >= min(len(waiting), 4), f"only {len(bound2)} of {len(waiting)} waiting pods bound after"
    free2 = {d: capacity_mib()[d] - used2.get(d, 0) for d in capacity_mib()}
    for n in waiting:
        if not pods2[n]["spec"].get("nodeName"):
            assert max(free2.values()) < int(pods2[n]["metadata"]["labels"]["gib"]) * 1024
    assert not pods2[too_big[0]]["spec"].get("nodeName")
    print(f"wave 2: {len(bound2)} of {len(waiting)} formerly waiting pods bound; used {sorted(used2.items())}")


def _call(node: DraNode, verb: str, claim: dict[str, Any]) -> Any:
    """kubelet's Node<verb>Resources call for one claim, on the node's DRA socket."""
    meta = claim["metadata"]
    request = getattr(pb, f"Node{verb}ResourcesRequest")
    with grpc.insecure_channel(f"unix://{node.plugin_dir / 'dra.sock'}") as ch:
        return getattr(pbgrpc.DRAPluginStub(ch), f"Node{verb}Resources")(
            request(claims=[pb.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])]), timeout=10
        )


def _prepare(node: DraNode, claim: dict[str, Any]) -> pb.NodePrepareResourcesResponse:
    return _call(node, "Prepare", claim)


def _unprepare(node: DraNode, claim: dict[str, Any]) -> pb.NodeUnprepareResourcesResponse:
    return _call(node, "Unprepare", claim)


def test_prepare_writes_the_claims_cdi_spec_and_survives_a_restart(dra_cluster: DraCluster, dra_ns: str) -> None:
    names = create_pods(dra_cluster, dra_ns, [5], "prep")
    pod = settle(dra_cluster, dra_ns, names)[names[0]]
    node_name = pod["spec"]["nodeName"]
    assert node_name, f"pod not bound: {unschedulable(pod)}"
    node = dra_cluster.nodes[node_name]
    claim = pod_claim(dra_cluster, dra_ns, pod)
    uid = claim["metadata"]["uid"]
    (r,) = claim["status"]["allocation"]["devices"]["results"]
    index = int(r["device"].removeprefix("gpu-"))

    # Registration, as kubelet's plugin watcher asks it.
    with grpc.insecure_channel(f"unix://{node.registry / 'gpushare.io-reg.sock'}") as ch:
        info = reggrpc.RegistrationStub(ch).GetInfo(regpb.InfoRequest(), timeout=5)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRA_DRIVER_NAME, str(node.plugin_dir / "dra.sock"))
    assert list(info.supported_versions) == ["v1.DRAPlugin"]

    resp = _prepare(node, claim)
    result = resp.claims[uid]
    assert result.error == ""
    (dev,) = result.devices
    assert (dev.pool_name, dev.device_name, list(dev.request_names)) == (node_name, r["device"], ["gpu"])
    assert list(dev.cdi_device_ids) == [f"{DRA_CDI_KIND}={uid}-{r['device']}"]
    if r.get("shareID"):
        assert dev.share_id == r["shareID"]
    spec_path = node.cdi_dir / dra_cdi_spec_file(uid)
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == DRA_CDI_KIND
    (cdi_dev,) = spec["devices"]
    env = dict(e.split("=", 1) for e in cdi_dev["containerEdits"]["env"])
    assert env[ENV_MEM_LIMIT_MIB] == str(5 * 1024)
    assert env[ENV_MEM_TOTAL_MIB] == str(GIB[node_name][index] * 1024)
    assert env[ENV_VISIBLE_DEVICES] == sim_uuid(node_name, index)

    # Idempotent, across a plugin restart too: the same answer, the same one file.
    again = _prepare(node, claim).claims[uid]
    assert list(again.devices[0].cdi_device_ids) == list(dev.cdi_device_ids)
    dra_cluster.stop_plugin(node_name)
    dra_cluster.start_plugin(node_name)
    after = _prepare(node, claim).claims[uid]
    assert after.error == "" and list(after.devices[0].cdi_device_ids) == list(dev.cdi_device_ids)
    assert sorted(p.name for p in node.cdi_dir.iterdir()) == [spec_path.name]

    # Unprepare removes exactly that spec; a second Unprepare has nothing to do.
    (node.cdi_dir / "someone-else.json").write_text("{}")
    assert _unprepare(node, claim).claims[uid].error == ""
    assert not spec_path.exists() and (node.cdi_dir / "someone-else.json").exists()
    assert json.loads((node.plugin_dir / "checkpoint.json").read_text())["claims"] == {}
    assert _unprepare(node, claim).claims[uid].error == ""
    (node.cdi_dir / "someone-else.json").unlink()

    # A claim that is not ours to prepare gets an error kubelet can show.
    bogus = {"metadata": {"namespace": dra_ns, "name": "no-such-claim", "uid": "0000"}}
    err = _prepare(node, bogus).claims["0000"].error
    assert "no-such-claim" in err and "gone" in err, err


@NEEDS_NEXT_DEVICE_FIX
def test_unhealthy_gpu_gets_nothing_new(dra_cluster: DraCluster, dra_ns: str) -> None:
    # dra-0's V100 (gpu-1, 32 GiB) is the only GPU where 30 GiB fits.
    node = dra_cluster.nodes["dra-0"]
    gen = dra_cluster.slice_of("dra-0")["spec"]["pool"]["generation"]
    node.health_file.write_text("1\n")
    try:
        wait_for(
            lambda: [d["name"] for d in dra_cluster.slice_of("dra-0")["spec"]["devices"]] == ["gpu-0"],
            30,
            "dra-0's gpu-1 withdrawn from its slice",
        )
        assert dra_cluster.slice_of("dra-0")["spec"]["pool"]["generation"] > gen
        names = create_pods(dra_cluster, dra_ns, [30, *([4] * 10)], "sick")
        pods = settle(dra_cluster, dra_ns, names)
        used = consumed_by_device(dra_cluster.claims())
        assert used.get(("dra-0", "gpu-1"), 0) == 0, "a claim was allocated on the unhealthy GPU"
        assert not pods[names[0]]["spec"].get("nodeName"), "30 GiB can only fit on the unhealthy GPU"
        assert "cannot allocate all claims" in (unschedulable(pods[names[0]]) or "")
        assert all(pods[n]["spec"].get("nodeName") for n in names[1:])
    finally:
        node.health_file.write_text("")
    # Healthy again: it is listed again and the waiting claim lands there.
    wait_for(lambda: len(dra_cluster.slice_of("dra-0")["spec"]["devices"]) == 2, 30, "dra-0's gpu-1 listed again")
    wait_for(
        lambda: (
            dict((p["metadata"]["name"], p["spec"].get("nodeName")) for p in dra_cluster.pods(dra_ns)).get(names[0])
            == "dra-0"
        ),
        120,
        "the 30 GiB pod bound to dra-0 once its V100 is healthy",
    )
    assert consumed_by_device(dra_cluster.claims()).get(("dra-0", "gpu-1")) == 30 * 1024
    assert_never_overcommitted(dra_cluster)


@NEEDS_NEXT_DEVICE_FIX
@pytest.mark.k8s_min("1.36", "device taints need DRADeviceTaints, off before 1.36")
def test_unhealthy_gpu_tainted_gets_nothing_new(dra_cluster: DraCluster, dra_ns: str) -> None:
    """`--unhealthy=taint`: the GPU stays listed, tainted NoSchedule, and kube-scheduler puts nothing on it."""
    node = dra_cluster.nodes["dra-0"]
    dra_cluster.stop_plugin("dra-0")
    dra_cluster.start_plugin("dra-0", "--unhealthy=taint")
    names: list[str] = []
    try:
        node.health_file.write_text("1\n")

        def tainted() -> bool:
            devices = {d["name"]: d for d in dra_cluster.slice_of("dra-0")["spec"]["devices"]}
            return sorted(devices) == ["gpu-0", "gpu-1"] and [
                (t["key"], t["effect"]) for t in devices["gpu-1"].get("taints") or []
            ] == [("gpushare.io/unhealthy", "NoSchedule")]

        wait_for(tainted, 30, "dra-0's gpu-1 tainted NoSchedule in its slice")
        names = create_pods(dra_cluster, dra_ns, [30, *([4] * 10)], "taint")
        pods = settle(dra_cluster, dra_ns, names)
        assert consumed_by_device(dra_cluster.claims()).get(("dra-0", "gpu-1"), 0) == 0
        assert not pods[names[0]]["spec"].get("nodeName"), "30 GiB fits only on the tainted GPU"
        assert all(pods[n]["spec"].get("nodeName") for n in names[1:])
        node.health_file.write_text("")
        wait_for(
            lambda: not any(d.get("taints") for d in dra_cluster.slice_of("dra-0")["spec"]["devices"]),
            30,
            "the taint lifted",
        )
        wait_for(
            lambda: (
                {p["metadata"]["name"]: p["spec"].get("nodeName") for p in dra_cluster.pods(dra_ns)}.get(names[0])
                == "dra-0"
            ),
            120,
            "the 30 GiB pod bound to dra-0 once its V100 is healthy",
        )
        assert_never_overcommitted(dra_cluster)
    finally:
        node.health_file.write_text("")
        dra_cluster.stop_plugin("dra-0")
        dra_cluster.start_plugin("dra-0")
