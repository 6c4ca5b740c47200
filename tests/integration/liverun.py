"""The live half of the live-versus-simulated comparison: arrivals through the real kube-scheduler and
the extender, one at a time (tests/integration/test_live_vs_sim.py, bench/bench_live_vs_sim.py)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_node
from share_core.kube import ApiServerClient
from share_core.kube import NotFound
from share_scheduler.config import scheduler_config
from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_node
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import free_port
from tests.controlplane.cluster import http_status
from tests.controlplane.gpucluster import wait_for
from tests.integration.livesim import Placement
from tests.integration.livesim import node_object
from tests.integration.livesim import node_resources
from tests.integration.livesim import pod_object

log = logging.getLogger(__name__)

NAMESPACE = "live-vs-sim"
SCHEDULER = "gpushare-live-vs-sim"
POD_TIMEOUT = 30.0  # seconds one arrival may take to be bound or found unschedulable
WATCH_SECONDS = 2  # each of the pod watches (resumed until the run is done)


class PodWatch:
    """The latest version of every pod in the namespace, from one watch; waiters are woken per event, and
    `on_event(type, pod)` is called for each (in the watch's thread, before the waiters wake)."""

    def __init__(
        self,
        admin: ApiServerClient,
        resource_version: str,
        namespace: str = NAMESPACE,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.namespace = namespace
        self.on_event = on_event
        self.changed = threading.Condition()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(admin, resource_version), daemon=True)
        self._thread.start()

    def _run(self, admin: ApiServerClient, rv: str) -> None:
        # Short watches, resumed from the last resourceVersion: the last one ends on its own within
        # WATCH_SECONDS of stop(), so kube-apiserver has no open watch left to wait for at shutdown.
        try:
            while not self._stop.is_set():
                for event in admin.watch_pods(
                    rv, field_selector=f"metadata.namespace={self.namespace}", timeout_seconds=WATCH_SECONDS
                ):
                    rv = event.object.get("metadata", {}).get("resourceVersion") or rv
                    if event.type not in ("ADDED", "MODIFIED", "DELETED"):
                        continue
                    name = event.object["metadata"]["name"]
                    if self.on_event is not None:
                        self.on_event(event.type, event.object)
                    with self.changed:
                        self.pods[name] = event.object
                        self.changed.notify_all()
        except BaseException as exc:  # surfaced by outcome(): a dead watch must not look like a slow pod
            with self.changed:
                self.error = exc
                self.changed.notify_all()

    def outcome(self, name: str, timeout: float) -> str:
        """Whether the pod was "bound" or found "unschedulable" (kube-scheduler's PodScheduled=False
        condition); raises on timeout."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"the pod watch died: {self.error!r}")
                pod = self.pods.get(name)
                if pod is not None and pod_node(pod):
                    return "bound"
                if pod is not None and unschedulable(pod):
                    return "unschedulable"
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"pod {name} neither bound nor unschedulable after {timeout:.0f}s: {pod}")
                self.changed.wait(left)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WATCH_SECONDS + 5)


def unschedulable(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return True
    return False


def _create_nodes(admin: ApiServerClient, nodes: list[SimNode]) -> None:
    for node in nodes:
        create_node(admin, node.name, node_resources(node), annotations=node_object(node)["metadata"]["annotations"])


def run_live(
    cp: ControlPlane,
    workdir: Path,
    policy: str,
    nodes: list[SimNode],
    arrivals: list[SimPod],
) -> list[Placement]:
    """Every arrival through kube-scheduler and the extender, one at a time; where each one went."""
    admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-tests")
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    _create_nodes(admin, nodes)
    names = [f"a-{i:04d}" for i in range(len(arrivals))]

    def create(i: int) -> None:
        body = pod_object(names[i], arrivals[i], SCHEDULER)
        admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(len(arrivals))))

    # The extender starts after every arrival exists: its initial list teaches frag the whole workload,
    # as share-sim teaches its policy before the first arrival.
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "share_scheduler.cli", "--port", str(port), "--bind-address", "127.0.0.1",
            "--kubeconfig", str(cp.admin_kubeconfig), "--policy", policy, "--memory-unit", "MiB",
            "--filter-keeps", "best", "--threads", "4", "--log-level", "INFO"]  # fmt: skip
    extender = ManagedProcess("extender", argv, workdir / "extender.log")
    scheduler = None
    watch = None
    try:
        wait_for(lambda: http_status(url + "/readyz") == 200, 60, "the extender's first sync", interval=0.1)
        config = scheduler_config(extender_url=f"{url}/gpushare-scheduler", scheduler_name=SCHEDULER)
        config["clientConnection"] = {"qps": 500, "burst": 1000}
        scheduler = cp.launch_scheduler(yaml.safe_dump(config), "kube-scheduler-live-vs-sim")
        rv = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"limit": 1})["metadata"][
            "resourceVersion"
        ]
        watch = PodWatch(admin, rv)
        placed: list[Placement] = []
        for name in names:
            admin.request(
                "PATCH",
                f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                body=[{"op": "remove", "path": "/spec/schedulingGates"}],
                content_type="application/json-patch+json",
            )
            if watch.outcome(name, POD_TIMEOUT) == "bound":
                pod = watch.pods[name]
                assignment = parse_assignment(pod_annotations(pod))
                placed.append((pod_node(pod), tuple(sorted(assignment.gpu_indices)) if assignment else ()))
            else:
                placed.append(None)
                try:
                    admin.request(
                        "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", query={"gracePeriodSeconds": 0}
                    )
                except NotFound:
                    pass
        return placed
    except BaseException:
        log.error("extender log tail:\n%s", extender.log_tail(60))
        if scheduler is not None:
            log.error("kube-scheduler log tail:\n%s", scheduler.process.log_tail(60))
        raise
    finally:
        if watch is not None:
            watch.stop()
        if scheduler is not None:
            scheduler.process.stop()
        extender.stop()
