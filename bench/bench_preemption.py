"""Preemption on a filled cluster: gpushare's victim choice per GPU against kube-scheduler's own proposal.

python bench/bench_preemption.py [--cluster-nodes 1000] [--preemptors 300] [--policy frag] [--seed 0] [--json]

A sample of openb's nodes (`--cluster-nodes`, drawn with the seed) is filled with openb pods (priorities
from their qos: LS 2 > Burstable 1 > BE 0, share_scheduler/sim/workload.py QOS_PRIORITY) placed by the
policy until 200 draws in a row fit nowhere. Then pods of priority 1 or 2 drawn from the trace arrive one
by one; one that fits nowhere is a preemptor, and on the same cluster state two answers are worked out:

- **ours**: `share_placement.preemption.choose_victims` (the extender's preempt verb, its own preemption
  and share-sim call it): the cheapest lower-priority pods that free room on one GPU (N for N GPUs);
- **kube-scheduler's own proposal** (device-plugin mode, no preempt verb): DefaultPreemption's
  `SelectVictimsOnNode` (pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go,
  v1.37.2) sees `nvidia.com/gpu-mem` as a node total only: remove every lower-priority pod, fail the node
  if the pod does not fit the node's totals (gpu-mem, CPU, memory, pods) even then, else add the pods back
  most important first (higher priority, then earlier start) and keep as victims those whose return
  breaks the totals; a node with no victim is no candidate (`DryRunPreemption`: "expected at least one
  victim pod on node"). The best candidate by `pickOneNodeForPreemption`'s order (the same `rank_key`).

Both look at candidate nodes as `DryRunPreemption` does: from one random offset (the same for both), until
max(10 %, 100) candidates are found. kube-scheduler's victims are then checked against the GPUs: with them
gone, does the preemptor fit one GPU (N) of that node? If not, every one of them was evicted for nothing
(wasted) and the preemptor stays Pending. Ours is applied (victims leave, the preemptor is placed on the
GPUs it was given), so the next preemptor sees the cluster our decisions made.

The verb's latency: the extender's preempt path in-process over a ClusterCache holding the same cluster
(nodes with their gpushare.io/gpus annotation, every pod bound with its gpu-index annotation and priority),
for each preemptor over the candidate nodes kube-scheduler's dry run would send it: the cache's node
states and pods turned into `PreemptionNode`s and `choose_victims` run, as the verb does.

Prints a table, then one JSON object (`--json`: only the JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from share_placement import eligible_positions
from share_placement.preemption import Candidate
from share_placement.preemption import PodOnNode
from share_placement.preemption import PreemptionNode
from share_placement.preemption import choose_victims
from share_placement.preemption import importance_order
from share_placement.preemption import rank_key
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.preemption import PreemptionTimeline
from share_scheduler.sim.preemption import num_candidates
from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import percentile
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import load_openb

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"
FOREVER = 1e12


@dataclass
class Totals:
    """A node as kube-scheduler's NodeResourcesFit sees it: allocatable and requested totals."""

    gpu_cap: int
    cpu_cap: int | None
    mem_cap: int | None
    gpu_used: int
    cpu_used: int
    mem_used: int

    def fits(self, gpu: int, cpu: int, mem: int) -> bool:
        if self.gpu_used + gpu > self.gpu_cap:
            return False
        if self.cpu_cap is not None and self.cpu_used + cpu > self.cpu_cap:
            return False
        return self.mem_cap is None or self.mem_used + mem <= self.mem_cap


def kube_select_victims(node: PreemptionNode, totals: Totals, gpu: int, cpu: int, mem: int, priority: int):
    """DefaultPreemption.SelectVictimsOnNode over node totals (module docstring): victims most important
    first, or None when the node is no candidate."""
    lower = [p for p in node.pods if p.priority < priority and not p.terminating]
    if not lower:
        return None  # "No preemption victims found for incoming pod"
    t = Totals(totals.gpu_cap, totals.cpu_cap, totals.mem_cap, totals.gpu_used, totals.cpu_used, totals.mem_used)
    for p in lower:
        t.gpu_used -= p.gpu_units
        t.cpu_used -= p.cpu
        t.mem_used -= p.memory
    if not t.fits(gpu, cpu, mem):
        return None
    victims = []
    for p in importance_order(lower):  # reprieve the most important first
        t.gpu_used += p.gpu_units
        t.cpu_used += p.cpu
        t.mem_used += p.memory
        if not t.fits(gpu, cpu, mem):
            t.gpu_used -= p.gpu_units
            t.cpu_used -= p.cpu
            t.mem_used -= p.memory
            victims.append(p)
    return victims or None  # no victim: "expected at least one victim pod on node"


class Bench:
    def __init__(self, workload: Workload, policy_name: str, seed: int) -> None:
        self.workload = workload
        self.rng = random.Random(f"bench-preemption-{seed}")
        policy = build_policy(policy_name, seed, workload)
        self.tl = PreemptionTimeline(workload, policy, [], 0.0, FOREVER, seed, preempt=False)
        self.clock = 0.0

    def new_arrival(self, pod: int) -> int:
        tl = self.tl
        self.clock += 1.0
        tl.now = self.clock
        seq = len(tl.arrivals)
        tl.arrivals.append(Arrival(self.clock, pod, FOREVER))
        tl.started.append(None)
        return seq

    def try_place(self, seq: int) -> bool:
        chosen = self.tl._choose(seq)
        if chosen is None:
            return False
        node, ev = chosen
        self.tl.place(seq, node, ev[1])
        return True

    def fill(self) -> int:
        """Place random trace pods until 200 draws in a row fit nowhere; the number placed."""
        pods = self.workload.pods
        misses = placed = 0
        while misses < 200:
            seq = self.new_arrival(self.rng.randrange(len(pods)))
            if self.try_place(seq):
                placed += 1
                misses = 0
            else:
                misses += 1
        return placed

    def totals(self, node: int) -> Totals:
        n = self.workload.nodes[node]
        view = self.tl.cluster.view(node)
        gpu_cap = sum(n.gpus)
        gpu_free = sum(f for _, f in view[0])
        cpu_used = 0 if n.cpu is None else n.cpu - view[1]
        mem_used = 0 if n.memory is None else n.memory - view[2]
        return Totals(gpu_cap, n.cpu, n.memory, gpu_cap - gpu_free, cpu_used, mem_used)

    def dry_runs(self, seq: int) -> tuple[Candidate | None, tuple[str, list[PodOnNode]] | None, list[int]]:
        """(ours, kube-scheduler's (node, victims)) for arrival `seq` on the current state, each over the
        nodes from one offset until enough candidates are found; also the nodes kube-scheduler's dry run
        made candidates of (those the preempt verb would be sent)."""
        tl = self.tl
        pod = tl.arrivals[seq].pod
        priority = tl.pod_priority[pod]
        demand = tl.cluster.demands[tl.cluster.pod_demand[pod]]
        n = len(self.workload.nodes)
        want = num_candidates(n)
        offset = self.rng.randrange(n)
        ours: list[Candidate] = []
        kube: list[tuple[tuple, str, list[PodOnNode]]] = []
        kube_nodes: list[int] = []
        gpu = demand.per_gpu * demand.count
        for k in range(n):
            if len(ours) >= want and len(kube) >= want:
                break
            node = (offset + k) % n
            pn = tl.preemption_node(node, {})
            if len(ours) < want:
                found = choose_victims([pn], demand, priority)
                if found and found[0].victims:
                    ours.append(found[0])
            if len(kube) < want:
                victims = kube_select_victims(pn, self.totals(node), gpu, demand.cpu, demand.memory, priority)
                if victims:
                    kube.append((rank_key(victims, 0, pn.name), pn.name, victims))
                    kube_nodes.append(node)
        best_ours = min(ours, key=lambda c: c.key) if ours else None
        best_kube = min(kube, key=lambda c: c[0]) if kube else None
        return best_ours, (best_kube[1], best_kube[2]) if best_kube else None, kube_nodes

    def kube_places(self, seq: int, node_name: str, victims: list[PodOnNode]) -> bool:
        """Whether, with kube-scheduler's victims gone, the preemptor fits GPUs of that node (per GPU)."""
        tl = self.tl
        node = tl.node_index[node_name]
        gpus, cpu_free, mem_free = tl.cluster.view(node)
        free = [f for _, f in gpus]
        for v in victims:
            for index, units in v.gpus:
                free[index] += units
            cpu_free = None if cpu_free is None else cpu_free + v.cpu
            mem_free = None if mem_free is None else mem_free + v.memory
        view = (tuple((m, free[i]) for i, (m, _) in enumerate(gpus)), cpu_free, mem_free)
        demand = tl.cluster.demands[tl.cluster.pod_demand[tl.arrivals[seq].pod]]
        return eligible_positions(view, demand) is not None

    def apply(self, seq: int, cand: Candidate) -> bool:
        """Evict our victims and place the preemptor on the node's GPUs the policy picks there; True when
        those are the GPUs the victims freed."""
        tl = self.tl
        for v in cand.victims:
            tl.release(int(v.uid))
        node = tl.node_index[cand.node]
        ev = tl.cluster.evaluation(tl.cluster.node_state[node], tl.cluster.pod_demand[tl.arrivals[seq].pod])
        if ev is None:
            return False
        tl.place(seq, node, ev[1])
        return set(ev[1]) == set(cand.gpus)


def verb_latency(bench: Bench, cases: list[tuple[int, list[int]]]) -> dict:
    """The preempt path's latency over an extender ClusterCache holding the bench's cluster (see the module
    docstring): per call, the candidate nodes' states and pods read from the cache, the victims chosen."""
    from tests.unit.sim.live_cache import cache_from_timeline
    from tests.unit.sim.live_cache import live_demand
    from tests.unit.sim.live_cache import live_preemption_node

    tl = bench.tl
    cache, pod_of_seq = cache_from_timeline(tl)
    wall, cpu = [], []
    for seq, nodes in cases:
        pod = tl.arrivals[seq].pod
        demand = live_demand(tl.cluster.demands[tl.cluster.pod_demand[pod]])
        priority = tl.pod_priority[pod]
        t0, c0 = time.perf_counter(), time.thread_time()
        pns = [live_preemption_node(cache, tl.node_names[n]) for n in nodes]
        choose_victims([p for p in pns if p is not None], demand, priority)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    if not wall:
        return {"calls": 0}
    wall.sort()
    cpu.sort()
    return {
        "calls": len(wall),
        "nodes_per_call_mean": round(sum(len(n) for _, n in cases) / len(cases), 1),
        "cpu_p50_ms": round(percentile(cpu, 50) * 1e3, 2),
        "cpu_p99_ms": round(percentile(cpu, 99) * 1e3, 2),
        "wall_p50_ms": round(percentile(wall, 50) * 1e3, 2),
        "wall_p99_ms": round(percentile(wall, 99) * 1e3, 2),
        "wall_max_ms": round(wall[-1] * 1e3, 2),
        "pods_in_cache": len(pod_of_seq),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    ap.add_argument("--cluster-nodes", type=int, default=1000)
    ap.add_argument("--preemptors", type=int, default=300, help="preemptors to evaluate (pods that fit nowhere)")
    ap.add_argument("--policy", default="frag")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    full = load_openb(args.nodes, args.pods)
    rng = random.Random(f"nodes-{args.seed}")
    if args.cluster_nodes > len(full.nodes):
        raise SystemExit(f"--cluster-nodes {args.cluster_nodes}: the trace has {len(full.nodes)} nodes")
    picked = sorted(rng.sample(range(len(full.nodes)), args.cluster_nodes))
    workload = Workload(tuple(full.nodes[i] for i in picked), full.pods, unit=full.unit)
    bench = Bench(workload, args.policy, args.seed)
    t0 = time.perf_counter()
    filled = bench.fill()
    tl = bench.tl
    capacity = workload.gpu_capacity
    fill_pct = 100.0 * tl.used / capacity
    prio_mix = Counter(tl.pod_priority[tl.arrivals[s].pod] for s in tl.where)
    high = [k for k, p in enumerate(workload.pods) if p.priority > 0 and p.count > 0]

    ours = {"preemptors": 0, "placed": 0, "no_candidate": 0, "victims": 0, "victims_placed": 0, "off_gpu": 0}
    kube = {"no_candidate": 0, "proposals": 0, "placed": 0, "wasted_proposals": 0, "victims": 0, "wasted_victims": 0}
    kube_only_fragmentation = 0
    verb_cases: list[tuple[int, list[int]]] = []
    draws = 0
    while ours["preemptors"] < args.preemptors and draws < 50 * args.preemptors:
        draws += 1
        seq = bench.new_arrival(high[bench.rng.randrange(len(high))])
        if bench.try_place(seq):
            continue  # it fits: placed as any pod (the cluster stays full)
        ours["preemptors"] += 1
        mine, theirs, kube_nodes = bench.dry_runs(seq)
        if kube_nodes:  # kube-scheduler calls the verb only with the candidates its dry run found
            verb_cases.append((seq, kube_nodes))
        if theirs is None:
            kube["no_candidate"] += 1
            if mine is not None:
                kube_only_fragmentation += 1
        else:
            node_name, victims = theirs
            kube["proposals"] += 1
            kube["victims"] += len(victims)
            if bench.kube_places(seq, node_name, victims):
                kube["placed"] += 1
            else:
                kube["wasted_proposals"] += 1
                kube["wasted_victims"] += len(victims)
        if mine is None:
            ours["no_candidate"] += 1
            continue
        ours["victims"] += len(mine.victims)
        on_gpu = bench.apply(seq, mine)
        ours["placed"] += 1
        ours["victims_placed"] += len(mine.victims)
        ours["off_gpu"] += 0 if on_gpu else 1
    seconds = time.perf_counter() - t0
    latency = verb_latency(bench, verb_cases)

    def per(n: int, d: int) -> float | None:
        return round(n / d, 3) if d else None

    out = {
        "cluster": {
            "nodes": len(workload.nodes),
            "gpus": workload.gpu_count,
            "policy": args.policy,
            "seed": args.seed,
            "pods_placed_filling": filled,
            "gpu_allocated_pct": round(fill_pct, 2),
            "pods_by_priority": {str(k): v for k, v in sorted(prio_mix.items(), reverse=True)},
        },
        "preemptors": ours["preemptors"],
        "ours": {
            **ours,
            "evictions_per_placed_preemptor": per(ours["victims_placed"], ours["placed"]),
            "wasted_evictions": 0,
        },
        "kube_scheduler": {
            **kube,
            "evictions_per_placed_preemptor": per(kube["victims"], kube["placed"]),
            "wasted_evictions": kube["wasted_victims"],
            "pending_although_one_gpu_could_be_freed": kube_only_fragmentation + kube["wasted_proposals"],
        },
        "verb_latency": latency,
        "seconds": round(seconds, 1),
    }
    if not args.json:
        o, k = out["ours"], out["kube_scheduler"]
        print(
            f"{out['cluster']['nodes']} nodes, {out['cluster']['gpus']} GPUs, {args.policy}, filled to "
            f"{fill_pct:.1f}% of GPU ({filled} pods; by priority {out['cluster']['pods_by_priority']}); "
            f"{out['preemptors']} preemptors (priority 1-2 pods that fit nowhere)"
        )
        print(f"{'':<26}{'placed':>8}{'no cand.':>10}{'evictions':>11}{'per placed':>12}{'wasted ev.':>12}")
        print(
            f"{'ours (per GPU)':<26}{o['placed']:>8}{o['no_candidate']:>10}{o['victims']:>11}"
            f"{o['evictions_per_placed_preemptor'] or 0:>12.2f}{0:>12}"
        )
        print(
            f"{'kube-scheduler (total)':<26}{k['placed']:>8}{k['no_candidate']:>10}{k['victims']:>11}"
            f"{k['evictions_per_placed_preemptor'] or 0:>12.2f}{k['wasted_evictions']:>12}"
        )
        print(
            f"kube-scheduler: {k['wasted_proposals']} proposals whose victims free no GPU enough (preemptor stays "
            f"Pending), {kube_only_fragmentation} preemptors with no candidate where ours found one"
        )
        if latency.get("calls"):
            print(
                f"preempt path over the extender's cache: {latency['calls']} calls, "
                f"{latency['nodes_per_call_mean']} nodes each: CPU p50 {latency['cpu_p50_ms']} ms, p99 "
                f"{latency['cpu_p99_ms']} ms; wall p50 {latency['wall_p50_ms']} ms, p99 {latency['wall_p99_ms']} ms"
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
