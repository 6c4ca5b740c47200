"""Issue 40's pure rules against hand-worked clusters: where a reservation goes, its bounds, what a
consolidation moves, and how a policy leaves room for the shapes that wait."""

from __future__ import annotations

import dataclasses

import pytest

from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import held_units
from share_core.holds import reservations_yield
from share_placement import BinpackPolicy
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import node_view
from share_placement.room import RoomForWaiting
from share_placement.room import closeness
from share_placement.room import hosted_shape
from share_placement.room import room_cost
from share_placement.starvation import ReservationLimits
from share_placement.starvation import Resident
from share_placement.starvation import Waiter
from share_placement.starvation import keeps_draining
from share_placement.starvation import plan_consolidation
from share_placement.starvation import plan_reservations
from share_placement.starvation import reservation_node
from share_placement.starvation import shortfall
from share_placement.waiting_shapes import WaitingShapes

FULL = 1000
EIGHT = Demand(FULL, 8)
FOUR = Demand(FULL, 4)


def node(name: str, frees: list[int], total: int = FULL, model: str = "T4") -> NodeState:
    return NodeState(name, tuple(GpuSlot(i, model, total, f) for i, f in enumerate(frees)))


def waiter(uid: str, demand: Demand, since: float = 0.0, priority: int = 0) -> Waiter:
    return Waiter(uid, f"default/{uid}", priority, since, demand)


# -- shortfall and the reservation's node ----------------------------------------------------------------


def test_shortfall_counts_the_gpus_short_and_the_units_to_drain_on_the_emptiest_gpus():
    # Four GPUs: two free, one with 700 free, one with 100 free. A 4-GPU pod is short two GPUs, and
    # 300 + 900 units must leave before it fits.
    sf = shortfall(node("a", [FULL, 700, FULL, 100]), FOUR)
    assert sf is not None
    assert (sf.short, sf.drain, sf.gpus) == (2, 1200, (0, 1, 2, 3))
    # Eight GPUs, two busy: the 4-GPU pod fits now on the four lowest-indexed free ones.
    sf = shortfall(node("b", [0, FULL, FULL, FULL, FULL, FULL, FULL, 0]), FOUR)
    assert (sf.short, sf.drain, sf.gpus) == (0, 0, (1, 2, 3, 4))


def test_a_node_with_too_few_gpus_can_never_take_the_pod():
    assert shortfall(node("small", [FULL, FULL]), FOUR) is None
    # GPUs too small for the share (16 GiB GPUs, a pod asking 24 GiB on each) never count.
    assert shortfall(node("t4", [16, 16, 16, 16], total=16), Demand(24, 2)) is None


def test_reservation_goes_to_the_node_fewest_gpus_short_then_least_to_drain():
    nodes = [
        node("far", [FULL] * 4 + [0] * 4),  # 4 short, 4000 to drain
        node("near-heavy", [FULL] * 7 + [0]),  # 1 short, 1000 to drain
        node("near-light", [FULL] * 7 + [600]),  # 1 short, 400 to drain
        node("two-short", [FULL] * 6 + [900, 900]),  # 2 short, 200 to drain: fewer units, more GPUs
    ]
    assert reservation_node(nodes, EIGHT).node == "near-light"
    # One reservation per node: with near-light taken, the next is near-heavy.
    assert reservation_node(nodes, EIGHT, taken={"near-light"}).node == "near-heavy"
    # Held units for others count as taken: near-light's free GPUs held by a higher-priority pod.
    held = {"near-light": {0: FULL, 1: FULL}}
    assert reservation_node(nodes, EIGHT, held=held).node == "near-heavy"


def test_no_node_can_take_it_no_reservation():
    assert reservation_node([node("a", [FULL] * 4)], EIGHT) is None


# -- reservations: who, where, how many --------------------------------------------------------------------


def nodes_for_reservations() -> list[NodeState]:
    return [node(f"n{i}", [FULL] * (7 - i) + [0] * (i + 1)) for i in range(6)]  # n0 1 short, n1 2, ...


def test_reservations_go_by_priority_then_wait_and_respect_the_threshold():
    nodes = nodes_for_reservations()
    limits = ReservationLimits(after_s=600, max_holds=10, max_share=1.0, ttl_s=3600)
    ws = [
        waiter("old-low", EIGHT, since=0, priority=0),
        waiter("new-high", EIGHT, since=100, priority=2),
        waiter("too-recent", EIGHT, since=900, priority=5),  # waited 100 s at now=1000
        waiter("share", Demand(300, 1), since=0),  # a GPU pod still; min_gpus is the caller's filter
    ]
    holds = plan_reservations(ws, nodes, [], now=1000, limits=limits)
    assert [(h.holder_uid, h.node) for h in holds] == [("new-high", "n0"), ("old-low", "n1"), ("share", "n2")]
    first = holds[0]
    assert first.kind is HoldKind.RESERVATION
    assert first.gpus == tuple(range(8)) and first.per_gpu == FULL and first.priority == 2
    assert first.expires == 1000 + 3600 and first.holder == "default/new-high"


def test_reservations_are_bounded_in_count_and_in_share_of_the_cluster():
    nodes = nodes_for_reservations()  # 6 nodes x 8 GPUs = 48,000 units
    ws = [waiter(f"w{i}", EIGHT, since=i) for i in range(5)]
    by_count = plan_reservations(ws, nodes, [], 1000, ReservationLimits(after_s=0, max_holds=2, max_share=1.0))
    assert [h.holder_uid for h in by_count] == ["w0", "w1"]
    # A share of 0.4 holds 19,200 units: two 8-GPU reservations (16,000), not three.
    by_share = plan_reservations(ws, nodes, [], 1000, ReservationLimits(after_s=0, max_holds=10, max_share=0.4))
    assert [h.holder_uid for h in by_share] == ["w0", "w1"]
    # Existing live reservations count against both bounds, and their nodes and holders are skipped.
    existing = by_share[:1]
    more = plan_reservations(ws, nodes, existing, 1000, ReservationLimits(after_s=0, max_holds=2, max_share=1.0))
    assert [(h.holder_uid, h.node) for h in more] == [("w1", "n1")]
    # An expired one counts for nothing: its holder gets one again.
    limits = ReservationLimits(after_s=0, max_holds=1, max_share=1.0)
    later = plan_reservations(ws[:1], nodes, existing, existing[0].expires, limits)
    assert [h.holder_uid for h in later] == ["w0"]


def test_a_reservation_due_to_expire_is_renewed_on_its_drained_node_before_its_room_goes_back():
    limits = ReservationLimits(after_s=600, max_holds=1, max_share=1.0, ttl_s=3600)
    # n0 had 2 GPUs short when the pod got it; under the hold one drained (only the pod's own hold
    # keeps small pods off it): n0 is 1 short now, n1 still 2.
    nodes = [node("n0", [FULL] * 7 + [0]), node("n1", [FULL] * 6 + [0, 0])]
    old = plan_reservations([waiter("big", EIGHT)], [node("n0", [FULL] * 6 + [0, 0]), nodes[1]], [], 1000, limits)
    assert [(h.node, h.expires) for h in old] == [("n0", 4600)]
    # Not due yet (the next pass, 60 s on, comes before the expiry): nothing.
    assert plan_reservations([waiter("big", EIGHT)], nodes, old, 4000, limits, renew_within=60) == []
    # Due: planned again as if its own hold were free, at the full count bound (max_holds 1), for
    # another ttl, on the node it drained.
    renewed = plan_reservations([waiter("big", EIGHT)], nodes, old, 4560, limits, renew_within=60)
    assert [(h.holder_uid, h.node, h.gpus, h.expires) for h in renewed] == [("big", "n0", tuple(range(8)), 8160)]
    # Without renew_within the pod keeps its hold to the end and gets none meanwhile (as before).
    assert plan_reservations([waiter("big", EIGHT)], nodes, old, 4560, limits) == []


def test_a_due_reservation_moves_when_another_node_is_now_sooner_and_never_onto_anothers():
    limits = ReservationLimits(after_s=0, max_holds=2, max_share=1.0, ttl_s=3600)
    holds = plan_reservations(
        [waiter("big", EIGHT, since=0), waiter("next", EIGHT, since=1)],
        [node("n0", [FULL] * 7 + [0]), node("n1", [FULL] * 6 + [0, 0]), node("n2", [0] * 8)],
        [],
        10,
        limits,
    )
    assert [(h.holder_uid, h.node, h.shortfall) for h in holds] == [
        ("big", "n0", (1, FULL)),
        ("next", "n1", (2, 2 * FULL)),
    ]
    # At the renewal n0 has drained half its last GPU (so big's hold is renewed), n1 (next's) has drained
    # and n2 emptied: big moves to n2, the soonest node no other reservation holds; next's hold is not
    # due and keeps n1.
    held = [node("n0", [FULL] * 7 + [FULL // 2]), node("n1", [FULL] * 8), node("n2", [FULL] * 8)]
    standing = [holds[0], dataclasses.replace(holds[1], expires=7200.0)]
    moved = plan_reservations(
        [waiter("big", EIGHT, since=0), waiter("next", EIGHT, since=1)], held, standing, 3590, limits, renew_within=60
    )
    assert [(h.holder_uid, h.node, h.expires, h.shortfall) for h in moved] == [("big", "n2", 3590 + 3600, (0, 0))]


def test_a_due_reservation_on_a_node_that_did_not_drain_is_not_renewed():
    """Its last pods run on (or a pod of higher priority took room there): the hold ends at its expiry,
    as before renewals, and the pod may then be held elsewhere; an older extender's hold, which
    recorded no shortfall, is never renewed either."""
    limits = ReservationLimits(after_s=0, max_holds=1, max_share=1.0, ttl_s=3600)
    nodes = [node("n0", [FULL] * 6 + [0, 0]), node("n1", [FULL] * 5 + [0, 0, 0])]
    old = plan_reservations([waiter("big", EIGHT)], nodes, [], 0, limits)
    assert [(h.node, h.shortfall) for h in old] == [("n0", (2, 2 * FULL))]
    for now_n0 in ([FULL] * 6 + [0, 0], [FULL] * 5 + [0, 0, 0]):  # as short as then; shorter than then
        later = [node("n0", now_n0), nodes[1]]
        assert not keeps_draining(old[0], later[0], EIGHT)
        assert plan_reservations([waiter("big", EIGHT)], later, old, 3590, limits, renew_within=60) == []
    drained = [node("n0", [FULL] * 6 + [FULL, 0]), nodes[1]]
    assert keeps_draining(old[0], drained[0], EIGHT)
    unrecorded = [dataclasses.replace(old[0], shortfall=None)]
    assert not keeps_draining(unrecorded[0], drained[0], EIGHT)
    assert plan_reservations([waiter("big", EIGHT)], drained, unrecorded, 3590, limits, renew_within=60) == []
    assert [h.node for h in plan_reservations([waiter("big", EIGHT)], drained, old, 3590, limits, renew_within=60)] == [
        "n0"
    ]


def test_a_renewal_keeps_the_bounds_the_old_hold_took():
    limits = ReservationLimits(after_s=0, max_holds=1, max_share=8 / 16, ttl_s=3600)
    nodes = [node("n0", [FULL] * 7 + [0]), node("n1", [FULL] * 6 + [0, 0])]  # 16 GPUs, 8 may be held
    old = plan_reservations([waiter("big", EIGHT, since=0)], nodes, [], 0, limits)
    # At the bounds: a newcomer gets nothing, the due holder gets its renewal (its own count and units),
    # its node having drained a little.
    nodes[0] = node("n0", [FULL] * 7 + [1])
    got = plan_reservations(
        [waiter("big", EIGHT, since=0), waiter("other", EIGHT, since=1)], nodes, old, 3590, limits, renew_within=60
    )
    assert [(h.holder_uid, h.node) for h in got] == [("big", "n0")]


def test_a_reservation_keeps_same_or_lower_priority_pods_off_its_gpus_only():
    hold = plan_reservations(
        [waiter("big", EIGHT, priority=1)], nodes_for_reservations(), [], 1000, ReservationLimits(0, 1, 1.0)
    )[0]
    assert held_units([hold], priority=1, uid="small") == {"n0": {g: FULL for g in range(8)}}
    assert held_units([hold], priority=0, uid="small") == {"n0": {g: FULL for g in range(8)}}
    assert held_units([hold], priority=2, uid="urgent") == {}
    assert held_units([hold], priority=1, uid="big") == {}


@pytest.mark.parametrize(
    ("count", "waited_s", "found_no_room", "after", "yields"),
    [
        (1, 31.0, True, 30.0, True),  # a share that found no room and waited past the bound
        (1, 30.0, True, 30.0, False),  # strictly longer: at S = 0 a pod at its first try sees the holds
        (1, 0.5, True, 0.0, True),  # S = 0: any small pod that already failed once
        (1, 600.0, False, 30.0, False),  # never found without room (its first try, or it fitted once)
        (2, 3600.0, True, 0.0, False),  # the pods reservations serve always see them
        (0, 60.0, True, 30.0, True),  # a CPU-only pod: no GPU taken either way
        (1, 3600.0, True, None, False),  # not configured: never
    ],
)
def test_reservations_yield_to_small_pods_that_found_no_room_and_waited(count, waited_s, found_no_room, after, yields):
    assert reservations_yield(count, 2, waited_s, after, found_no_room) is yields


def test_a_yielding_reservation_takes_nothing_while_other_holds_still_do():
    hold = plan_reservations(
        [waiter("big", EIGHT, priority=1)], nodes_for_reservations(), [], 1000, ReservationLimits(0, 1, 1.0)
    )[0]
    freed = Hold(HoldKind.PREEMPTION, "n1", (0,), 5, 1, 10_000.0, "vip")
    assert held_units([hold, freed], priority=1, uid="small", yielded=True) == {"n1": {0: 5}}
    assert held_units([hold, freed], priority=1, uid="small")["n0"] == {g: FULL for g in range(8)}


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="max_share"):
        ReservationLimits(max_share=1.5)
    with pytest.raises(ValueError, match="ttl_s"):
        ReservationLimits(ttl_s=0)


# -- consolidation ----------------------------------------------------------------------------------------------


def resident(uid: str, where: str, gpu: int, units: int, movable: bool = True, priority: int = 0) -> Resident:
    return Resident(uid, f"default/{uid}", where, (gpu,), Demand(units, 1), movable, priority=priority)


def consolidate(*args, **kwargs):
    """plan_consolidation's plan; its reason is checked where it matters."""
    plan, why = plan_consolidation(*args, **kwargs)
    assert (plan is None) == bool(why)
    return plan


def test_consolidation_moves_the_fewest_movable_pods_and_only_when_all_are_placed_again():
    # "tight": 4 GPUs, two busy with one small pod each; a 4-GPU pod waits. "spare": one GPU with 500
    # free, room for both small pods. Binpack puts each on spare's GPU 0.
    tight = node("tight", [FULL, FULL, 700, 800])
    spare = node("spare", [500, 0])
    residents = {
        "tight": [resident("s1", "tight", 2, 300), resident("s2", "tight", 3, 200)],
        "spare": [resident("big", "spare", 0, 500, movable=False), resident("x", "spare", 1, FULL, movable=False)],
    }
    plan = consolidate(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy(), max_moves=2)
    assert plan is not None
    assert plan.node == "tight" and plan.gpus == (0, 1, 2, 3)
    assert sorted((m.pod.uid, m.node, m.gpus) for m in plan.moves) == [("s1", "spare", (0,)), ("s2", "spare", (0,))]
    assert plan.units_moved == 500
    # The holds it asks for: the waiter's four GPUs, each moved pod's new GPU.
    holds = plan.holds(now=10, ttl_s=60)
    assert [(h.holder_uid, h.node, h.gpus, h.per_gpu) for h in holds] == [
        ("w", "tight", (0, 1, 2, 3), FULL),
        ("s1", "spare", (0,), 300),
        ("s2", "spare", (0,), 200),
    ]
    assert all(h.kind is HoldKind.CONSOLIDATION and h.expires == 70 for h in holds)


def test_consolidation_moves_at_most_k_pods():
    tight = node("tight", [FULL, FULL, 700, 800])
    spare = node("spare", [FULL, FULL])
    residents = {"tight": [resident("s1", "tight", 2, 300), resident("s2", "tight", 3, 200)]}
    assert consolidate(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy(), max_moves=1) is None
    assert consolidate(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy(), max_moves=2) is not None


def test_a_bare_pod_never_moves_nor_one_that_outranks_the_waiting_pod():
    tight = node("tight", [FULL, FULL, 700, 800])
    spare = node("spare", [FULL, FULL])
    residents = {"tight": [resident("s1", "tight", 2, 300), resident("bare", "tight", 3, 200, movable=False)]}
    plan, why = plan_consolidation(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy(), max_moves=4)
    assert plan is None and why == "no node can make room by moving at most 4 pod(s) that may move"
    outranks = {"tight": [resident("s1", "tight", 2, 300), resident("urgent", "tight", 3, 200, priority=1)]}
    assert consolidate(waiter("w", FOUR), [tight, spare], outranks, BinpackPolicy(), max_moves=4) is None
    assert consolidate(waiter("w", FOUR, priority=1), [tight, spare], outranks, BinpackPolicy(), max_moves=4)


def test_no_plan_when_the_pod_fits_already_or_asks_no_gpu():
    roomy = node("roomy", [FULL] * 4)
    plan, why = plan_consolidation(waiter("w", FOUR), [roomy], {}, BinpackPolicy())
    assert plan is None and why == "it fits node roomy already: nothing needs to move"
    plan, why = plan_consolidation(waiter("w", Demand(0, 0, cpu=1)), [roomy], {}, BinpackPolicy())
    assert plan is None and "CPU-only" in why


def test_no_plan_when_a_moved_pod_would_not_be_placed_again():
    # The only other room is 250 units: s1 (300) cannot go anywhere but back onto the GPUs the waiter needs.
    tight = node("tight", [FULL, FULL, 700, 800])
    spare = node("spare", [250])
    residents = {"tight": [resident("s1", "tight", 2, 300), resident("s2", "tight", 3, 200)]}
    plan, why = plan_consolidation(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy(), max_moves=2)
    assert plan is None and why == "the policy would not place every moved pod again (tried 1 node(s))"


def test_consolidation_prefers_the_node_needing_fewer_moves():
    one_move = node("one", [FULL, FULL, FULL, 600])
    two_moves = node("two", [FULL, FULL, 700, 800])
    spare = node("spare", [FULL])
    residents = {
        "one": [resident("a", "one", 3, 400)],
        "two": [resident("b", "two", 2, 300), resident("c", "two", 3, 200)],
    }
    plan = consolidate(waiter("w", FOUR), [two_moves, one_move, spare], residents, BinpackPolicy())
    assert plan is not None and plan.node == "one" and [m.pod.uid for m in plan.moves] == ["a"]


def test_holds_the_waiter_must_respect_count_in_the_plan():
    # spare's only GPU is held for someone else: s1 has nowhere to go.
    tight = node("tight", [FULL, FULL, FULL, 600])
    spare = node("spare", [FULL])
    residents = {"tight": [resident("s1", "tight", 3, 400)]}
    assert consolidate(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy()) is not None
    held = {"spare": {0: FULL}}
    assert consolidate(waiter("w", FOUR), [tight, spare], residents, BinpackPolicy(), held=held) is None


# -- room for what waits ------------------------------------------------------------------------------------------


def view_of(frees: list[int]):
    return node_view(node("v", frees))[0]


def test_closeness_is_one_over_one_plus_gpus_short():
    assert closeness(view_of([FULL] * 8), EIGHT) == 1.0
    assert closeness(view_of([FULL] * 7 + [0]), EIGHT) == 0.5
    assert closeness(view_of([FULL] * 5 + [0] * 3), EIGHT) == 0.25
    assert closeness(view_of([FULL] * 4), EIGHT) == 0.0  # too few GPUs: never


def test_room_cost_is_what_a_placement_takes_from_the_waiting_shapes():
    share = Demand(300, 1)
    seven_free = view_of([FULL] * 7 + [500])
    # On the half-used GPU (position 7): no full GPU lost, no cost.
    assert room_cost(seven_free, (7,), share, [EIGHT]) == 0.0
    # On a free GPU: 1 short becomes 2 short, closeness 1/2 -> 1/3.
    assert room_cost(seven_free, (0,), share, [EIGHT]) == pytest.approx(1 / 2 - 1 / 3)
    # The pod's own shape costs nothing (it is the one placed).
    assert room_cost(view_of([FULL] * 8), tuple(range(8)), EIGHT, [EIGHT]) == 0.0


def test_room_for_waiting_steers_a_pod_off_the_gpus_a_waiting_pod_needs():
    share = Demand(300, 1)
    nearly = node("nearly", [FULL] * 7 + [300])  # 1 GPU short of an 8-GPU pod; a GPU the share fills exactly
    scattered = node("scattered", [FULL] + [0] * 7)  # 7 short: far from an 8-GPU fit
    plain = BinpackPolicy()
    room = RoomForWaiting(BinpackPolicy())
    # Nothing waits: the wrapped policy exactly.
    assert room.score(nearly, share) == plain.score(nearly, share)
    assert room.set_waiting([EIGHT]) is True
    assert room.set_waiting([EIGHT, Demand(100, 1)]) is False  # only multi-GPU shapes count
    # On "nearly" binpack takes the 300-free GPU: no free GPU broken, so the wrapper agrees with binpack.
    assert room.choose(nearly, share) == (7,)
    assert room.score(nearly, share) == plain.score(nearly, share) > plain.score(scattered, share)
    # A whole-GPU pod must break a free GPU somewhere. Binpack prefers the fuller node, "nearly" (7,000
    # free against 7,300); but there it costs 1/2 - 1/3 of closeness, on "scattered" (7 short -> 8 short)
    # only 1/8 - 1/9: the wrapper sends it to "scattered".
    whole = Demand(FULL, 1)
    nearly_full = node("nearly", [FULL] * 7 + [0])
    scattered = node("scattered", [FULL] + [900] * 7)
    assert plain.score(nearly_full, whole) > plain.score(scattered, whole)
    assert room.score(scattered, whole) > room.score(nearly_full, whole)
    # Steered, never refused: it still fits "nearly" when that is all there is.
    assert room.choose(nearly_full, whole) == (0,)
    # The waiting shape gone: binpack's order again.
    assert room.set_waiting([]) is True
    assert room.score(nearly_full, whole) > room.score(scattered, whole)


def test_a_shape_is_narrowed_to_the_models_of_the_nodes_that_could_ever_host_it():
    # openb's 8-GPU nodes: G2 (96 cores), G3 (128), V100M32 (96), V100M16 (64); T4 nodes have 2 GPUs.
    hosts = [("G2", 8, 96_000, 384), ("G3", 8, 128_000, 768), ("V100M32", 8, 96_000, 768), ("V100M16", 8, 64_000, 256)]
    hosts.append(("T4", 2, 104_000, 512))
    big = Demand(FULL, 8, cpu=120_000, memory=720)
    assert hosted_shape(big, hosts).models == ("G3",)
    assert hosted_shape(Demand(FULL, 8, cpu=88_000, memory=320), hosts).models == ("G2", "G3", "V100M32")
    # Every model with 8 GPUs could host it: the shape is the pod's own (shapes stay merged).
    assert hosted_shape(Demand(FULL, 8, cpu=64_000, memory=256), hosts) == Demand(FULL, 8, cpu=64_000, memory=256)
    # Models the pod itself allows stay the bound; a share is never narrowed; no host at all: as it is.
    assert hosted_shape(Demand(FULL, 8, ("G2", "G3"), 120_000, 720), hosts).models == ("G3",)
    assert hosted_shape(Demand(500, 1, cpu=120_000), hosts) == Demand(500, 1, cpu=120_000)
    assert hosted_shape(Demand(FULL, 8, cpu=500_000), hosts) == Demand(FULL, 8, cpu=500_000)
    # A node that reports no CPU or memory could host anything of them.
    assert hosted_shape(big, [("G2", 8, None, None), ("G3", 8, 128_000, 768)]) == big
    # So room is left only where the pod could run: a share breaks a G2 node before a G3 one.
    room = RoomForWaiting(BinpackPolicy(), [hosted_shape(big, hosts)])
    g2, g3 = ((("G2", FULL),) * 8, None, None), ((("G3", FULL),) * 8, None, None)
    share = Demand(500, 1)
    assert room_cost(g2, (0,), share, room.shapes) == 0.0 < room_cost(g3, (0,), share, room.shapes)
    assert room.evaluate(g2, share)[0] > room.evaluate(g3, share)[0]


def test_room_for_waiting_prices_in_batch_as_it_evaluates():
    whole = Demand(FULL, 1)
    views = [view_of([FULL] * 7 + [0]), view_of([FULL] + [900] * 7), view_of([0, 0])]
    room = RoomForWaiting(BinpackPolicy())
    for shapes in ([], [EIGHT]):
        room.set_waiting(shapes)
        expected = [float("-inf") if (ev := room.evaluate(v, whole)) is None else ev[0] for v in views]
        assert room.scores(views, whole) == expected


def test_waiting_shapes_linger_after_their_last_pod_waited():
    shapes = WaitingShapes(linger_s=100)
    assert shapes.expires() == float("inf")
    # Only multi-GPU demands count, by shape (CPU and memory are not part of the room a pod needs).
    assert list(shapes.update([Demand(FULL, 8, cpu=4), Demand(300, 1)], 0.0)) == [EIGHT]
    assert shapes.expires() == 100.0
    assert list(shapes.update([FOUR], 50.0)) == [EIGHT, FOUR]
    # The eight-GPU shape last waited at 0: still there at 100, gone past it; four waited until 50.
    assert set(shapes.update([], 100.0)) == {EIGHT, FOUR}
    assert list(shapes.update([], 100.5)) == [FOUR]
    assert shapes.expires() == 150.0
    assert list(shapes.update([], 151.0)) == []
    with pytest.raises(ValueError, match="linger"):
        WaitingShapes(linger_s=-1)


def test_consolidation_frees_a_gpu_with_its_largest_movable_pod_first():
    # GPU 1 holds 300 + 700 units; a pod asking 600 on each of two GPUs needs only the 700 moved.
    busy = node("busy", [FULL, 0])
    spare = node("spare", [FULL])
    residents = {"busy": [resident("small", "busy", 1, 300), resident("large", "busy", 1, 700)]}
    plan = consolidate(waiter("w", Demand(600, 2)), [busy, spare], residents, BinpackPolicy(), max_moves=1)
    assert plan is not None and [(m.pod.uid, m.node) for m in plan.moves] == [("large", "spare")]
