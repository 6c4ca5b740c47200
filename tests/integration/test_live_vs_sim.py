"""Live equals simulated: one openb sample through the real kube-scheduler + extender and through share-sim.

A seeded sample of openb's nodes (the model mix kept) and a seeded arrival order drawn per share-sim's
protocol (CPU-only pods and pods that fit nowhere included) go through
- the real etcd, kube-apiserver and kube-scheduler (hack/build-k8s.sh) with our extender
  (`--policy binpack` or `frag`, `--memory-unit MiB`, filter keeps the best node) on bare nodes: pods
  are created one at a time, each waits until it is bound or found unschedulable (then it is deleted:
  in the protocol a pod that fits nowhere fails and the next arrives);
- share-sim's engine (`engine.simulate`) on the same nodes and the same arrivals in the same order:
  for binpack share-sim's own run; for frag with its policy seeing what the extender sees
  (`livesim.ExtenderView`: share-sim's frag also weighs CPU, which the extender does not see).
Every pod must land on the same node and GPUs both ways, so the allocation ratios agree exactly.

What the two sides are given so that they may agree:
- Units: a GPU is 1000 units both ways (openb's gpu_milli; the extender counts "MiB").
- The workload frag learns: share-sim teaches the policy every arrival before the first one; the
  extender learns from the pods it lists, so every arrival is created first behind a scheduling gate,
  the extender is started then (its initial list teaches it all of them) and each gate is lifted in
  turn. Deleting a failed pod does not unlearn it, on either side.
- Ties: the extender's filter passes the one best node, ties to the lowest name; share-sim takes the
  first node in input order, and the sample is listed by name.
- CPU-only pods never reach the extender (managedResources: only `nvidia.com/gpu-mem` pods do), and
  kube-scheduler, with the profile's spreading score plugins off, puts them on a random node they fit.
  Each is pinned (required node affinity; kube-scheduler still checks it fits) to the node share-sim
  chose, so both sides carry the same CPU load.
The last one and frag's CPU-aware view in share-sim are where the product and share-sim's protocol
differ; docs/simulator.md ("Live versus simulated") gives the measured gap.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.assignment import parse_assignment, pod_annotations, pod_node
from share_core.kube import ApiServerClient, NotFound
from share_scheduler.config import scheduler_config
from share_scheduler.placement import make_policy
from share_scheduler.sim.engine import simulate
from share_scheduler.sim.workload import Workload, load_openb
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import ready_condition
from tests.controlplane.cluster import ManagedProcess, free_port
from tests.controlplane.gpucluster import wait_for
from tests.integration import livesim
from tests.integration.livesim import Placement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

log = logging.getLogger(__name__)

NAMESPACE = "live-vs-sim"
SCHEDULER = "gpushare-live-vs-sim"
SEED = 7
NODES = 32
TUNE = 1.3
POD_TIMEOUT = 30.0  # seconds one arrival may take to be bound or found unschedulable
WATCH_SECONDS = 2  # each of the test's pod watches (resumed until the test is done)


@pytest.fixture
def plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own per run: no other run's nodes or pods may be seen by this one."""
    cp = ControlPlane(tmp_path_factory.mktemp("live-vs-sim-plane"), k8s_bin_dir)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


class PodWatch:
    """The latest version of every pod in the namespace, from one watch; waiters are woken per event."""

    def __init__(self, admin: ApiServerClient, resource_version: str) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: set[str] = set()
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
                    rv, field_selector=f"metadata.namespace={NAMESPACE}", timeout_seconds=WATCH_SECONDS
                ):
                    rv = event.object.get("metadata", {}).get("resourceVersion") or rv
                    if event.type not in ("ADDED", "MODIFIED", "DELETED"):
                        continue
                    name = event.object["metadata"]["name"]
                    with self.changed:
                        if event.type == "DELETED":
                            self.deleted.add(name)
                        self.pods[name] = event.object
                        self.changed.notify_all()
        except BaseException as exc:  # surfaced by outcome(): a dead watch must not look like a slow pod
            with self.changed:
                self.error = exc
                self.changed.notify_all()

    def outcome(self, name: str, timeout: float) -> str:
        """ "bound" or "unschedulable" once the pod is either; raises on timeout."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"the pod watch died: {self.error!r}")
                pod = self.pods.get(name)
                if pod is not None and pod_node(pod):
                    return "bound"
                if pod is not None and _unschedulable(pod):
                    return "unschedulable"
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"pod {name} neither bound nor unschedulable after {timeout:.0f}s: {pod}")
                self.changed.wait(left)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WATCH_SECONDS + 5)


def _unschedulable(pod: dict[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return True
    return False


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError:
        return 0


def _create_nodes(admin: ApiServerClient, nodes: list[livesim.SimNode]) -> None:
    for node in nodes:
        admin.request("POST", "/api/v1/nodes", body=livesim.node_object(node))
        res = livesim.node_resources(node)
        admin.request(
            "PATCH",
            f"/api/v1/nodes/{node.name}/status",
            body={"status": {"capacity": res, "allocatable": res, "conditions": [ready_condition()]}},
            content_type="application/merge-patch+json",
        )


def run_live(
    cp: ControlPlane,
    workdir: Path,
    policy: str,
    nodes: list[livesim.SimNode],
    arrivals: list[livesim.SimPod],
    pins: list[str | None],
) -> list[Placement]:
    """Every arrival through kube-scheduler and the extender, one at a time; where each one went."""
    admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-tests")
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    _create_nodes(admin, nodes)
    names = [f"a-{i:04d}" for i in range(len(arrivals))]

    def create(i: int) -> None:
        body = livesim.pod_object(names[i], arrivals[i], SCHEDULER, pins[i])
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
        wait_for(lambda: _status(url + "/readyz") == 200, 60, "the extender's first sync", interval=0.1)
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
        raise
    finally:
        if watch is not None:
            watch.stop()
        if scheduler is not None:
            scheduler.process.stop()
        extender.stop()


@pytest.mark.parametrize(
    ("policy", "extender_view"),
    [
        # binpack scores no CPU: share-sim's own run is what the extender does, no view cut needed.
        ("binpack", False),
        # frag's score weighs CPU in share-sim, which the extender does not see: the view is cut.
        ("frag", True),
    ],
)
def test_live_placements_equal_share_sim(plane: ControlPlane, tmp_path: Path, policy: str, extender_view: bool) -> None:
    started = time.monotonic()
    trace = load_openb(livesim.OPENB / "openb_node_list_gpu_node.csv", livesim.OPENB / "openb_pod_list_default.csv")
    nodes = list(livesim.sample_nodes(trace.nodes, NODES, SEED))
    capacity = sum(n.gpu_capacity for n in nodes)
    order = livesim.arrival_order(trace.pods, capacity, SEED, TUNE)
    arrivals = [trace.pods[k] for k in order]

    # The order is share-sim's own: its seeded draws on this sample are these arrivals.
    drawn: list[Any] = []
    replayed: list[Any] = []
    simulate(Workload(tuple(nodes), trace.pods), make_policy("binpack"), SEED, TUNE, placements=drawn)
    simulate(Workload(tuple(nodes), trace.pods), make_policy("binpack"), SEED, TUNE, order=order, placements=replayed)
    assert drawn == replayed and len(drawn) == len(order)
    assert len({n.model for n in nodes}) >= 5, "the sample keeps openb's model mix"
    cpu_only = sum(1 for p in arrivals if p.count == 0)
    multi = sum(1 for p in arrivals if p.count > 1)
    assert cpu_only > 0 and multi > 0, (cpu_only, multi)

    sim, expected = livesim.simulate_arrivals(nodes, arrivals, policy, extender_view=extender_view)
    assert sim.failed > 0, "the sample must reach pods that fit nowhere"
    pins = [
        where[0] if where is not None and p.count == 0 else None for p, where in zip(arrivals, expected, strict=True)
    ]

    live = run_live(plane, tmp_path, policy, nodes, arrivals, pins)

    live_pct = livesim.allocation_pct(nodes, arrivals, live)
    sim_pct = livesim.allocation_pct(nodes, arrivals, expected)
    differ = [
        f"arrival {i} ({arrivals[i].name}, {arrivals[i].per_gpu} x {arrivals[i].count}, cpu {arrivals[i].cpu}m): "
        f"live {live[i]}, sim {expected[i]}"
        for i in range(len(arrivals))
        if live[i] != expected[i]
    ]
    _, own = livesim.simulate_arrivals(nodes, arrivals, policy, extender_view=False)
    print(
        f"\nlive vs sim, {policy}: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs, {len(arrivals)} "
        f"arrivals ({cpu_only} CPU-only, {multi} multi-GPU), failed live {live.count(None)} / sim {sim.failed}; "
        f"allocation live {live_pct:.2f} % / sim {sim_pct:.2f} % (share-sim's own view: "
        f"{livesim.allocation_pct(nodes, arrivals, own):.2f} %); {time.monotonic() - started:.0f} s"
    )
    assert abs(live_pct - sim_pct) <= 1.0, f"allocation live {live_pct:.2f} % vs sim {sim_pct:.2f} %"
    assert not differ, f"{len(differ)} of {len(arrivals)} placements differ; first: " + "; ".join(differ[:5])
    assert 80.0 < live_pct <= 100.0
