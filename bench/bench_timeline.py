"""share-sim timeline: seconds per run per policy on the openb default trace (Poisson arrivals, one seed).

python bench/bench_timeline.py [--policy bestfit,binpack,random,fgd,frag] [--rho 0.9] [--days 3]
    [--warmup-days 1] [--cap-days 1] [--seed 0] [--profile N]

Prints, per policy: CPU seconds of the run (process time: what the run costs whatever else the machine
does), wall seconds, arrivals, and CPU microseconds per arrival. `--profile N` also prints cProfile's N
costliest functions of each run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.workload import load_openb

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default=str(DATA / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--pods", default=str(DATA / "openb_pod_list_default.csv"))
    ap.add_argument("--policy", default="bestfit,binpack,random,fgd,frag")
    ap.add_argument("--rho", type=float, default=0.9)
    ap.add_argument("--days", type=float, default=3.0)
    ap.add_argument("--warmup-days", type=float, default=1.0)
    ap.add_argument("--cap-days", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    args = ap.parse_args()
    workload = load_openb(args.nodes, args.pods)
    arrivals = poisson_arrivals(workload, args.rho, args.days, args.cap_days, args.seed)
    print(
        f"{len(workload.nodes)} nodes, {workload.gpu_count} GPUs; rho {args.rho:g}, {args.days:g} days "
        f"({args.warmup_days:g} warm-up), cap {args.cap_days:g} day, seed {args.seed}: {len(arrivals)} arrivals"
    )
    print(f"{'policy':<10}{'cpu s':>9}{'wall s':>9}{'us/arrival':>12}{'alloc %':>9}")
    for name in args.policy.split(","):
        profiler = cProfile.Profile() if args.profile else None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        policy = build_policy(name, args.seed, workload)
        result = simulate_timeline(workload, policy, arrivals, args.warmup_days * DAY, args.days * DAY, seed=args.seed)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        print(
            f"{name:<10}{cpu:>9.1f}{wall:>9.1f}{cpu / len(arrivals) * 1e6:>12.0f}{result.alloc_pct:>9.2f}", flush=True
        )
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
            print(out.getvalue())


if __name__ == "__main__":
    main()
