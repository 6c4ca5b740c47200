"""The live timeline's figures are share-sim's: a live run that happened exactly as share-sim decided, fed to
`livetimeline.live_figures` (share-sim's Timeline told the events instead of deciding them), gives
share-sim's figures to the digit; and a live placement that overfills a GPU is refused, not counted."""

from __future__ import annotations

import pytest

from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.timeline import DAY
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import poisson_arrivals
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import load_openb
from tests.integration import livesim
from tests.integration.livefigures import PodRecord
from tests.integration.livefigures import live_figures


class Recording(Timeline):
    """share-sim's own run, writing down what a live run would record (times in simulated seconds)."""

    def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.records = [PodRecord(created=a.time) for a in self.arrivals]

    def place(self, seq: int, node: int, positions: tuple[int, ...]) -> None:
        super().place(seq, node, positions)
        r = self.records[seq]
        r.bound, r.node, r.gpus = self.now, self.workload.nodes[node].name, tuple(sorted(positions))
        r.waited = self.now > self.arrivals[seq].time

    def release(self, seq: int) -> int:
        self.records[seq].deleted = self.now
        return super().release(seq)


@pytest.fixture(scope="module")
def sample() -> tuple[Workload, list]:
    trace = load_openb(livesim.OPENB / "openb_node_list_gpu_node.csv", livesim.OPENB / "openb_pod_list_default.csv")
    workload = Workload(livesim.sample_nodes(trace.nodes, 24, 3), trace.pods)
    return workload, poisson_arrivals(workload, 1.0, 0.125, 1 / 48, seed=3)


def test_a_run_as_share_sim_decided_it_has_share_sims_figures(sample: tuple[Workload, list]) -> None:
    workload, arrivals = sample
    policy = build_policy("binpack", 3, workload)
    warmup, end = 0.03 * DAY, 0.125 * DAY
    sim = Recording(workload, policy, arrivals, warmup, end, seed=3)
    sim.run()
    expected = sim.result().figures()
    assert expected["classes"]["multi"]["waited_pct"], "the sample must make some pods wait"
    assert any(r.deleted is not None for r in sim.records)
    records = [r for r in sim.records if r.created is not None and r.created <= end]

    got = live_figures(workload, arrivals[: len(records)], records, warmup, end, policy, seed=3).figures()
    assert got == expected


def test_a_live_placement_that_overfills_a_gpu_is_refused(sample: tuple[Workload, list]) -> None:
    workload, arrivals = sample
    whole = [i for i, a in enumerate(arrivals) if workload.pods[a.pod].per_gpu == 1000][:2]
    node = workload.nodes[0].name
    records = [PodRecord(created=arrivals[i].time, bound=arrivals[whole[1]].time, node=node, gpus=(0,)) for i in whole]
    with pytest.raises(ValueError, match=rf"bound to {node} \(0,\) overfills it: GPU 0"):
        live_figures(workload, [arrivals[i] for i in whole], records, 0.0, DAY, build_policy("binpack", 0, workload))
