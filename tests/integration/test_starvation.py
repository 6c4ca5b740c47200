"""No big pod starved, through the real kube-scheduler and our extender (issue 40, live).

Each test runs one extender (as the chart's service account, with the chart's RBAC rendered with
consolidation on) and one kube-scheduler on its own scheduler name, over nodes without a kubelet (pods
are bound, never run; a test ends a pod by writing its phase, as kubelet would). Thresholds are seconds,
so each scenario takes well under a minute on a quiet machine; timeouts are generous for a loaded one.

- a reservation held against a stream of small pods until the big pod is bound (and, without
  reservations, the same stream starves it), the extender restarted while it holds;
- a consolidation that evicts a movable pod and places the waiting one, the moved pod's replacement
  placed on the GPU held for it;
- consolidations refused: a PodDisruptionBudget (the Eviction API's 429), a bare pod, a plan that would
  not place the moved pod again;
- two replicas: only the one beside the leading kube-scheduler holds; the other sees the hold;
- room left (--leave-room on) for a multi-GPU pod kube-scheduler found no node for, and not without it;
- a reservation yielding (--hold-yield-after) to a small pod that found no room and waited past the bound.

One piece: every scenario runs on the module's one control plane with the chart's RBAC installed once (the
module-scoped fixtures, and the Stack, Stream and helpers they share); split, each part would start its own.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.accounting import node_usage
from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from share_core.assignment import pod_node
from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_HOLDS
from share_core.contract import EVENT_CONSOLIDATING
from share_core.contract import EVENT_CONSOLIDATION_EVICTED
from share_core.contract import EVENT_CONSOLIDATION_REFUSED
from share_core.contract import EVENT_RESERVED
from share_core.gpus import node_gpus
from share_core.holds import HoldKind
from share_core.holds import parse_holds
from share_core.kube import ApiServerClient
from share_core.kube import NotFound
from share_scheduler.config import scheduler_config
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_bare_nodes
from tests.controlplane.barenodes import gpu_pod
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import free_port
from tests.controlplane.cluster import http_status
from tests.controlplane.gpucluster import EXTENDER_SA
from tests.controlplane.gpucluster import NAMESPACE as CHART_NAMESPACE
from tests.controlplane.gpucluster import install_chart_rbac
from tests.controlplane.gpucluster import sa_identity
from tests.controlplane.gpucluster import wait_for
from tests.kubelet import set_pod_phase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SCHEDULER = "gpushare-starvation"
FAST = [
    "--remedy-min-gpus",
    "1",
    "--reserve-after",
    "3",
    "--starvation-period",
    "1",
    "--hold-seconds",
    "120",
    "--reservation-share",
    "0.5",
]
_ids = itertools.count()


class Stack:
    """One extender (as the chart's service account) and one kube-scheduler calling it."""

    def __init__(self, cp: ControlPlane, workdir: Path, kubeconfig: Path, flags: list[str], lease: str = "") -> None:
        self.cp = cp
        self.workdir = workdir
        self.kubeconfig = kubeconfig
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flags = flags
        self.extender: ManagedProcess | None = None
        self.scheduler: Any = None
        self.starts = 0
        self.start_extender(flags)

    def start_extender(self, flags: list[str]) -> None:
        self.flags = flags
        self.starts += 1
        argv = [sys.executable, "-m", "share_scheduler.cli", "--port", str(self.port), "--bind-address",
                "127.0.0.1", "--kubeconfig", str(self.kubeconfig), "--policy", "binpack", "--scheduler-name",
                SCHEDULER, "--log-level", "INFO", *flags]  # fmt: skip
        self.extender = ManagedProcess(f"extender-{self.starts}", argv, self.workdir / f"extender-{self.starts}.log")
        wait_for(lambda: http_status(self.url + "/readyz") == 200, 90, "the extender to be ready")

    def restart_extender(self, flags: list[str] | None = None) -> None:
        assert self.extender is not None
        self.extender.stop()
        self.start_extender(self.flags if flags is None else flags)

    def start_scheduler(
        self, leader_election: dict[str, Any] | None = None, name: str = "kube-scheduler", hostname: str | None = None
    ) -> Any:
        config = scheduler_config(
            extender_url=f"{self.url}/gpushare-scheduler", scheduler_name=SCHEDULER, leader_elect=False
        )
        # Retry unschedulable pods within a second or two (the defaults wait up to 10 s).
        config["podInitialBackoffSeconds"] = 1
        config["podMaxBackoffSeconds"] = 2
        if leader_election:
            config["leaderElection"] = leader_election
        self.scheduler = self.cp.launch_scheduler(yaml.safe_dump(config), f"{name}-{next(_ids)}",
                                                  kubeconfig=self.cp.admin_kubeconfig, hostname=hostname)  # fmt: skip
        return self.scheduler

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def inspect(self) -> Any:
        import json
        import urllib.request

        with urllib.request.urlopen(self.url + "/gpushare-scheduler/inspect", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.process.stop()
        if self.extender is not None:
            self.extender.stop()

    def logs(self) -> str:
        parts = []
        if self.extender is not None:
            parts.append(self.extender.log_tail(80))
        if self.scheduler is not None:
            parts.append(self.scheduler.process.log_tail(40))
        return "\n".join(parts)


@pytest.fixture(scope="module")
def plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("starvation-plane"), k8s_bin_dir) as cp:
        yield cp


@pytest.fixture(scope="module")
def chart(plane: ControlPlane) -> dict[str, Any]:
    """The chart's RBAC with consolidation on (pods patch, pods/eviction create): the extender runs as it."""
    objects = install_chart_rbac(plane, {"consolidation.enabled": True})
    leases = [
        name
        for o in objects
        if o.get("kind") == "Role"
        for rule in o.get("rules") or ()
        if "leases" in (rule.get("resources") or ())
        for name in rule.get("resourceNames") or ()
    ]
    return {"kubeconfig": plane.kubeconfig_for(*sa_identity(CHART_NAMESPACE, EXTENDER_SA)), "lease": leases[0]}


@pytest.fixture
def admin(plane: ControlPlane) -> ApiServerClient:
    return ApiServerClient.from_kubeconfig(str(plane.admin_kubeconfig), component="gpushare-tests")


@pytest.fixture
def ns(admin: ApiServerClient) -> Iterator[str]:
    """A namespace and node-name prefix of the test's own; its pods and nodes are removed afterwards."""
    name = f"starve-{next(_ids)}"
    admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    # Its pods go (a pod left waiting would be weighed by the next test's extender).
    admin.request("DELETE", f"/api/v1/namespaces/{name}/pods", query={"gracePeriodSeconds": 0})
    for node in admin.list_nodes().items:
        if node["metadata"]["name"].startswith(name):
            admin.request("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")


@pytest.fixture
def stacks() -> Iterator[list[Stack]]:
    """The test's extenders and kube-schedulers; their log tails are printed (pytest shows them on failure)."""
    made: list[Stack] = []
    yield made
    for s in made:
        print(s.logs())
        s.stop()


# -- helpers --------------------------------------------------------------------------------------


def create(admin: ApiServerClient, ns: str, name: str, mem: int, **extra: Any) -> None:
    pod = gpu_pod(ns, name, SCHEDULER, mem)
    for key in ("labels", "annotations", "ownerReferences"):
        if key in extra:
            pod["metadata"][key] = extra[key]
    admin.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod)


def get(admin: ApiServerClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return admin.get_pod(ns, name)
    except NotFound:
        return None


def bound(admin: ApiServerClient, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for(lambda: (p := get(admin, ns, name)) and pod_node(p) and p, timeout, f"pod {ns}/{name} bound")


def gpus_of(pod: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
    assignment = parse_assignment(pod_annotations(pod))
    assert assignment is not None, pod["metadata"]["name"]
    return pod_node(pod), tuple(assignment.gpu_indices)


def holds(admin: ApiServerClient, ns: str, name: str) -> list[Any]:
    pod = get(admin, ns, name)
    text = pod_annotations(pod).get(ANN_HOLDS) if pod else None
    return parse_holds(text) if text else []


def events(admin: ApiServerClient, ns: str, reason: str, pod: str | None = None) -> list[dict[str, Any]]:
    items = admin.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["reason"] == reason and (pod is None or e["involvedObject"].get("name") == pod)]


def finish(admin: ApiServerClient, ns: str, name: str) -> None:
    set_pod_phase(admin, ns, name, "Succeeded")


def never_overcommitted(admin: ApiServerClient, ns: str) -> None:
    """No GPU of the test's nodes is promised more than it has (live pods' annotations)."""
    pods = [p for p in admin.list_pods().items if p["metadata"]["namespace"] == ns]
    for node in admin.list_nodes().items:
        name = node["metadata"]["name"]
        if not name.startswith(ns):
            continue
        live = [p for p in pods if pod_node(p) == name and (p.get("status") or {}).get("phase") != "Succeeded"]
        for g in node_usage(node_gpus(node), live).gpus:
            assert g.used <= g.total, f"node {name} GPU {g.index}: {g.used} of {g.total} promised"


def owner(uid: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "movers", "uid": uid, "controller": True}]


def no_intruders(admin: ApiServerClient, ns: str, hold: Any, since: float, until: float) -> None:
    """No small pod was placed on a GPU of `hold` between `since` (+1 s) and `until` (the big pod's bind)."""
    intruders = [
        p["metadata"]["name"]
        for p in admin.list_pods().items
        if p["metadata"]["namespace"] == ns
        and p["metadata"]["name"].startswith("small-")
        and pod_node(p) == hold.node
        and set(gpus_of(p)[1]) & set(hold.gpus)
        and since + 1 < parse_assignment(pod_annotations(p)).assume_time_ns / 1e9 < until
    ]
    assert intruders == [], f"small pods placed on the held GPU while the big pod waited: {intruders}"


# -- reservations -----------------------------------------------------------------------------------


class Stream:
    """Small pods end and are replaced, oldest first, as under churn: each replacement is created as its
    predecessor ends and takes the freed room before the next one ends (the stream waits up to
    `patience` s for it to be bound), so no GPU ever drains by chance: only a hold keeps one free."""

    def __init__(self, admin: ApiServerClient, ns: str, first: list[str], mem: int, patience: float = 4.0) -> None:
        self.admin, self.ns, self.mem, self.patience = admin, ns, mem, patience
        self.live = list(first)
        self.made = itertools.count(len(first))
        self.stop = threading.Event()
        self.step = threading.Lock()  # held for one step; pause() takes it to stop the stream between steps
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _bound(self, name: str) -> bool:
        pod = get(self.admin, self.ns, name)
        return pod is not None and bool(pod_node(pod))

    def _run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                with self.step:
                    self._one()
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)

    def _one(self) -> None:
        oldest = next((n for n in self.live if self._bound(n)), None)
        if oldest is None:
            return  # every small pod waits: nothing to end
        finish(self.admin, self.ns, oldest)
        self.live.remove(oldest)
        name = f"small-{next(self.made)}"
        create(self.admin, self.ns, name, self.mem)
        self.live.append(name)
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline and not self.stop.is_set() and not self._bound(name):
            time.sleep(0.1)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.errors, self.errors


def test_reservation_holds_against_a_stream_of_small_pods_until_the_big_pod_is_bound(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    create_bare_nodes(admin, [f"{ns}-a", f"{ns}-b"], 2, 16)
    # Reservations after 20 s: until then the stream shows what happens without one.
    flags = ["--remedy-min-gpus", "1", "--reserve-after", "20", "--starvation-period", "1", "--hold-seconds", "120",
             "--reservation-share", "0.5"]  # fmt: skip
    stack = Stack(plane, tmp_path, chart["kubeconfig"], flags)
    stacks.append(stack)
    stack.start_scheduler()
    small = [f"small-{i}" for i in range(8)]  # 8 GiB each: two on every 16 GiB GPU, the cluster full
    for name in small:
        create(admin, ns, name, 8)
    for name in small:
        bound(admin, ns, name)
    create(admin, ns, "big", 16)
    stream = Stream(admin, ns, small, 8)
    try:
        # Without a reservation the stream starves it: every GPU always holds a small pod.
        time.sleep(15)
        assert not pod_node(admin.get_pod(ns, "big")), "the big pod was placed without a reservation"
        assert not holds(admin, ns, "big")
        hold = wait_for(lambda: holds(admin, ns, "big"), 90, "a reservation for the big pod")[0]
        held_since = time.time()
        assert hold.kind == HoldKind.RESERVATION and hold.per_gpu == 16
        wait_for(lambda: events(admin, ns, EVENT_RESERVED, "big"), 30, "the GpuShareReserved Event")
        # The extender restarts while holding (the stream paused, so no GPU drains while none serves):
        # the new one rebuilds the hold from the annotation.
        with stream.step:
            if not pod_node(admin.get_pod(ns, "big")):
                stack.restart_extender()
                rebuilt = wait_for(lambda: stack.inspect()["holds"], 30, "the hold rebuilt after the restart")
                assert any(h["holder"] == f"{ns}/big" and h["kind"] == "reservation" for h in rebuilt), rebuilt
        big = bound(admin, ns, "big", timeout=180)
    finally:
        stream.end()
    # While it waited, the hold kept every small pod off the GPU held for it (the big pod may still take
    # another GPU that drained meanwhile, e.g. while the extender restarted).
    big_bound = parse_assignment(pod_annotations(big)).assume_time_ns / 1e9
    no_intruders(admin, ns, hold, held_since, big_bound)
    never_overcommitted(admin, ns)
    wait_for(lambda: not [h for h in stack.inspect()["holds"] if h["holder"] == f"{ns}/big"], 30, "its hold released")


# -- consolidation ---------------------------------------------------------------------------------


def split_node(admin: ApiServerClient, ns: str, mover: dict[str, Any], b: int = 12) -> str:
    """One node of two 16 GiB GPUs: GPU 0 holds `a` (8) and the mover (4), GPU 1 holds `b`: the room a
    pod of 8 needs is there, split 4 and 16-b. The pods run (their phase says so)."""
    node = f"{ns}-n"
    create_bare_nodes(admin, [node], 2, 16)
    for name, mem, extra in (("a", 8, {}), ("mover", 4, mover), ("b", b, {})):
        create(admin, ns, name, mem, **extra)
        bound(admin, ns, name)
        set_pod_phase(admin, ns, name, "Running")  # as kubelet would: the Eviction API spares no Pending pod PDBs
    assert gpus_of(admin.get_pod(ns, "a"))[1] == gpus_of(admin.get_pod(ns, "mover"))[1] == (0,)
    return node


CONSOLIDATE = [*FAST, "--consolidation", "--consolidation-max-moves", "1"]


def test_consolidation_moves_a_movable_pod_and_places_the_waiting_one(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    stack = Stack(plane, tmp_path, chart["kubeconfig"], CONSOLIDATE)
    stacks.append(stack)
    stack.start_scheduler()
    node = split_node(admin, ns, {"ownerReferences": owner("rs-movers"), "labels": {"app": "movers"}})
    create(admin, ns, "big", 8)
    wait_for(lambda: get(admin, ns, "mover") is None, 90, "the movable pod evicted")
    wait_for(lambda: events(admin, ns, EVENT_CONSOLIDATING, "big"), 30, "the GpuShareConsolidating Event")
    wait_for(lambda: events(admin, ns, EVENT_CONSOLIDATION_EVICTED, "mover"), 30, "the Event on the moved pod")
    big = bound(admin, ns, "big", timeout=90)
    assert gpus_of(big) == (node, (0,))
    # Its controller's replacement goes where the plan held room for it.
    create(admin, ns, "mover-2", 4, ownerReferences=owner("rs-movers"))
    assert gpus_of(bound(admin, ns, "mover-2")) == (node, (1,))
    never_overcommitted(admin, ns)
    assert 'gpushare_consolidation_evictions_total{outcome="evicted"} 1.0' in stack.metrics()


def test_consolidation_refused_by_a_disruption_budget(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    """No disruption controller runs here, so the budget never allows one: the Eviction API says 429."""
    admin.request(
        "POST",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        body={"metadata": {"name": "guard"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "g"}}}},
    )
    stack = Stack(plane, tmp_path, chart["kubeconfig"], CONSOLIDATE)
    stacks.append(stack)
    stack.start_scheduler()
    split_node(admin, ns, {"ownerReferences": owner("rs-guarded"), "labels": {"app": "g"}})
    create(admin, ns, "big", 8)
    refused = wait_for(lambda: events(admin, ns, EVENT_CONSOLIDATION_REFUSED, "mover"), 90, "the refusal on the pod")
    assert "disruption budget" in refused[0]["message"].lower()
    # Left alone afterwards (no storm): the waiting pod gets a reservation instead.
    wait_for(lambda: [h for h in holds(admin, ns, "big") if h.kind == HoldKind.RESERVATION], 60, "a reservation")
    time.sleep(5)
    assert get(admin, ns, "mover") is not None
    assert 'gpushare_consolidation_evictions_total{outcome="refused"} 1.0' in stack.metrics()
    assert not pod_node(admin.get_pod(ns, "big"))


def test_consolidation_never_moves_a_bare_pod(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    stack = Stack(plane, tmp_path, chart["kubeconfig"], CONSOLIDATE)
    stacks.append(stack)
    stack.start_scheduler()
    split_node(admin, ns, {})
    create(admin, ns, "big", 8)
    refused = wait_for(lambda: events(admin, ns, EVENT_CONSOLIDATION_REFUSED, "big"), 90, "the refusal")
    assert "bare pods never move" in refused[0]["message"]
    time.sleep(3)
    assert get(admin, ns, "mover") is not None and not pod_node(admin.get_pod(ns, "big"))


def test_consolidation_refused_when_the_moved_pod_could_not_be_placed_again(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    stack = Stack(plane, tmp_path, chart["kubeconfig"], CONSOLIDATE)
    stacks.append(stack)
    stack.start_scheduler()
    split_node(admin, ns, {"ownerReferences": owner("rs-stuck")}, b=14)  # free: 4 on GPU 0, 2 on GPU 1
    create(admin, ns, "big", 6)  # fits GPU 0 once the mover leaves; the mover (4) then fits nowhere
    refused = wait_for(lambda: events(admin, ns, EVENT_CONSOLIDATION_REFUSED, "big"), 90, "the refusal")
    assert "place every moved pod again" in refused[0]["message"]
    time.sleep(3)
    assert get(admin, ns, "mover") is not None


# -- two replicas ------------------------------------------------------------------------------------


def test_only_the_replica_beside_the_leading_scheduler_holds(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    """Both extenders watch the chart's Lease; the leading kube-scheduler names this host, so the replica
    that says it runs elsewhere (--leader-identity) never acts, yet its book holds the leader's hold."""
    lease = f"{CHART_NAMESPACE}/{chart['lease']}"
    election = {"leaderElect": True, "resourceLock": "leases", "resourceNamespace": CHART_NAMESPACE,
                "resourceName": chart["lease"], "leaseDuration": "6s", "renewDeadline": "4s",
                "retryPeriod": "1s"}  # fmt: skip
    create_bare_nodes(admin, [f"{ns}-a"], 2, 16)
    leader = Stack(plane, tmp_path / "a", chart["kubeconfig"], [*FAST, "--leader-lease", lease])
    standby = Stack(plane, tmp_path / "b", chart["kubeconfig"],
                    [*FAST, "--leader-lease", lease, "--leader-identity", "another-host"])  # fmt: skip
    stacks.extend([leader, standby])
    leader.start_scheduler(election, "kube-scheduler-leader")
    for i in range(4):
        create(admin, ns, f"small-{i}", 8)
    for i in range(4):
        bound(admin, ns, f"small-{i}")
    create(admin, ns, "big", 16)
    wait_for(lambda: holds(admin, ns, "big"), 90, "a reservation for the big pod")
    wait_for(lambda: standby.inspect()["holds"], 30, "the standby's book holding the leader's hold")
    time.sleep(3)  # a few of the standby's passes
    assert 'gpushare_reservations_total{outcome="made"}' not in standby.metrics()
    assert 'gpushare_reservations_total{outcome="made"} 1.0' in leader.metrics()
    assert len(wait_for(lambda: events(admin, ns, EVENT_RESERVED, "big"), 30, "the Event")) == 1


def lease_holder(admin: ApiServerClient, lease: str) -> str:
    namespace, name = lease.split("/")
    doc = admin.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    return (doc.get("spec") or {}).get("holderIdentity") or ""


def test_the_standby_pair_takes_over_and_keeps_the_reservation_until_the_big_pod_is_bound(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    """Two replicas as the chart runs them, each a kube-scheduler and its extender on one host of its own
    (here a UTS namespace per kube-scheduler, so each names its host in the Lease as a pod would). The
    leading pair reserves for the big pod; the leading pair goes (its pod lost) while a stream of small
    pods keeps every GPU busy; the standby kube-scheduler takes the Lease, its extender starts acting, keeps
    the leader's hold against the stream (no small pod on the held GPU), and the big pod is bound through it."""
    lease = f"{CHART_NAMESPACE}/{chart['lease']}"
    election = {"leaderElect": True, "resourceLock": "leases", "resourceNamespace": CHART_NAMESPACE,
                "resourceName": chart["lease"], "leaseDuration": "6s", "renewDeadline": "4s",
                "retryPeriod": "1s"}  # fmt: skip
    create_bare_nodes(admin, [f"{ns}-a"], 2, 16)
    first = Stack(plane, tmp_path / "a", chart["kubeconfig"],
                  [*FAST, "--leader-lease", lease, "--leader-identity", f"{ns}-host-a"])  # fmt: skip
    second = Stack(plane, tmp_path / "b", chart["kubeconfig"],
                   [*FAST, "--leader-lease", lease, "--leader-identity", f"{ns}-host-b"])  # fmt: skip
    stacks.extend([first, second])
    first.start_scheduler(election, "kube-scheduler-a", hostname=f"{ns}-host-a")
    # The Lease may still name a replica of an earlier test until it lapses (6 s).
    wait_for(lambda: lease_holder(admin, lease).startswith(f"{ns}-host-a_"), 60, "the first kube-scheduler to lead")
    second.start_scheduler(election, "kube-scheduler-b", hostname=f"{ns}-host-b")
    wait_for(lambda: "gpushare_extender_leading 1.0" in first.metrics(), 30, "the first extender to act")
    assert "gpushare_extender_leading 0.0" in second.metrics()
    small = [f"small-{i}" for i in range(4)]  # 8 GiB each: two on each 16 GiB GPU, the node full
    for name in small:
        create(admin, ns, name, 8)
    for name in small:
        bound(admin, ns, name)
    create(admin, ns, "big", 16)
    stream = Stream(admin, ns, small, 8)
    try:
        hold = wait_for(lambda: holds(admin, ns, "big"), 90, "a reservation for the big pod")[0]
        held_since = time.time()
        assert 'gpushare_reservations_total{outcome="made"} 1.0' in first.metrics()
        wait_for(lambda: second.inspect()["holds"], 30, "the standby's book holding the leader's hold")
        # The leading pair goes between two steps of the stream, and the stream waits for the standby
        # to take over: while no kube-scheduler leads, ended pods are not replaced, and a GPU that drained
        # then would let the big pod in without the hold's help.
        with stream.step:
            assert not pod_node(admin.get_pod(ns, "big")), "bound before the fail-over: nothing to show"
            first.stop()
            gone = time.time()
            wait_for(lambda: lease_holder(admin, lease).startswith(f"{ns}-host-b_"), 60, "the standby to lead")
            wait_for(lambda: "gpushare_extender_leading 1.0" in second.metrics(), 30, "the standby extender to act")
        big = bound(admin, ns, "big", timeout=180)
    finally:
        stream.end()
    big_bound = parse_assignment(pod_annotations(big)).assume_time_ns / 1e9
    no_intruders(admin, ns, hold, held_since, big_bound)
    assert big_bound > gone, "the big pod was bound before the leading pair went"
    never_overcommitted(admin, ns)
    big_holds = lambda: [h for h in second.inspect()["holds"] if h["holder"] == f"{ns}/big"]  # noqa: E731
    wait_for(lambda: not big_holds(), 30, "its hold released once it was bound")


# -- room for what waits ----------------------------------------------------------------------------


def unschedulable(pod: dict[str, Any] | None) -> bool:
    """kube-scheduler's verdict on the pod: PodScheduled False, reason Unschedulable."""
    conditions = ((pod or {}).get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


@pytest.mark.parametrize("leave_room", ["on", "off"])
def test_room_is_left_for_a_multi_gpu_pod_kube_scheduler_found_no_node_for(
    plane: ControlPlane,
    chart: dict[str, Any],
    admin: ApiServerClient,
    ns: str,
    stacks: list[Stack],
    tmp_path: Path,
    leave_room: str,
) -> None:
    """A pod of 2 whole GPUs waits (Unschedulable): node a is one GPU short of it, node s (one GPU) never
    could take it. A pod of 12 GiB fits either; binpack alone takes a's last free GPU (4 GiB left there
    against 12 on s), and with --leave-room on it goes to s: the extender learnt the waiting shape from
    the pod watch (kube-scheduler's PodScheduled condition, in the protobuf watch too)."""
    create_bare_nodes(admin, [f"{ns}-a"], 2, 16)
    create_bare_nodes(admin, [f"{ns}-s"], 1, 24)
    stack = Stack(plane, tmp_path, chart["kubeconfig"], ["--leave-room", leave_room])  # no reservation in 600 s
    stacks.append(stack)
    stack.start_scheduler()
    create(admin, ns, "first", 12)
    assert gpus_of(bound(admin, ns, "first")) == (f"{ns}-a", (0,))
    create(admin, ns, "big", 32, annotations={ANN_GPU_COUNT: "2"})
    wait_for(lambda: unschedulable(get(admin, ns, "big")), 60, "kube-scheduler to find no node for the big pod")
    if leave_room == "on":
        shape = 'gpushare_leave_room_shapes{gpus="2",models="",per_gpu="16"} 1.0'
        wait_for(lambda: shape in stack.metrics(), 30, "the extender to leave room for the waiting 2 x 16 GiB shape")
    create(admin, ns, "second", 12)
    want = f"{ns}-s" if leave_room == "on" else f"{ns}-a"
    assert gpus_of(bound(admin, ns, "second"))[0] == want
    assert pod_node(get(admin, ns, "big")) == ""
    never_overcommitted(admin, ns)


# -- reservations yielding to small pods that waited -------------------------------------------------


def test_a_reservation_yields_to_a_small_pod_that_waited_past_the_bound(
    plane: ControlPlane, chart: dict[str, Any], admin: ApiServerClient, ns: str, stacks: list[Stack], tmp_path: Path
) -> None:
    """`--hold-yield-after` live: a pair of whole GPUs waits on a node whose GPU 0 is 12 of 16 GiB taken
    and is held both GPUs. A 4 GiB share finds no room (every GPU held: kube-scheduler marks it
    Unschedulable) and waits; once it has waited past the bound, its next try sees the reserved memory as
    free and it is bound there, while the pair keeps its hold."""
    bound_s = 8.0
    create_bare_nodes(admin, [f"{ns}-a"], 2, 16)
    flags = ["--remedy-min-gpus", "2", "--reserve-after", "2", "--starvation-period", "1", "--hold-seconds", "120",
             "--reservation-share", "1.0", "--hold-yield-after", str(bound_s)]  # fmt: skip
    stack = Stack(plane, tmp_path, chart["kubeconfig"], flags)
    stacks.append(stack)
    stack.start_scheduler()
    create(admin, ns, "run0", 12)
    assert gpus_of(bound(admin, ns, "run0")) == (f"{ns}-a", (0,))
    create(admin, ns, "pair", 32, annotations={ANN_GPU_COUNT: "2"})
    hold = wait_for(lambda: holds(admin, ns, "pair"), 60, "a reservation for the pair")[0]
    assert (hold.kind, hold.node, hold.gpus) == (HoldKind.RESERVATION, f"{ns}-a", (0, 1))
    wait_for(lambda: stack.inspect()["holds"], 30, "the hold in the extender's book")
    create(admin, ns, "share", 4)
    created = time.time()
    wait_for(lambda: unschedulable(get(admin, ns, "share")), 60, "kube-scheduler to find no room for the share")
    touched = itertools.count()

    def placed_after_a_retry() -> bool:
        # Any cluster event sends an unschedulable pod back to kube-scheduler's queue: label the node.
        body = {"metadata": {"labels": {"gpushare-test/touch": str(next(touched))}}}
        admin.request("PATCH", f"/api/v1/nodes/{ns}-a", body=body, content_type="application/merge-patch+json")
        pod = get(admin, ns, "share")
        if pod_node(pod or {}):
            return True
        assert time.time() - created < bound_s + 60, "the share still waits long after the bound"
        return False

    while time.time() - created < bound_s - 2:  # before the bound, retried, it still sees the holds
        assert not placed_after_a_retry(), "the share took held memory before it had waited past the bound"
        time.sleep(1)
    wait_for(placed_after_a_retry, 90, "the share to take the reserved memory once past the bound")
    share = get(admin, ns, "share")
    assert gpus_of(share)[0] == f"{ns}-a"
    # (creationTimestamp is whole seconds: the extender may count up to a second more than `created` does)
    assert parse_assignment(pod_annotations(share)).assume_time_ns / 1e9 > created + bound_s - 1.5
    assert "gpushare_reservation_yields_total 1.0" in stack.metrics()
    assert pod_node(get(admin, ns, "pair")) == "" and holds(admin, ns, "pair")  # the pair still holds
    assert stack.extender is not None and "reservations yield to it" in stack.extender.log_tail(200)
    never_overcommitted(admin, ns)
