"""The two modes side by side through the real kube-scheduler: DRA (kube-scheduler's own allocator over
share-dra's ResourceSlices) and the device plugin with our extender.

Real etcd, kube-apiserver and kube-scheduler from hack/build-k8s.sh; no kubelets (pods are only bound,
claims only allocated). Two measurements:

  python bench/bench_dra.py throughput [--nodes 1000 --pods 2000]
      N nodes of G GPUs, each both annotated for the extender and published as a share-dra ResourceSlice;
      M pods of random sizes, once as `nvidia.com/gpu-mem` pods through kube-scheduler + our extender
      (binpack), once as pods with a ResourceClaim of the same size through kube-scheduler alone.
      Prints pods/s, scheduling latency and CPU per pod of each process, as bench_throughput.py, and
      fails if any GPU was promised more than its memory. `--claims template`: pods name a
      ResourceClaimTemplate and kube-controller-manager's resourceclaim controller makes the claims.

  python bench/bench_dra.py placement [--nodes 100 --seeds 3 --policy frag]
      The same replay three ways on each sample: DRA with kube-scheduler's own placement, DRA with our
      policy (the extender with --dra chooses the node, share-dra's publisher lists each node's GPUs in the
      policy's order so the allocator's first fit takes the policy's GPU; emulated in process with
      share-dra's own SlicePublisher and ClaimUsage, fed each claim as its watch would be), and the
      device-plugin extender with the policy (share-sim on the same arrivals: test_live_vs_sim proves the
      live extender places pod for pod as share-sim does). Counts GPUs promised more than their memory.
      Last line: one JSON object (dra_default, dra_policy, extender_<policy>, gpus_over, ...).

  python bench/bench_dra.py frag [--nodes 40 --seeds 3]
      Replays an openb sample (nodes drawn per model from ../shared/data/openb, pods in a
      seeded order, drawn with replacement) through kube-scheduler's DRA allocator, one pod at a time,
      and replays the same order through share-sim's policies: what the DRA allocator's choice of node
      and GPU does to fragmentation. One GiB of a device stands for one thousandth of a GPU, so openb's
      shares map exactly (every GPU offers 1000 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import yaml  # noqa: E402
from bench_throughput import NAMESPACE  # noqa: E402
from bench_throughput import SIZES  # noqa: E402
from bench_throughput import Scenario  # noqa: E402
from bench_throughput import delete_all_pods  # noqa: E402
from bench_throughput import fmt_row  # noqa: E402
from bench_throughput import measure_burst  # noqa: E402
from bench_throughput import run_scenario  # noqa: E402
from bench_throughput import wait_http  # noqa: E402

from share_core.contract import MemoryUnit  # noqa: E402
from share_core.kube import ApiServerClient  # noqa: E402
from share_core.kube import KubeError  # noqa: E402
from share_dra.claims import quantity_bytes  # noqa: E402
from share_dra.kubeapi import ApiServerDraApi  # noqa: E402
from share_dra.order import ClaimUsage  # noqa: E402
from share_dra.order import policy_order  # noqa: E402
from share_dra.publisher import SlicePublisher  # noqa: E402
from share_node.backend import Gpu  # noqa: E402
from share_placement import make_policy  # noqa: E402
from share_placement.draorder import DeviceOrderer  # noqa: E402
from share_scheduler.config import scheduler_config as extender_scheduler_config  # noqa: E402
from share_scheduler.sim.engine import build_policy  # noqa: E402
from share_scheduler.sim.engine import simulate  # noqa: E402
from share_scheduler.sim.workload import MILLI  # noqa: E402
from share_scheduler.sim.workload import SimNode  # noqa: E402
from share_scheduler.sim.workload import SimPod  # noqa: E402
from share_scheduler.sim.workload import Workload  # noqa: E402
from share_scheduler.sim.workload import load_openb  # noqa: E402
from tests.controlplane.barenodes import create_bare_nodes  # noqa: E402
from tests.controlplane.barenodes import create_node  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.controlplane.cluster import ManagedProcess  # noqa: E402
from tests.controlplane.cluster import free_port  # noqa: E402
from tests.controlplane.draworkload import RESOURCE_API  # noqa: E402
from tests.controlplane.draworkload import allocated_devices  # noqa: E402
from tests.controlplane.draworkload import claim_pod  # noqa: E402
from tests.controlplane.draworkload import device_class  # noqa: E402
from tests.controlplane.draworkload import gpu_slice  # noqa: E402
from tests.controlplane.draworkload import memory_claim  # noqa: E402

OPENB = ROOT.parent / "shared" / "data" / "openb"


def scheduler_config(qps: int, scoring: str = "LeastAllocated") -> str:
    """kube-scheduler's defaults (its DRA plugin included), with the client QPS of the extender runs;
    `scoring`: NodeResourcesFit's strategy (LeastAllocated, the default, spreads; MostAllocated packs)."""
    config: dict[str, Any] = {"clientConnection": {"qps": qps, "burst": qps}}
    if scoring != "LeastAllocated":
        fit = {"scoringStrategy": {"type": scoring, "resources": [{"name": "cpu", "weight": 1},
                                                                 {"name": "memory", "weight": 1}]}}  # fmt: skip
        config["profiles"] = [{"schedulerName": "default-scheduler",
                               "pluginConfig": [{"name": "NodeResourcesFit", "args": fit}]}]  # fmt: skip
    return yaml.safe_dump(config)


def publish_slices(admin: ApiServerClient, nodes: list[tuple[str, list[tuple[str, int]]]]) -> None:
    def make(entry: tuple[str, list[tuple[str, int]]]) -> None:
        admin.request("POST", f"{RESOURCE_API}/resourceslices", body=gpu_slice(*entry))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(make, nodes))


# --------------------------------------------------------------------------- throughput


def claim_templates(admin: ApiServerClient, sizes: set[int]) -> None:
    """One ResourceClaimTemplate per size (`gpu-<n>gi`), as a user of samples/dra would write them."""
    for gib in sorted(sizes):
        spec = memory_claim(NAMESPACE, f"gpu-{gib}gi", gib)["spec"]
        body = {"metadata": {"name": f"gpu-{gib}gi"}, "spec": {"spec": spec}}
        admin.request("POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaimtemplates", body=body)


def fullest_gpu(admin: ApiServerClient, gib: int) -> float:
    """The largest share of one GPU's memory the allocated claims consume (never above 1)."""
    used: Counter[tuple[str, str]] = Counter()
    for claim in admin.request("GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims").get("items") or []:
        for pool, device, consumed in allocated_devices(claim):
            used[(pool, device)] += quantity_bytes(consumed)
    return max(used.values(), default=0) / (gib << 30)


def run_dra_scenario(
    cp: ControlPlane,
    admin: ApiServerClient,
    pods: int,
    seed: int,
    qps: int,
    gib: int,
    claims: str,
    extender: tuple[ManagedProcess, str] | None = None,
    nodes_to_score: int = 100,
) -> dict[str, Any]:
    """M pods (and, with `claims` direct, their M claims) created at once; kube-scheduler alone allocates
    and binds them. `claims` template: kube-controller-manager's resourceclaim controller makes each claim
    from the pod's ResourceClaimTemplate, as in production (bounded by its own client QPS). `extender`:
    (its process, its URL) with --dra, called to filter by the gpushare-scheduler profile (mode dra)."""
    if extender is not None:
        sched = cp.start_scheduler(dra_extender_config(qps, extender[1], nodes_to_score))
    else:
        sched = cp.start_scheduler(scheduler_config(qps))
    time.sleep(2.0)
    rng = random.Random(seed)
    sizes = [rng.choice(SIZES) for _ in range(pods)]

    def create(i: int) -> str:
        name = f"d{i:06d}"
        pod = claim_pod(NAMESPACE, name, name)
        if extender is not None:
            pod["spec"]["schedulerName"] = "gpushare-scheduler"
        if claims == "direct":
            admin.request("POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims",
                          body=memory_claim(NAMESPACE, name, sizes[i]))  # fmt: skip
        else:
            pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"gpu-{sizes[i]}gi"}]
        admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=pod)
        return name

    try:
        burst = measure_burst(cp, admin, sched.pid, pods, create, extender[0].pid if extender else None)
    except TimeoutError as exc:
        raise TimeoutError(f"dra: {exc}") from exc
    fullest = fullest_gpu(admin, gib)
    if fullest > 1:
        raise AssertionError(f"dra: a GPU was promised {fullest:.3f} of its memory")
    cp.stop_scheduler()
    delete_all_pods(admin)
    admin.request("DELETE", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
    # Each allocated claim's finalizer goes once the resourceclaim controller (client QPS 20) sees its pod
    # gone: 2,000 claims take minutes on a loaded machine.
    wait_gone(admin, f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims", timeout=900)
    print(f"# dra: fullest GPU {fullest:.3f} of its memory", file=sys.stderr)
    return {
        "label": f"dra (kube-scheduler{f' + extender --dra binpack, {nodes_to_score}% of nodes' if extender else ''}, "
        f"{claims})",
        "qps": qps,
        **burst,
        "extender_ms": {},
        "bind_failures": {},
    }


def throughput(args: argparse.Namespace, cp: ControlPlane, admin: ApiServerClient, workdir: Path) -> None:
    admin.request("POST", f"{RESOURCE_API}/deviceclasses", body=device_class())
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    t = time.monotonic()
    create_bare_nodes(admin, names, args.gpus, args.gpu_mem)
    publish_slices(admin, [(n, [("NVIDIA A100-SXM4-80GB", args.gpu_mem)] * args.gpus) for n in names])
    print(f"# {args.nodes} nodes x {args.gpus} GPUs x {args.gpu_mem} GiB (annotated and sliced) in "
          f"{time.monotonic() - t:.0f} s; {os.cpu_count()} CPUs", file=sys.stderr)  # fmt: skip
    claim_templates(admin, set(SIZES))
    # Allocated claims carry a finalizer the resourceclaim controller removes once their pod is gone.
    cp.start_controller_manager(controllers=("resourceclaim-controller",))
    results = []
    modes = args.modes.split(",")
    for _ in range(args.runs):
        base: dict[int, float] = {}
        if "extender" in modes:
            results.append(run_scenario(Scenario("extender binpack", args.qps, "binpack"), cp, admin, args.pods,
                                        workdir, args.seed))  # fmt: skip
            base = {args.qps: results[-1]["pods_per_s"]}  # x = pods/s over the extender's, in this run
            print(fmt_row(results[-1], base), flush=True)
        if "dra" in modes:
            results.append(run_dra_scenario(cp, admin, args.pods, args.seed, args.qps, args.gpu_mem, args.claims))
            base = base or {args.qps: results[-1]["pods_per_s"]}
            print(fmt_row(results[-1], base), flush=True)
        for share in (int(x) for x in args.nodes_to_score.split(",")) if "dra-extender" in modes else ():
            extender = start_dra_extender(cp, workdir, "binpack")
            try:
                results.append(run_dra_scenario(cp, admin, args.pods, args.seed, args.qps, args.gpu_mem, args.claims,
                                                extender, share))  # fmt: skip
            finally:
                extender[0].stop()
            print(fmt_row(results[-1], base), flush=True)

    def median(prefix: str) -> float:
        return statistics.median([r["pods_per_s"] for r in results if r["label"].startswith(prefix)] or [float("nan")])

    ext, dra, dra_ext = median("extender"), median("dra (kube-scheduler,"), median("dra (kube-scheduler +")
    print(f"\n# {args.nodes} nodes, {args.pods} pods, QPS {args.qps}: median pods/s extender {ext:.1f}, "
          f"dra {dra:.1f} (dra/extender x{dra / ext:.2f}), dra with the extender {dra_ext:.1f} "
          f"(x{dra_ext / dra:.2f} of dra alone)")  # fmt: skip


# --------------------------------------------------------------------------- fragmentation replay


def sample_nodes(nodes: tuple[SimNode, ...], count: int, seed: int) -> tuple[SimNode, ...]:
    """`count` openb nodes, each model represented in proportion (at least one of each), seeded."""
    rng = random.Random(f"nodes-{seed}")
    by_model: dict[str, list[SimNode]] = {}
    for n in nodes:
        if n.gpus:
            by_model.setdefault(n.model, []).append(n)
    total = sum(len(v) for v in by_model.values())
    picked: list[SimNode] = []
    for model in sorted(by_model):
        group = by_model[model]
        k = max(1, round(count * len(group) / total))
        picked.extend(rng.sample(group, min(k, len(group))))
    return tuple(sorted(picked, key=lambda n: n.name))


def arrival_order(workload: Workload, seed: int, tune: float) -> list[int]:
    """Pod indices drawn with replacement in a seeded order until `tune` x capacity is asked; the
    simulated policies replay exactly this order (simulate's `order`)."""
    rng = random.Random(seed)
    target, requested, order = tune * workload.gpu_capacity, 0, []
    while requested < target:
        k = rng.randrange(len(workload.pods))
        order.append(k)
        requested += workload.pods[k].gpu_request
    return order


def wait_scheduled(admin: ApiServerClient, name: str, timeout: float = 60.0) -> tuple[str | None, str]:
    """(the node the pod was bound to, "") or (None, kube-scheduler's reason) once it is unschedulable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            return str(node), ""
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                return None, str(c.get("message") or "")
        time.sleep(0.02)
    raise TimeoutError(f"pod {name} neither bound nor unschedulable in {timeout} s")


def replay_dra(
    admin: ApiServerClient,
    workload: Workload,
    order: list[int],
    prefix: str,
    scheduler: str = "default-scheduler",
    drivers: DraDrivers | None = None,
) -> dict[str, Any]:
    """Each arrival as a claim + pod through kube-scheduler, one at a time; a pod that fits nowhere is
    deleted with its claim (the protocol's failed pod). Unallocated % read as share-sim reads it.
    `drivers`: share-dra's publishers, told of each claim as their watch would tell them."""
    capacity = workload.gpu_capacity
    requested = placed = failed = 0
    reasons: Counter[str] = Counter()
    marks = {90: None, 95: None, 100: None, 130: None}
    started = time.monotonic()
    for i, k in enumerate(order):
        pod: SimPod = workload.pods[k]
        name = f"{prefix}-{i:05d}"
        claim = None
        if pod.count:
            claim = name
            made = admin.request("POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims",
                                 body=memory_claim(NAMESPACE, name, pod.per_gpu, pod.count, pod.models))  # fmt: skip
            if drivers is not None:
                drivers.claim_created(made)
        body = claim_pod(NAMESPACE, name, claim, pod.cpu, pod.memory)
        body["spec"]["schedulerName"] = scheduler
        admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)
        requested += pod.gpu_request
        node, why = wait_scheduled(admin, name)
        if node is None:
            failed += 1
            reasons[f"{'gpu' if pod.count else 'cpu-only'} x{pod.count}: {why}"] += 1
            admin.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", query={"gracePeriodSeconds": "0"})
            if claim:
                admin.request("DELETE", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{name}")
        elif claim:
            got = admin.request("GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{name}")
            devices = allocated_devices(got)
            units = sum(int(q.removesuffix("Gi")) for _, _, q in devices)
            if units != pod.gpu_request:
                raise AssertionError(f"claim {name}: allocated {devices}, asked {pod.count} x {pod.per_gpu}")
            placed += units
            if drivers is not None:
                drivers.claim_allocated(got)
        for mark in marks:
            if marks[mark] is None and requested * 100 >= mark * capacity:
                marks[mark] = 100.0 - 100.0 * placed / capacity
    return {"unallocated_pct": marks, "arrivals": len(order), "failed": failed, "reasons": reasons,
            "seconds": time.monotonic() - started}  # fmt: skip


def wait_gone(admin: ApiServerClient, path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while admin.request("GET", path, query={"limit": "1"}).get("items"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: objects left after {timeout} s")
        time.sleep(0.5)


def fragmentation(args: argparse.Namespace, cp: ControlPlane, admin: ApiServerClient, workdir: Path) -> None:
    full = load_openb(str(OPENB / "openb_node_list_gpu_node.csv"), str(OPENB / "openb_pod_list_default.csv"))
    policies = [p for p in args.policies.split(",") if p]
    dra_label = f"dra (kube-scheduler, {args.scoring})"
    rows: dict[str, list[float]] = {dra_label: [], **{p: [] for p in policies}}
    admin.request("POST", f"{RESOURCE_API}/deviceclasses", body=device_class())
    cp.start_scheduler(scheduler_config(args.qps, args.scoring))
    # Allocated claims carry a finalizer the resourceclaim controller removes once their pod is gone;
    # without it a deleted claim would hold its device's memory into the next sample.
    cp.start_controller_manager(controllers=("resourceclaim-controller",))
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            nodes = sample_nodes(full.nodes, args.nodes, seed)
            workload = Workload(nodes, full.pods, full.unit)
            names = [n.name for n in nodes]
            for n in nodes:
                create_node(admin, n.name, {"cpu": f"{n.cpu}m", "memory": f"{n.memory}Mi", "pods": "1000"})
            publish_slices(admin, [(n.name, [(n.model, g) for g in n.gpus]) for n in nodes])
            order = arrival_order(workload, seed, args.tune)
            dra = replay_dra(admin, workload, order, f"s{seed}")
            rows[dra_label].append(dra["unallocated_pct"][100])
            line = [f"seed {seed}: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs, "
                    f"{dra['arrivals']} arrivals ({dra['failed']} failed) in {dra['seconds']:.0f} s; "
                    f"unallocated at 100%: dra {dra['unallocated_pct'][100]:.2f}"]  # fmt: skip
            for p in policies:
                res = simulate(workload, build_policy(p, seed, workload), seed, args.tune, order=order)
                rows[p].append(res.unallocated_pct["100"])
                line.append(f"{p} {res.unallocated_pct['100']:.2f}")
            print(", ".join(line), flush=True)
            for why, n in dra["reasons"].most_common(4):
                print(f"#   dra failed {n}: {why}", flush=True)
            delete_all_pods(admin)
            admin.request("DELETE", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
            wait_gone(admin, f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
            admin.request("DELETE", f"{RESOURCE_API}/resourceslices")
            for name in names:
                admin.request("DELETE", f"/api/v1/nodes/{name}")
    finally:
        cp.stop_scheduler()
        cp.stop_controller_manager()
    print(f"\n# openb samples of ~{args.nodes} nodes, seeds {args.seed}..{args.seed + args.seeds - 1}; "
          f"unallocated GPU % at arrived 100% (lower is better; {MILLI} units per GPU)")  # fmt: skip
    print("| placement | mean | seeds |\n|---|---|---|")
    for label, xs in rows.items():
        print(f"| {label} | {statistics.fmean(xs):.2f} | {' '.join(f'{x:.2f}' for x in xs)} |")


# --------------------------------------------------------------------------- DRA placement by the policy


class DraDrivers:
    """share-dra with --policy on every sampled node, in process: its own SlicePublisher and ClaimUsage
    per node, told of each claim as its ResourceClaim watch would tell it (created: every node learns the
    size; allocated: its node's usage moves and the publisher rewrites the slice if the order moved)."""

    def __init__(self, admin: ApiServerClient, nodes: tuple[SimNode, ...], policy: str) -> None:
        api = ApiServerDraApi(admin)
        unit = MemoryUnit.GiB
        self.orderer = DeviceOrderer(make_policy(policy))  # every node's watch sees the same claims
        self.learner = ClaimUsage("", unit, self.orderer, lambda: None)
        self.usage: dict[str, ClaimUsage] = {}
        self.publishers: dict[str, SlicePublisher] = {}
        self.writes = 0
        for n in nodes:
            gpus = [Gpu(i, f"GPU-{n.name}-{i}", n.model, gib << 30, i) for i, gib in enumerate(n.gpus)]
            usage = self.usage[n.name] = ClaimUsage(n.name, unit, self.orderer, lambda: None)
            self.publishers[n.name] = SlicePublisher(
                api, n.name, lambda g=gpus: g, unit, order=policy_order(n.name, usage, unit)
            )

    def publish_all(self) -> None:
        for pub in self.publishers.values():
            self.writes += pub.sync()

    def claim_created(self, claim: dict[str, Any]) -> None:
        probe = self.orderer.probe
        self.learner.learn(claim)
        if self.orderer.probe != probe:  # frag's order follows the size asked most: every node re-sorts
            self.publish_all()

    def claim_allocated(self, claim: dict[str, Any]) -> None:
        for pool in {pool for pool, _, _ in allocated_devices(claim)}:
            if pool in self.usage and self.usage[pool].apply(claim, learn=False):
                self.writes += self.publishers[pool].sync()


def start_dra_extender(cp: ControlPlane, workdir: Path, policy: str) -> tuple[ManagedProcess, str]:
    """share-scheduler --dra as the chart runs it in mode dra (policy shared with share-dra)."""
    port = free_port()
    argv = [sys.executable, "-m", "share_scheduler.cli", "--port", str(port), "--bind-address", "127.0.0.1",
            "--kubeconfig", str(cp.admin_kubeconfig), "--policy", policy, "--dra", "--log-level", "INFO"]  # fmt: skip
    proc = ManagedProcess("extender-dra", argv, workdir / f"extender-dra-{policy}.log", cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/readyz", proc, 300)
    return proc, url


def dra_extender_config(qps: int, url: str, nodes_to_score: int = 100) -> str:
    """The chart's kube-scheduler configuration in mode dra: our profile, the extender filter-only;
    `nodes_to_score`: its percentageOfNodesToScore (100, the chart's; 0: kube-scheduler's adaptive default)."""
    config = extender_scheduler_config(extender_url=f"{url}/gpushare-scheduler", leader_elect=False, bind=False)
    config["clientConnection"] = {"qps": qps, "burst": qps}
    config["percentageOfNodesToScore"] = nodes_to_score
    return yaml.safe_dump(config)


def gpus_over(admin: ApiServerClient, memory: dict[tuple[str, str], int]) -> int:
    """GPUs whose allocated claims consume more than the device offers (GiB)."""
    used: Counter[tuple[str, str]] = Counter()
    for claim in admin.request("GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims").get("items") or []:
        for pool, device, consumed in allocated_devices(claim):
            used[(pool, device)] += quantity_bytes(consumed) >> 30
    return sum(1 for gpu, u in used.items() if u > memory.get(gpu, 0))


def clear_sample(admin: ApiServerClient) -> None:
    delete_all_pods(admin)
    admin.request("DELETE", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
    wait_gone(admin, f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
    admin.request("DELETE", f"{RESOURCE_API}/resourceslices")


def placement(args: argparse.Namespace, cp: ControlPlane, admin: ApiServerClient, workdir: Path) -> None:
    full = load_openb(str(OPENB / "openb_node_list_gpu_node.csv"), str(OPENB / "openb_pod_list_default.csv"))
    admin.request("POST", f"{RESOURCE_API}/deviceclasses", body=device_class())
    cp.start_controller_manager(controllers=("resourceclaim-controller",))
    figures: dict[str, list[float]] = {"dra_default": [], "dra_policy": [], f"extender_{args.policy}": []}
    over = writes = 0
    seconds: list[float] = []
    extender, url = start_dra_extender(cp, workdir, args.policy)
    try:
        for seed in range(args.seed, args.seed + args.seeds):
            nodes = sample_nodes(full.nodes, args.nodes, seed)
            workload = Workload(nodes, full.pods, full.unit)
            memory = {(n.name, f"gpu-{i}"): gib for n in nodes for i, gib in enumerate(n.gpus)}
            for n in nodes:
                create_node(admin, n.name, {"cpu": f"{n.cpu}m", "memory": f"{n.memory}Mi", "pods": "1000"})
            order = arrival_order(workload, seed, args.tune)
            line = [f"seed {seed}: {len(nodes)} nodes, {len(memory)} GPUs, {len(order)} arrivals"]
            # kube-scheduler alone, share-dra's slices in index order (today's DRA mode)
            publish_slices(admin, [(n.name, [(n.model, g) for g in n.gpus]) for n in nodes])
            cp.start_scheduler(scheduler_config(args.qps))
            dra = replay_dra(admin, workload, order, f"d{seed}")
            cp.stop_scheduler()
            over += gpus_over(admin, memory)
            figures["dra_default"].append(dra["unallocated_pct"][100])
            line.append(f"dra default {dra['unallocated_pct'][100]:.2f} ({dra['failed']} failed)")
            clear_sample(admin)
            # the policy: the extender picks the node, share-dra's order the GPU
            drivers = DraDrivers(admin, nodes, args.policy)
            drivers.publish_all()
            cp.start_scheduler(dra_extender_config(args.qps, url))
            time.sleep(2.0)  # kube-scheduler's informers, the extender's watches
            ours = replay_dra(admin, workload, order, f"p{seed}", "gpushare-scheduler", drivers)
            cp.stop_scheduler()
            over += gpus_over(admin, memory)
            writes += drivers.writes
            seconds.append(ours["seconds"])
            figures["dra_policy"].append(ours["unallocated_pct"][100])
            line.append(f"dra {args.policy} {ours['unallocated_pct'][100]:.2f} ({ours['failed']} failed, "
                        f"{drivers.writes} slice writes, {ours['seconds']:.0f} s)")  # fmt: skip
            for why, n in ours["reasons"].most_common(3):
                print(f"#   dra {args.policy} failed {n}: {why}", flush=True)
            clear_sample(admin)
            sim = simulate(workload, build_policy(args.policy, seed, workload), seed, args.tune, order=order)
            figures[f"extender_{args.policy}"].append(sim.unallocated_pct["100"])
            line.append(f"extender {args.policy} (share-sim) {sim.unallocated_pct['100']:.2f}")
            print(", ".join(line), flush=True)
            for n in nodes:
                admin.request("DELETE", f"/api/v1/nodes/{n.name}")
    finally:
        cp.stop_scheduler()
        cp.stop_controller_manager()
        extender.stop()
    print(f"\n# openb samples of ~{args.nodes} nodes, seeds {args.seed}..{args.seed + args.seeds - 1}; "
          f"unallocated GPU % at arrived 100% (lower is better)")  # fmt: skip
    print("| placement | mean | seeds |\n|---|---|---|")
    for label, xs in figures.items():
        print(f"| {label} | {statistics.fmean(xs):.2f} | {' '.join(f'{x:.2f}' for x in xs)} |")
    summary: dict[str, Any] = {k: round(statistics.fmean(v), 3) for k, v in figures.items()}
    summary |= {"extender_frag": summary.get("extender_frag"), "gpus_over": over, "slice_writes": writes,
                "policy": args.policy, "seeds": args.seeds, "nodes": args.nodes,
                "replay_seconds": round(statistics.fmean(seconds), 1)}  # fmt: skip
    print(json.dumps(summary))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["throughput", "frag", "placement"])
    ap.add_argument("--nodes", type=int, help="throughput: 1000; frag: 40 (openb nodes sampled per model)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu-mem", type=int, default=80, help="GiB per GPU (throughput)")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--qps", type=int, default=1000, help="kube-scheduler client QPS (burst = QPS)")
    ap.add_argument("--runs", type=int, default=1, help="throughput: alternating runs of each mode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=3, help="frag: samples replayed")
    ap.add_argument("--tune", type=float, default=1.0, help="frag: stop once this x capacity was asked")
    ap.add_argument("--claims", choices=["direct", "template"], default="direct",
                    help="throughput: the bench creates each pod's claim (kube-scheduler's own figure), or "
                    "kube-controller-manager makes it from a ResourceClaimTemplate")  # fmt: skip
    ap.add_argument("--scoring", default="LeastAllocated", choices=["LeastAllocated", "MostAllocated"],
                    help="frag: kube-scheduler's NodeResourcesFit scoring strategy for the DRA replay")  # fmt: skip
    ap.add_argument("--policies", default="binpack,frag,bestfit", help="frag: share-sim policies to compare")
    ap.add_argument("--policy", default="frag", help="placement: the policy of the extender and share-dra")
    ap.add_argument("--modes", default="extender,dra,dra-extender",
                    help="throughput: which of extender (device plugin), dra, dra-extender to run")  # fmt: skip
    ap.add_argument("--nodes-to-score", default="100",
                    help="dra-extender: percentageOfNodesToScore, one run each (0: adaptive)")  # fmt: skip
    args = ap.parse_args()
    if args.nodes is None:
        args.nodes = {"throughput": 1000, "frag": 40, "placement": 100}[args.what]
    runs = {"throughput": throughput, "placement": placement, "frag": fragmentation}
    with (
        tempfile.TemporaryDirectory(prefix="gpushare-bench-dra-") as tmp,
        ControlPlane(Path(tmp) / "cp", k8s_bin_dir()) as cp,
    ):
        admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="gpushare-bench")
        try:
            admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
            runs[args.what](args, cp, admin, Path(tmp))
        except (KubeError, TimeoutError) as exc:
            print(f"bench failed: {exc}\n{cp.logs()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
