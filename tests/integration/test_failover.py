"""Failover of the chart's two scheduler replicas, with the real kube-scheduler's leader election.

Two replicas, each a kube-scheduler (leader election on one Lease) with its own extender beside it,
as the chart deploys them. Mid-burst the leader's pod dies (both processes killed, the Lease never
released); the standby's kube-scheduler takes the Lease once it expires, its extender (synced since
it started) serves, and scheduling resumes. No GPU is promised twice: every bound pod carries its
assignment and no GPU's assignments exceed its memory.
"""

from __future__ import annotations

import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from share_core.accounting import node_usage
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_node
from share_core.gpus import node_gpus
from share_core.kube import ApiServerClient
from share_core.kube import KubeError
from share_scheduler.config import scheduler_config
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_bare_nodes
from tests.controlplane.barenodes import gpu_pod
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import free_port
from tests.controlplane.cluster import http_status
from tests.controlplane.gpucluster import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

log = logging.getLogger(__name__)

NAMESPACE = "failover"
SCHEDULER = "gpushare-failover"
LEASE = "gpushare-failover"
# Short, valid leader election timings (leaseDuration > renewDeadline > 1.2 x retryPeriod) so the
# test takes seconds; the chart's defaults make the same gap about leaseDuration long.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6, 4, 1
NODES, GPUS, GPU_MEM = 16, 4, 16
PODS = 240  # about 3/4 of the cluster's GPU memory: tight enough that double booking would show


class Replica:
    """One scheduler pod of the chart: an extender and a kube-scheduler talking over 127.0.0.1."""

    def __init__(self, cp: ControlPlane, name: str, workdir: Path) -> None:
        self.name = name
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "share_scheduler.cli", "--port", str(port), "--bind-address", "127.0.0.1",
                "--kubeconfig", str(cp.admin_kubeconfig), "--policy", "binpack", "--log-level", "INFO"]  # fmt: skip
        self.extender = ManagedProcess(f"extender-{name}", argv, workdir / f"extender-{name}.log")
        wait_for(lambda: http_status(self.url + "/readyz") == 200, 60, f"extender {name} ready")
        config = scheduler_config(extender_url=f"{self.url}/gpushare-scheduler", scheduler_name=SCHEDULER)
        config["leaderElection"] = {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceNamespace": "kube-system",
            "resourceName": LEASE,
            "leaseDuration": f"{LEASE_DURATION}s",
            "renewDeadline": f"{RENEW_DEADLINE}s",
            "retryPeriod": f"{RETRY_PERIOD}s",
        }
        config["clientConnection"] = {"qps": 200, "burst": 400}
        # The admin identity: the built-in system:kube-scheduler may take only the "kube-scheduler" Lease
        # (the chart's own RBAC for its Lease is checked in test_chart.py).
        self.scheduler = cp.launch_scheduler(
            yaml.safe_dump(config), f"kube-scheduler-{name}", kubeconfig=cp.admin_kubeconfig
        )

    def leads(self) -> bool:
        # client-go leaderelection.go logs it on acquiring ("Successfully acquired lease" in 1.36)
        return "successfully acquired lease" in self.scheduler.process.log_path.read_text(errors="replace").lower()

    def kill(self) -> None:
        """The pod dies: SIGKILL, so the Lease is not released and nothing is flushed."""
        for proc in (self.scheduler.process, self.extender):
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
                proc.popen.wait(10)

    def stop(self) -> None:
        self.scheduler.process.stop()
        self.extender.stop()

    def binds(self) -> float:
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("gpushare_binds_total "):
                    return float(line.split()[1])
        return 0.0


@pytest.fixture(scope="module")
def plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("failover-plane"), k8s_bin_dir) as cp:
        yield cp


def test_standby_takes_over_mid_burst_without_double_booking(plane: ControlPlane, tmp_path: Path) -> None:
    cp = plane
    admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-tests")
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    create_bare_nodes(admin, [f"fo-{i:02d}" for i in range(NODES)], GPUS, GPU_MEM)

    replicas = [Replica(cp, "a", tmp_path), Replica(cp, "b", tmp_path)]
    try:
        wait_for(lambda: any(r.leads() for r in replicas), 60, "a leader", interval=0.2)
        leader = next(r for r in replicas if r.leads())
        standby = next(r for r in replicas if r is not leader)
        assert http_status(standby.url + "/readyz") == 200, "the standby's extender syncs before it leads"

        bound_at: dict[str, float] = {}
        rv = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["metadata"]["resourceVersion"]
        done = threading.Event()

        def watch() -> None:
            """Records when each pod is first seen bound. The test's own watch must not be what fails:
            if the stream ends or breaks, the pods are listed (bound ones recorded now) and watched again."""
            since = rv
            while len(bound_at) < PODS and not done.is_set():
                try:
                    for event in admin.watch_pods(
                        since, field_selector=f"metadata.namespace={NAMESPACE}", timeout_seconds=300
                    ):
                        since = event.object.get("metadata", {}).get("resourceVersion") or since
                        if pod_node(event.object):
                            bound_at.setdefault(event.object["metadata"]["name"], time.monotonic())
                        if len(bound_at) >= PODS or done.is_set():
                            return
                    log.warning("the test's pod watch ended after %d bound; listing and watching again", len(bound_at))
                except KubeError as exc:
                    log.warning("the test's pod watch broke after %d bound (%s); listing and watching again",
                                len(bound_at), exc)  # fmt: skip
                listing = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
                for pod in listing["items"]:
                    if pod_node(pod):
                        bound_at.setdefault(pod["metadata"]["name"], time.monotonic())
                since = listing["metadata"]["resourceVersion"]

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        rng = random.Random(4)
        sizes = [rng.choice([1, 2, 2, 3, 4, 4, 6, 8]) for _ in range(PODS)]

        def create() -> None:
            for i, size in enumerate(sizes):
                body = gpu_pod(NAMESPACE, f"p{i:03d}", SCHEDULER, size)
                admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)
                time.sleep(0.01)  # a steady stream, so the leader dies mid-burst

        creator = threading.Thread(target=create, daemon=True)
        creator.start()
        wait_for(lambda: len(bound_at) >= PODS // 4, 120, "a quarter of the pods bound by the leader", interval=0.05)
        killed_at = time.monotonic()
        before = len(bound_at)
        leader.kill()
        try:
            wait_for(lambda: len(bound_at) >= PODS, 180, f"all {PODS} pods bound after the failover", interval=0.2)
        except TimeoutError as exc:
            listed = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            bound = sum(1 for p in listed if pod_node(p))
            raise AssertionError(f"{exc}: the test's watch saw {len(bound_at)} bound, a list finds {bound}") from exc
        done.set()
        creator.join(10)
        assert before < PODS * 3 // 4, f"the leader died too late to test anything ({before} of {PODS} bound)"

        after = sorted(t for t in bound_at.values() if t > killed_at + 0.5)  # binds in flight at the kill excluded
        gap = after[0] - killed_at
        log.warning(
            "failover: %d pods bound before the kill, first bind by the new leader %.1f s after it "
            "(leaseDuration %d s, retryPeriod %d s); all %d bound %.1f s after it",
            before,
            gap,
            LEASE_DURATION,
            RETRY_PERIOD,
            PODS,
            max(bound_at.values()) - killed_at,
        )
        assert standby.leads()
        assert standby.binds() > 0, "the standby's extender bound the rest"
        # The gap is the Lease running out, not a resync: well under twice its duration.
        assert gap < 2 * LEASE_DURATION + RETRY_PERIOD, gap

        pods = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        assert len(pods) == PODS and all(pod_node(p) for p in pods)
        assert all(parse_assignment(pod_annotations(p)) is not None for p in pods), "every bound pod has its GPU"
        for node in admin.request("GET", "/api/v1/nodes")["items"]:
            usage = node_usage(node_gpus(node), [p for p in pods if pod_node(p) == node["metadata"]["name"]])
            for gpu in usage.gpus:
                assert gpu.used <= gpu.total, f"{node['metadata']['name']} GPU {gpu.index}: {gpu.used} > {gpu.total}"
    finally:
        for r in replicas:
            r.stop()
