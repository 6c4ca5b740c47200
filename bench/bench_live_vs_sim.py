"""Live versus simulated, as figures: one openb sample through the real kube-scheduler + extender and
through share-sim, and the allocation each reaches.

The same run as tests/integration/test_live_vs_sim.py (which asserts that every placement agrees),
with a choice the test cannot make: `--unpinned` leaves CPU-only pods to kube-scheduler, as the
cluster does today (they never reach the extender, and the gpushare-scheduler profile has no score
plugin left to rank them: it puts them on a random node they fit), instead of pinning each to the
node share-sim chose. Prints the allocation % (GPU units placed / capacity) live, simulated as the
extender sees the cluster, and simulated by share-sim's own protocol.

  python bench/bench_live_vs_sim.py                          # frag, 32 nodes, seed 7, pinned
  python bench/bench_live_vs_sim.py --unpinned --seeds 7,8,9
  python bench/bench_live_vs_sim.py --policy binpack --nodes 48
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from share_placement import POLICIES  # noqa: E402
from share_scheduler.sim.workload import load_openb  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402
from tests.integration import livesim  # noqa: E402
from tests.integration.liverun import run_live  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="frag", choices=sorted(POLICIES))
    ap.add_argument("--nodes", type=int, default=32, help="openb nodes in the sample (default 32)")
    ap.add_argument("--seeds", default="7", help="comma-separated seeds (sample and arrival order)")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--unpinned", action="store_true", help="leave CPU-only pods to kube-scheduler")
    args = ap.parse_args()
    trace = load_openb(livesim.OPENB / "openb_node_list_gpu_node.csv", livesim.OPENB / "openb_pod_list_default.csv")
    print(f"policy {args.policy}, {args.nodes} nodes, CPU-only pods {'unpinned' if args.unpinned else 'pinned'}")
    print("seed  arrivals  failed live/sim  allocation % live  as the extender sees it  share-sim's own  seconds")
    for seed in (int(s) for s in args.seeds.split(",")):
        nodes = list(livesim.sample_nodes(trace.nodes, args.nodes, seed))
        sim, arrivals, expected = livesim.simulate_sample(nodes, trace.pods, seed, args.tune, args.policy, True)
        _, _, own = livesim.simulate_sample(nodes, trace.pods, seed, args.tune, args.policy, False)
        pins = [
            None if args.unpinned or where is None or pod.count else where[0]
            for pod, where in zip(arrivals, expected, strict=True)
        ]
        with tempfile.TemporaryDirectory(prefix="gpushare-live-vs-sim-") as tmp:
            cp = ControlPlane(Path(tmp) / "cp", k8s_bin_dir())
            cp.start()
            started = time.monotonic()
            try:
                live = run_live(cp, Path(tmp), args.policy, nodes, arrivals, pins)
            finally:
                cp.stop()
        print(
            f"{seed:>4}  {len(arrivals):>8}  {live.count(None):>7}/{sim.failed:<7}  "
            f"{livesim.allocation_pct(nodes, arrivals, live):>17.2f}  "
            f"{livesim.allocation_pct(nodes, arrivals, expected):>23.2f}  "
            f"{livesim.allocation_pct(nodes, arrivals, own):>15.2f}  {time.monotonic() - started:>7.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
