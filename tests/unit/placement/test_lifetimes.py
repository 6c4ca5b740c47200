"""Reservations weighed by time: run times learned from departures (share_placement.lifetimes) and the
node whose blocking pods are expected to leave soonest (share_placement.starvation.ready_in)."""

from __future__ import annotations

import math

import pytest

from share_core.holds import HoldKind
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement.lifetimes import GRID
from share_placement.lifetimes import Lifetimes
from share_placement.starvation import ReservationLimits
from share_placement.starvation import Waiter
from share_placement.starvation import plan_reservations
from share_placement.starvation import ready_in
from share_placement.starvation import reservation_node
from share_placement.starvation import shortfall

FULL = 1000
FOUR = Demand(FULL, 4)


def node(name: str, frees: list[int]) -> NodeState:
    return NodeState(name, tuple(GpuSlot(i, "T4", FULL, f) for i, f in enumerate(frees)))


# -- what the run times say ------------------------------------------------------------------------------


def at_grid(seconds: float) -> float:
    """The first of GRID at or past `seconds`: the times gone_by answers in."""
    return next(t for t in GRID if t >= seconds)


def test_a_pod_is_likely_gone_once_half_the_runs_longer_than_its_age_have_ended():
    life = Lifetimes(min_samples=3)
    for ran in (60, 600, 3600, 86400):
        life.observe(ran)
    assert life.ready
    # A new pod: half the runs end by 600 s.
    assert life.gone_by([0]) == at_grid(600)
    # Run 10 minutes: the runs longer are the hour and the day; half of them end by the hour: 3000 s on.
    assert life.gone_by([600]) == at_grid(3000)
    # Run two hours: only the day is longer; it is gone when the day ends.
    assert life.gone_by([7200]) == at_grid(86400 - 7200)


def test_several_pods_are_all_gone_later_than_each_alone():
    life = Lifetimes(min_samples=1)
    for ran in range(1, 101):
        life.observe(ran * 60.0)  # runs of 1 to 100 minutes, evenly
    alone = life.gone_by([0])
    eight = life.gone_by([0] * 8)
    # One new pod is gone by 50 minutes at even odds; eight all gone only once each is gone with odds
    # 0.5 ** (1/8) ~ 0.917: by ~92 minutes.
    assert alone == at_grid(50 * 60)
    assert eight == at_grid(92 * 60)
    assert life.gone_by([]) == 0.0
    assert life.gone_by([-1.0, -1.0]) == 0.0  # terminating: gone now
    assert life.gone_by([-1.0, 0.0]) == alone


def test_a_pod_older_than_every_run_seen_is_taken_to_run_as_long_again():
    life = Lifetimes(min_samples=1)
    life.observe(100)
    assert life.gone_by([5000]) == at_grid(5000)
    assert life.gone_by([100]) == at_grid(100)  # none longer than 100: as long again
    assert life.gone_by([10**7]) == 10**7  # past the grid: its age


def test_it_knows_nothing_until_enough_pods_left_and_forgets_the_oldest_runs():
    life = Lifetimes(keep=3, min_samples=2)
    assert not life.ready
    with pytest.raises(ValueError, match="no run time"):
        life.gone_by([0])
    life.observe(10)
    assert not life.ready
    for ran in (1000, 1000, 1000):
        life.observe(ran)
    assert life.ready and len(life) == 3
    assert life.gone_by([0]) == at_grid(1000)  # the 10 s run fell out
    life.observe(-5)  # clock skew: ignored
    life.observe(math.inf)
    assert len(life) == 3


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="keep >= 1"):
        Lifetimes(keep=0)
    with pytest.raises(ValueError, match="min_samples >= 1"):
        Lifetimes(min_samples=0)


# -- the node ready soonest --------------------------------------------------------------------------------


def by_age(ages) -> float:
    """A stand-in for Lifetimes.gone_by: a pod of age a leaves at 1000 - a (so older pods leave sooner),
    all of them when the last does."""
    return max((1000.0 - a for a in ages), default=0.0)


def test_a_gpu_is_ready_when_the_pods_that_must_go_have_gone():
    # GPU 0: two 500-unit pods aged 900 and 100 (gone in 100 and 900 s): both must go for a whole GPU.
    # GPU 1: one 400-unit pod aged 400 (600 free): gone in 600 s. GPUs 2 and 3 free.
    n = node("a", [0, 600, FULL, FULL])
    leaving = [((0,), 500, 100.0), ((0,), 500, 900.0), ((1,), 400, 400.0)]
    sf = ready_in(n, FOUR, leaving, by_age)
    assert (sf.eta, sf.short, sf.drain, sf.gpus) == (900.0, 2, 1400, (0, 1, 2, 3))
    # A 3-GPU pod takes the three ready soonest: 2, 3 (now), then 1 (600 s), not 0.
    sf = ready_in(n, Demand(FULL, 3), leaving, by_age)
    assert (sf.eta, sf.short, sf.drain, sf.gpus) == (600.0, 1, 400, (1, 2, 3))
    # A half-GPU share on GPU 0 needs only the pod likely gone first to leave.
    assert ready_in(node("b", [0]), Demand(500, 1), leaving[:2], by_age).eta == 100.0


def test_the_node_is_ready_when_the_pods_of_all_its_chosen_gpus_are_gone_together():
    # Two GPUs, each behind one new pod: with real run times both are gone later than either alone.
    life = Lifetimes(min_samples=1)
    for ran in range(1, 101):
        life.observe(ran * 60.0)
    n = node("a", [0, 0])
    sf = ready_in(n, Demand(FULL, 2), [((0,), FULL, 0.0), ((1,), FULL, 0.0)], life.gone_by)
    assert sf.eta == life.gone_by([0.0, 0.0]) > life.gone_by([0.0])


def test_a_gpu_whose_known_pods_never_free_enough_is_never_ready():
    # GPU 0 is full but only 500 units of pods are known there (or the rest is held): never ready.
    n = node("a", [0, FULL])
    assert ready_in(n, Demand(FULL, 2), [((0,), 500, 60.0)], by_age).eta == math.inf
    # Held units count as taken even after every pod left.
    assert ready_in(n, Demand(FULL, 2), [((0,), FULL, 60.0)], by_age, held={0: 500}).eta == math.inf
    assert ready_in(node("small", [FULL]), Demand(FULL, 2), [], by_age) is None


def test_the_reservation_goes_where_pods_are_likely_gone_soonest_not_fewest_gpus_short():
    # "one-short": one GPU short, behind a pod that has only begun (gone in 1000 s).
    # "two-short": two GPUs short, behind pods about to end (aged 900 and 950: gone in 100 s).
    nodes = [node("one-short", [FULL] * 3 + [0]), node("two-short", [FULL] * 2 + [0, 0])]
    leaving = {"one-short": [((3,), FULL, 0.0)], "two-short": [((2,), FULL, 950.0), ((3,), FULL, 900.0)]}
    assert reservation_node(nodes, FOUR).node == "one-short"  # without run times: fewest short
    assert reservation_node(nodes, FOUR, leaving=leaving).node == "one-short"  # no gone_by: the same
    sf = reservation_node(nodes, FOUR, leaving=leaving, gone_by=by_age)
    assert (sf.node, sf.eta) == ("two-short", 100.0)
    # A node where it fits now beats any wait; ties in time fall back to fewest short, then the name.
    nodes.append(node("free", [FULL] * 4))
    assert reservation_node(nodes, FOUR, leaving=leaving, gone_by=by_age).node == "free"
    # Nodes with nothing known about their pods rank after every node with a finite time.
    two = {"two-short": leaving["two-short"]}
    assert reservation_node(nodes[:2], FOUR, leaving=two, gone_by=by_age).node == "two-short"
    assert reservation_node(nodes[:2], FOUR, leaving={}, gone_by=by_age).node == "one-short"


def test_plan_reservations_holds_the_gpus_ready_soonest_and_records_the_shortfall_as_made():
    n = node("a", [FULL, FULL, FULL, 0, 0, FULL, FULL, FULL])  # GPUs 3 and 4 busy
    leaving = {"a": [((3,), FULL, 0.0), ((4,), FULL, 950.0)]}
    w = Waiter("big", "default/big", 0, 0.0, Demand(FULL, 8))
    limits = ReservationLimits(after_s=0, max_holds=4, max_share=1.0)
    [hold] = plan_reservations([w], [n], [], 100.0, limits, leaving=leaving, gone_by=by_age)
    assert hold.kind is HoldKind.RESERVATION and hold.node == "a" and hold.gpus == tuple(range(8))
    made = shortfall(n, w.demand)
    assert hold.shortfall == (made.short, made.drain) == (2, 2000)
    # A 7-GPU pod leaves out the GPU whose pod runs longest.
    w7 = Waiter("seven", "default/seven", 0, 0.0, Demand(FULL, 7))
    [hold] = plan_reservations([w7], [n], [], 100.0, limits, leaving=leaving, gone_by=by_age)
    assert hold.gpus == (0, 1, 2, 4, 5, 6, 7)
