"""Policy cost at extender scale: score 5,000 nodes x 8 GPUs for one pod (filter's pass), then bind.

Units as in the extender (GiB). Node states are drawn from a seeded, realistic mix (whole GiB, many
nodes empty or full, as in a busy cluster). Workload-aware policies (`frag`, `fgd`) first learn 2,000
pods through observe(). Then `--binds` pods arrive: each is scored against every node (what filter
does with `--filter-keeps best`), bound to the best node with choose(), and the node's GPUs are
updated, so the cluster changes as it would. Reported per policy:

- cold: the very first pod (every cache empty);
- p50 / p99: over all pods, which include the first request of every size (cold for that size);
- new size: a request of a size never seen before, on the warmed-up cluster;
- learned new: a request of another new size that the policy observed first, as the extender's informer
  sees a pending pod before filter asks about it: for `frag` a new class table, and its LP gap prices
  solved (`share_placement/patterns.py`), within that first pass;
- bind: choose() on the chosen node, mean microseconds;
- p99 cpu: the p99 pod's scoring pass in CPU time of the scoring thread (the worst pod, as p99 is over
  fewer than 100 pods), for comparisons on a machine other jobs share.

The garbage collector is set up as the server sets it up once its cache is built
(`syncer.settle_gc`: the objects built so far frozen, rarer collections); `--default-gc` leaves
CPython's defaults, under which full collections walk every memo every few pods.

    python bench/bench_policy.py [--nodes 5000] [--binds 40] [--policy frag,binpack] [--default-gc] [--per-pod]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from share_placement import POLICIES
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import make_policy
from share_scheduler.syncer import settle_gc

SIZES = (4, 8, 10, 16, 20, 40, 80)
NEW_SIZE = 12  # never drawn above: the "first request of a new size" on a warm cluster
LEARNED_SIZE = 24  # never drawn either: observed first, then asked for ("learned new")


def cluster(n: int, rng: random.Random) -> list[NodeState]:
    nodes = []
    for i in range(n):
        kind = rng.random()
        gpus = []
        for g in range(8):
            if kind < 0.3:
                free = 80
            elif kind < 0.5:
                free = 0
            else:
                free = max(0, 80 - sum(rng.choice(SIZES) for _ in range(rng.randint(0, 3))))
            gpus.append(GpuSlot(g, "NVIDIA A100-SXM4-80GB", 80, free, healthy=rng.random() > 0.002))
        nodes.append(NodeState(f"node-{i}", tuple(gpus)))
    return nodes


def one_pod(policy, nodes: list[NodeState], demand: Demand, cpu: list[float] | None = None) -> tuple[float, float]:
    """(seconds to score every node, seconds to choose GPUs on the best); binds in `nodes`.
    `cpu` gets the scoring pass's CPU seconds (this thread's), which other jobs on the machine
    inflate far less than the wall-clock figure."""
    t0, c0 = time.perf_counter(), time.thread_time()
    best, best_i, best_score = None, -1, float("-inf")
    for i, node in enumerate(nodes):
        s = policy.score(node, demand)
        if s > best_score:
            best, best_i, best_score = node, i, s
    t1 = time.perf_counter()
    if cpu is not None:
        cpu.append(time.thread_time() - c0)
    if best is None:
        return t1 - t0, 0.0
    chosen = policy.choose(best, demand)
    t2 = time.perf_counter()
    if chosen:
        gpus = tuple(
            GpuSlot(g.index, g.model, g.total, g.free - demand.per_gpu, g.healthy) if g.index in chosen else g
            for g in best.gpus
        )
        nodes[best_i] = NodeState(best.name, gpus, best.cpu_free, best.memory_free)
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--binds", type=int, default=40)
    ap.add_argument("--policy", default=",".join(POLICIES))
    ap.add_argument("--default-gc", action="store_true", help="leave the garbage collector as CPython sets it")
    ap.add_argument("--per-pod", action="store_true", help="also print every pod's size and scoring time (ms)")
    ap.add_argument("--gap-weight", type=float, help="frag's gap_weight (default: frag's own; 0: no LP gap price)")
    args = ap.parse_args()
    print(f"{args.nodes} nodes x 8 GPUs; per pod: score every node (ms), then choose on the best (us)")
    print(
        f"{'policy':<10}{'cold':>9}{'p50':>9}{'p99':>9}{'new size':>10}{'per node (us)':>15}{'bind (us)':>11}"
        f"{'p99 cpu':>9}{'learned new':>13}"
    )
    for name in args.policy.split(","):
        rng = random.Random(1)
        nodes = cluster(args.nodes, rng)
        demands = [Demand(rng.choice(SIZES), 1 if rng.random() < 0.95 else 2) for _ in range(args.binds)]
        policy = (
            make_policy(name, gap_weight=args.gap_weight)
            if name == "frag" and args.gap_weight is not None
            else make_policy(name)
        )
        for _ in range(2000):
            policy.observe(Demand(rng.choice(SIZES), 1 if rng.random() < 0.95 else 2))
        if not args.default_gc:
            settle_gc()  # as the server does once its cache is built
        scores, binds, cpu = [], [], []
        for d in demands:
            s, b = one_pod(policy, nodes, d, cpu)
            scores.append(s)
            binds.append(b)
        new_size, _ = one_pod(policy, nodes, Demand(NEW_SIZE))
        policy.observe(Demand(LEARNED_SIZE))
        learned, _ = one_pod(policy, nodes, Demand(LEARNED_SIZE))
        ordered = sorted(scores)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        p50 = statistics.median(scores)
        print(
            f"{name:<10}{scores[0] * 1e3:>9.1f}{p50 * 1e3:>9.1f}{p99 * 1e3:>9.1f}{new_size * 1e3:>10.1f}"
            f"{p50 / args.nodes * 1e6:>15.2f}{statistics.mean(binds) * 1e6:>11.1f}{max(cpu) * 1e3:>9.1f}"
            f"{learned * 1e3:>13.1f}"
        )
        if args.per_pod:
            print("  " + " ".join(f"{d.per_gpu}x{d.count}:{s * 1e3:.1f}" for d, s in zip(demands, scores, strict=True)))
        if not args.default_gc:
            gc.unfreeze()  # the next policy starts from the same state


if __name__ == "__main__":
    main()
