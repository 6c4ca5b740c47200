"""share-dra on the real kubelet: a ResourceClaim scheduled, prepared and injected, end to end.

A control plane of its own (kube-apiserver, the default kube-scheduler with its DynamicResources plugin, the
kube-controller-manager's resourceclaim controller), a real node (tests/node: upstream kubelet, containerd v2,
Debian's runc) and `share-dra` (sim backend) against that kubelet, exactly as the DaemonSet runs it: its
registration socket in kubelet's plugin watcher directory (`<root-dir>/plugins_registry`), its DRA socket in
`<root-dir>/plugins/gpushare.io/`, its per-claim CDI specs in the directory containerd reads (`cdi_spec_dirs`).

What is proven, with no stand-in: the real kube-scheduler allocates the claim from share-dra's ResourceSlice;
kubelet calls share-dra's NodePrepareResources (the claim's CDI spec appears) and hands the CDI names to
containerd, which applies the spec's env to the container (the pod itself sets none); what the container
printed matches the claim's allocation; deleting the pod makes kubelet call NodeUnprepareResources (the spec
file goes). Gates as tests/integration/test_dra.py: DRAConsumableCapacity on 1.34 and 1.35 (default from
1.36), for the control plane and the kubelet; deselected on 1.33 (no resource.k8s.io/v1), with the reason
printed (tests/integration/conftest.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import ENV_MEM_LIMIT_MIB
from share_core.contract import ENV_MEM_TOTAL_MIB
from share_core.contract import ENV_VISIBLE_DEVICES
from share_core.contract import dra_cdi_spec_file
from share_core.kube import NotFound
from share_dra.claims import quantity_bytes
from share_node.backend.sim import SimBackend
from share_node.backend.simlimits import read_state
from share_node.hardlimit import pod_uid_of_dir
from tests.controlplane import ControlPlane
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.draworkload import device_class
from tests.controlplane.draworkload import memory_claim
from tests.controlplane.gpucluster import wait_for
from tests.controlplane.realgpunode import PRINT_ENV_AND_SLEEP
from tests.controlplane.realgpunode import env_from_log
from tests.integration.test_dra import PLUGIN_USER
from tests.integration.test_dra import RES
from tests.integration.test_dra import grant_plugin_rbac
from tests.integration.test_dra import start_dra_control_plane
from tests.node import RealNode
from tests.node.host import hard_limit_cgroup_tree

pytestmark = [
    pytest.mark.integration,
    pytest.mark.realkubelet,
    pytest.mark.k8s_min("1.34", "no resource.k8s.io/v1 before 1.34 (DRA GA)"),
]

NODE = "dra-realnode-0"
SIM_GPUS = "1xA100:80GiB,1xT4:16GiB"
NS = "dra-real"


@dataclass
class DraRealNode:
    cp: ControlPlane
    node: RealNode
    plugin: ManagedProcess
    limits_file: str = ""  # the NVML stand-in's state (--hard-limit)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self.node.admin.request(method, path, **kw)

    def logs(self) -> str:
        """Control plane, kubelet, containerd and share-dra log tails (attached to a failed test by conftest)."""
        return f"{self.cp.logs(60)}\n{self.node.logs(80)}\n--- share-dra ---\n{self.plugin.log_tail(80)}"


@pytest.fixture(scope="module")
def dra_real(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraRealNode]:
    workdir = tmp_path_factory.mktemp("dra-realnode")
    node: RealNode | None = None
    plugin: ManagedProcess | None = None
    cp, version = start_dra_control_plane(workdir, k8s_bin_dir)
    try:
        node = RealNode(cp, NODE, workdir / "node").start()  # kubelet runs with the control plane's gates
        grant_plugin_rbac(node.admin, version)
        node.admin.request("POST", f"{RES}/deviceclasses", body=device_class())
        node.admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        plugin_dir = node.plugins_dir / DRA_DRIVER_NAME
        plugin_dir.mkdir(parents=True, exist_ok=True)
        # --hard-limit cgroup with the NVML stand-in, on the node's own cgroup tree (the hybrid cgroup v2
        # hierarchy where there is one: tests/integration/test_realkubelet_hard_limit.py says why)
        cgroup_root, accept_v1 = hard_limit_cgroup_tree(node.cgroup_root)
        limits_file = workdir / "memory-limits.json"
        plugin = ManagedProcess(
            "share-dra",
            [
                sys.executable,
                "-m",
                "share_dra",
                f"--node-name={NODE}",
                f"--kubeconfig={cp.kubeconfig_for(PLUGIN_USER)}",
                "--backend=sim",
                f"--sim-gpus={SIM_GPUS}",
                f"--plugins-registry-dir={node.plugins_registry_dir}",
                f"--plugin-dir={plugin_dir}",
                f"--cdi-dir={node.cdi_dir}",
                f"--cdi-spec-dirs={node.cdi_dir}",
                "--hard-limit=cgroup",
                f"--cgroup-root={cgroup_root}",
                f"--sim-memory-limits-file={limits_file}",
                *accept_v1,
                "--log-level=DEBUG",
            ],
            cp.log_dir / "share-dra.log",
        )
        env = DraRealNode(cp, node, plugin, str(limits_file))

        def published() -> bool:
            items = node.admin.request(
                "GET", f"{RES}/resourceslices", query={"fieldSelector": f"spec.nodeName={NODE}"}
            ).get("items")
            return bool(items)

        wait_for(published, 60, "share-dra's ResourceSlice")
        # kubelet's plugin manager found the registration socket, called GetInfo, validated the driver and
        # told it so (NotifyRegistrationStatus; pkg/kubelet/pluginmanager, pkg/kubelet/cm/dra/plugin).
        log = cp.log_dir / "share-dra.log"
        wait_for(
            lambda: f"kubelet registered driver {DRA_DRIVER_NAME}" in log.read_text(errors="replace"),
            60,
            "kubelet to register the gpushare.io DRA plugin",
        )
        yield env
    finally:
        if plugin is not None:
            plugin.stop()
        if node is not None:
            node.stop()
        cp.stop()


def pod(name: str, claim_name: str, image: str, containers: int = 1) -> dict[str, Any]:
    """A pod whose containers all use the claim and print their env; the pod sets no env of its own."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": PRINT_ENV_AND_SLEEP,
                    "resources": {"claims": [{"name": "gpu"}]},
                }
                for i in range(containers)
            ],
        },
    }


def run(env: DraRealNode, name: str, gib: int, containers: int = 1) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create the claim and its pod; wait until the pod runs. Returns (pod, claim)."""
    env.request("POST", f"{RES}/namespaces/{NS}/resourceclaims", body=memory_claim(NS, name, gib))
    env.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod(name, name, env.node.images.busybox.ref, containers))

    def running() -> dict[str, Any] | None:
        p = env.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        phase = (p.get("status") or {}).get("phase")
        assert phase not in ("Failed", "Succeeded"), f"pod {name} ended: {p.get('status')}"
        return p if phase == "Running" else None

    p = wait_for(running, 120, f"pod {name} Running")
    return p, env.request("GET", f"{RES}/namespaces/{NS}/resourceclaims/{name}")


def delete(env: DraRealNode, name: str) -> None:
    """Delete the pod and wait until it is gone (kubelet confirmed), then the claim."""
    env.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", query={"gracePeriodSeconds": 0})

    def gone() -> bool:
        try:
            env.request("GET", f"/api/v1/namespaces/{NS}/pods/{name}")
        except NotFound:
            return True
        return False

    wait_for(gone, 60, f"pod {name} deleted")
    env.request("DELETE", f"{RES}/namespaces/{NS}/resourceclaims/{name}")


def printed_env(env: DraRealNode, name: str, container: str) -> dict[str, str]:
    return wait_for(
        lambda: env_from_log(env.node.pod_log(NS, name, container)), 60, f"{name}/{container} to print its env"
    )


def sim_gpus() -> dict[int, Any]:
    """The sim backend's GPUs (index -> Gpu) as share-dra sees them: UUIDs and sizes to check the env against."""
    return {g.index: g for g in SimBackend(SIM_GPUS, NODE).gpus()}


def allocation(claim_obj: dict[str, Any]) -> tuple[str, int]:
    """(device, consumed MiB) of a claim with one allocated device."""
    results = claim_obj["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    r = results[0]
    assert r["driver"] == DRA_DRIVER_NAME and r["pool"] == NODE
    return r["device"], quantity_bytes(r["consumedCapacity"][DRA_CAPACITY_MEMORY]) // 2**20


def test_kubelet_prepares_the_claim_and_the_container_gets_its_allocation(dra_real: DraRealNode) -> None:
    p, c = run(dra_real, "one", 4)
    assert p["spec"]["nodeName"] == NODE  # bound by the real kube-scheduler's DynamicResources plugin
    device, mib = allocation(c)
    assert mib == 4096
    gpu = sim_gpus()[int(device.removeprefix("gpu-"))]
    # NodePrepareResources ran: the claim's CDI spec is in the directory containerd reads
    spec = dra_real.node.cdi_dir / dra_cdi_spec_file(c["metadata"]["uid"])
    assert spec.is_file(), sorted(p.name for p in dra_real.node.cdi_dir.iterdir())
    env = printed_env(dra_real, "one", "c0")
    # containerd applied the spec's containerEdits.env (the pod sets none)
    assert env[ENV_MEM_LIMIT_MIB] == "4096"
    assert env[ENV_VISIBLE_DEVICES] == gpu.uuid
    assert env[ENV_MEM_TOTAL_MIB] == str(gpu.memory_mib)
    delete(dra_real, "one")
    # kubelet called NodeUnprepareResources for the pod's last claim user: the spec is gone
    wait_for(lambda: not spec.exists(), 60, "the claim's CDI spec to be removed (NodeUnprepareResources)")


def test_two_containers_share_one_claim(dra_real: DraRealNode) -> None:
    _, c = run(dra_real, "shared", 2, containers=2)
    device, mib = allocation(c)
    assert mib == 2048
    gpu = sim_gpus()[int(device.removeprefix("gpu-"))]
    envs = [printed_env(dra_real, "shared", f"c{i}") for i in range(2)]
    for env in envs:
        assert env[ENV_MEM_LIMIT_MIB] == "2048" and env[ENV_VISIBLE_DEVICES] == gpu.uuid
    spec = dra_real.node.cdi_dir / dra_cdi_spec_file(c["metadata"]["uid"])
    assert spec.is_file()
    delete(dra_real, "shared")
    wait_for(lambda: not spec.exists(), 60, "the shared claim's CDI spec to be removed")


def test_hard_limit_dra_pod_cgroup_limited_before_anything_of_the_pod_runs(dra_real: DraRealNode) -> None:
    """--hard-limit: NodePrepareResources (kuberuntime SyncPod step 4, before the sandbox) limits the pod's cgroup
    to its claim's consumed memory; NodeUnprepareResources (after every container stopped, before kubelet
    removes the cgroup) clears it, in that order."""
    p, c = run(dra_real, "hard", 3, containers=2)
    device, mib = allocation(c)
    gpu = sim_gpus()[int(device.removeprefix("gpu-"))]
    uid = p["metadata"]["uid"]

    def mine() -> list[dict[str, Any]]:
        return [e for e in read_state(dra_real.limits_file)["journal"] if pod_uid_of_dir(Path(e["path"]).name) == uid]

    sets = [e for e in mine() if e["op"] == "set"]
    assert len(sets) == 1 and sets[0]["gpu"] == gpu.uuid, mine()
    assert sets[0]["hard"] == sets[0]["soft"] == mib * 2**20 == 3 * 2**30
    # Nothing of the pod existed yet: no sandbox, no container cgroup, no process in the pod's cgroup.
    assert sets[0]["children"] == [] and sets[0]["procs"] == 0, sets[0]
    assert Path(sets[0]["path"]).is_dir() and any(Path(sets[0]["path"]).iterdir())  # and now they run
    for i in range(2):
        assert printed_env(dra_real, "hard", f"c{i}")[ENV_MEM_LIMIT_MIB] == "3072"
    delete(dra_real, "hard")
    wait_for(lambda: any(e["op"] == "clear" for e in mine()), 60, "the pod's limit to be cleared")
    ops = [e["op"] for e in mine()]
    assert ops[:2] == ["set", "clear"], ops  # cleared while the cgroup existed, before kubelet removed it
