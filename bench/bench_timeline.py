"""share-sim timeline: seconds per run per policy on the openb default trace (Poisson arrivals, one seed).

python bench/bench_timeline.py [--policy bestfit,binpack,random,fgd,frag] [--rho 0.9] [--days 3]
    [--warmup-days 1] [--cap-days 1] [--seed 0] [--profile N] [--occupancy]

Prints, per policy: CPU seconds of the run (process time: what the run costs whatever else the machine
does), wall seconds, arrivals, and CPU microseconds per arrival. `--profile N` also prints cProfile's N
costliest functions of each run. `--occupancy` also prints, per policy, how the 8-GPU nodes sit over the
measured window (mean count by GPUs in use, every 300 s), how often one drains to empty, and by the GPUs
in use there before, where share and whole-GPU pods land on them (docs/simulator.md: why frag starves
8-GPU pods under churn).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import CLASSES
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.timeline import simulate_timeline
from share_scheduler.sim.workload import load_openb

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"


class OccupancyTimeline(Timeline):
    """The timeline, counting how the nodes with `gpus` GPUs sit and where single-GPU pods land on them."""

    def __init__(self, *args, gpus: int = 8, step_s: float = 300.0, **kw) -> None:
        super().__init__(*args, **kw)
        self.big = {i for i, n in enumerate(self.workload.nodes) if len(n.gpus) == gpus}
        self.by_use = [0] * (gpus + 1)  # summed over samples: nodes with k GPUs in use
        self.onto = [0] * (gpus + 1)  # share/whole placements on a node with k GPUs in use before
        self.drains = 0
        self.samples = 0
        self._step = step_s
        self._next_count = self.warmup_s

    def _in_use(self, node: int) -> int:
        return sum(1 for _, f in self.cluster.view(node)[0] if f < self.workload.nodes[node].gpus[0])

    def place(self, seq: int, node: int, positions: tuple[int, ...]) -> None:
        pod_class = CLASSES[self.pod_class[self.arrivals[seq].pod]]
        if self.now >= self.warmup_s and node in self.big and pod_class in ("share", "whole"):
            self.onto[self._in_use(node)] += 1
        super().place(seq, node, positions)

    def release(self, seq: int) -> int:
        node = super().release(seq)
        if self.now >= self.warmup_s and node in self.big and self._in_use(node) == 0:
            self.drains += 1
        return node

    def _advance(self, t: float) -> None:
        while self._next_count <= t and self._next_count <= self.end_s:
            self.samples += 1
            for i in self.big:
                self.by_use[self._in_use(i)] += 1
            self._next_count += self._step
        super()._advance(t)

    def report(self) -> str:
        n = max(self.samples, 1)
        onto = max(sum(self.onto), 1)
        gpus = len(self.by_use) - 1
        free = sum((gpus - k) * v for k, v in enumerate(self.by_use)) / n
        return (
            f"  {gpus}-GPU nodes by GPUs in use 0..{gpus} (mean): "
            + " / ".join(f"{v / n:.1f}" for v in self.by_use)
            + f"; free GPUs on them {free:.0f}; drained to empty {self.drains}\n"
            + "  share/whole pods onto them by GPUs in use before, %: "
            + " / ".join(f"{100 * v / onto:.1f}" for v in self.onto)
            + f"; {self.classes_waiting()}"
        )

    def classes_waiting(self) -> str:
        return "waiting at the end: " + ", ".join(f"{c} {k}" for c, k in zip(CLASSES, self.waiting_count, strict=True))


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
    ap.add_argument("--occupancy", action="store_true", help="how the 8-GPU nodes sit, and where pods land on them")
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
        if args.occupancy:
            tl = OccupancyTimeline(workload, policy, arrivals, args.warmup_days * DAY, args.days * DAY, seed=args.seed)
            tl.run()
            result = tl.result()
        else:
            result = simulate_timeline(
                workload, policy, arrivals, args.warmup_days * DAY, args.days * DAY, seed=args.seed
            )
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        print(
            f"{name:<10}{cpu:>9.1f}{wall:>9.1f}{cpu / len(arrivals) * 1e6:>12.0f}{result.alloc_pct:>9.2f}", flush=True
        )
        if args.occupancy:
            print(tl.report())
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
            print(out.getvalue())


if __name__ == "__main__":
    main()
