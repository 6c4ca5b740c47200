"""Per-bind policy cost at extender scale: score 5,000 nodes x 8 GPUs (prioritize), then choose (bind).

Units as in the extender (GiB). Node states are drawn from a seeded, realistic mix (whole GiB, many
nodes empty or full, as in a busy cluster). `frag` first learns 2,000 pods through observe(). Cold is
the first bind (empty memo); warm is the mean over the next binds, as in a running extender.

    python bench/bench_policy.py [--nodes 5000] [--binds 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from share_scheduler.placement import POLICIES, Demand, GpuSlot, NodeState, make_policy

SIZES = (4, 8, 10, 16, 20, 40, 80)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--binds", type=int, default=20)
    args = ap.parse_args()
    rng = random.Random(1)
    nodes = cluster(args.nodes, rng)
    demands = [Demand(rng.choice(SIZES), 1 if rng.random() < 0.95 else 2) for _ in range(args.binds + 1)]
    print(f"{args.nodes} nodes x 8 GPUs; per bind = score every node + choose on the best (ms)")
    print(f"{'policy':<10}{'cold':>10}{'warm':>10}{'per node (us)':>16}")
    for name in POLICIES:
        policy = make_policy(name)
        for _ in range(2000):
            policy.observe(Demand(rng.choice(SIZES), 1 if rng.random() < 0.95 else 2))
        times = []
        for d in demands:
            t0 = time.perf_counter()
            best, best_score = None, float("-inf")
            for node in nodes:
                s = policy.score(node, d)
                if s > best_score:
                    best, best_score = node, s
            if best is not None:
                policy.choose(best, d)
            times.append(time.perf_counter() - t0)
        warm = statistics.mean(times[1:])
        print(f"{name:<10}{times[0] * 1e3:>10.1f}{warm * 1e3:>10.1f}{warm / args.nodes * 1e6:>16.2f}")


if __name__ == "__main__":
    main()
