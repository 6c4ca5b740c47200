"""Live equals simulated: one openb sample through the real kube-scheduler + extender and through share-sim.

A seeded sample of openb's nodes (the model mix kept) and a seeded arrival order drawn per share-sim's
protocol (CPU-only pods and pods that fit nowhere included) go through
- the real etcd, kube-apiserver and kube-scheduler (hack/build-k8s.sh) with our extender
  (`--policy binpack` or `frag`, `--memory-unit MiB`, filter keeps the best node) on bare nodes: pods
  are created one at a time, each waits until it is bound or found unschedulable (then it is deleted:
  in the protocol a pod that fits nowhere fails and the next arrives);
- share-sim's engine (`engine.simulate`) on the same nodes and the same arrivals in the same order,
  its policy built as share-sim builds it (one view: the extender sees the whole node, issue 31).
Every pod must land on the same node and GPUs both ways, CPU-only pods included, so the allocation
ratios agree exactly.

What the two sides are given so that they may agree:
- Units: a GPU is 1000 units both ways (openb's gpu_milli; the extender counts "MiB"); CPU in
  millicores both ways; memory in MiB in share-sim and in bytes in the extender (the trace's MiB as
  `Mi` requests: the same ratios).
- The workload frag learns: share-sim teaches the policy every arrival before the first one; the
  extender learns from the pods it lists, so every arrival is created first behind a scheduling gate,
  the extender is started then (its initial list teaches it all of them) and each gate is lifted in
  turn. Deleting a failed pod does not unlearn it, on either side.
- Ties: the extender's filter passes the one best node, ties to the lowest name; share-sim takes the
  first node in input order, and the sample is listed by name.
- CPU-only pods reach the extender like every pod of the profile (no managedResources: kube-scheduler's
  HTTPExtender.IsInterested) and are placed by the policy on the whole node, as in share-sim: no pins.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path

import pytest

from share_scheduler.sim.workload import SimNode
from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import load_openb
from tests.controlplane import ControlPlane
from tests.integration import livesim
from tests.integration.liverun import run_live

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

SEED = 7  # the first seed tried; see first_covering_sample
NODES = 32
TUNE = 1.3


def first_covering_sample(pods: Sequence[SimPod], nodes: Sequence[SimNode]) -> tuple[int, list[SimNode]]:
    """The sample of the first seed from SEED on whose arrivals hold CPU-only and multi-GPU pods.

    Deterministic for a given protocol; if share-sim's draws change, the test still covers every
    kind of pod rather than depend on one seed's luck."""
    for seed in range(SEED, SEED + 20):
        sample = list(livesim.sample_nodes(nodes, NODES, seed))
        arrived = [pods[k] for k in livesim.protocol_arrivals(Workload(tuple(sample), tuple(pods)), seed, TUNE)]
        if any(p.count == 0 for p in arrived) and any(p.count > 1 for p in arrived):
            return seed, sample
    raise AssertionError(f"no seed in {SEED}..{SEED + 19} draws both CPU-only and multi-GPU pods")


@pytest.fixture
def plane(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own per run: no other run's nodes or pods may be seen by this one."""
    with ControlPlane(tmp_path_factory.mktemp("live-vs-sim-plane"), k8s_bin_dir) as cp:
        yield cp


@pytest.mark.parametrize("policy", ["binpack", "frag"])
def test_live_placements_equal_share_sim(plane: ControlPlane, tmp_path: Path, policy: str) -> None:
    started = time.monotonic()
    trace = load_openb(livesim.OPENB / "openb_node_list_gpu_node.csv", livesim.OPENB / "openb_pod_list_default.csv")
    seed, nodes = first_covering_sample(trace.pods, trace.nodes)
    assert len({n.model for n in nodes}) >= 5, "the sample keeps openb's model mix"

    sim, arrivals, expected = livesim.simulate_sample(nodes, trace.pods, seed, TUNE, policy, as_live=True)
    assert sim.failed > 0, "the sample must reach pods that fit nowhere"
    cpu_only = sum(1 for p in arrivals if p.count == 0)
    multi = sum(1 for p in arrivals if p.count > 1)

    live = run_live(plane, tmp_path, policy, nodes, arrivals)

    live_pct = livesim.allocation_pct(nodes, arrivals, live)
    sim_pct = livesim.allocation_pct(nodes, arrivals, expected)
    differ = [
        f"arrival {i} ({arrivals[i].name}, {arrivals[i].per_gpu} x {arrivals[i].count}, cpu {arrivals[i].cpu}m): "
        f"live {live[i]}, sim {expected[i]}"
        for i in range(len(arrivals))
        if live[i] != expected[i]
    ]
    _, own_arrivals, own = livesim.simulate_sample(nodes, trace.pods, seed, TUNE, policy, as_live=False)
    assert own_arrivals == arrivals
    print(
        f"\nlive vs sim, {policy}, seed {seed}: {len(nodes)} nodes, {sum(len(n.gpus) for n in nodes)} GPUs, "
        f"{len(arrivals)} arrivals ({cpu_only} CPU-only, {multi} multi-GPU), "
        f"failed live {live.count(None)} / sim {sim.failed}; "
        f"allocation live {live_pct:.2f} % / sim {sim_pct:.2f} % (share-sim taught the whole trace: "
        f"{livesim.allocation_pct(nodes, arrivals, own):.2f} %); {time.monotonic() - started:.0f} s"
    )
    placed_cpu_only = [w for p, w in zip(arrivals, live, strict=True) if p.count == 0 and w is not None]
    assert placed_cpu_only and all(w[1] == () for w in placed_cpu_only), "CPU-only pods bound without GPUs"
    assert abs(live_pct - sim_pct) <= 1.0, f"allocation live {live_pct:.2f} % vs sim {sim_pct:.2f} %"
    assert not differ, f"{len(differ)} of {len(arrivals)} placements differ; first: " + "; ".join(differ[:5])
    assert 80.0 < live_pct <= 100.0
