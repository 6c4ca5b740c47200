"""The device order share-dra publishes and the allocator's first fit over it: with binpack's order,
first fit is binpack's own choice for every size."""

from __future__ import annotations

import random

from share_core.dra import claim_ask
from share_placement import BinpackPolicy
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import SpreadPolicy
from share_placement import make_policy
from share_placement.draorder import DeviceOrderer
from share_placement.draorder import device_order
from share_placement.draorder import first_fit
from tests.controlplane.draworkload import memory_claim


def node(frees: list[int], total: int = 16, healthy: tuple[int, ...] = ()) -> NodeState:
    return NodeState("n", tuple(GpuSlot(i, "T4", total, f, i not in healthy) for i, f in enumerate(frees)))


def test_first_fit_walks_the_order_and_keeps_shares_on_distinct_gpus() -> None:
    n = node([10, 2, 16, 8])
    assert first_fit((1, 3, 0, 2), n, Demand(4)) == (3,)
    assert first_fit((1, 3, 0, 2), n, Demand(4, count=2)) == (3, 0)
    assert first_fit((1, 3, 0, 2), n, Demand(12)) == (2,)
    assert first_fit((1, 3, 0, 2), n, Demand(17)) is None
    assert first_fit((0, 1), n, Demand(4, models=("a100",))) is None


def test_with_binpacks_order_first_fit_is_binpacks_choice_for_every_size() -> None:
    rng = random.Random(7)
    for policy in (BinpackPolicy(), SpreadPolicy()):
        for _ in range(300):
            n = node([rng.randint(0, 16) for _ in range(rng.randint(1, 8))])
            order = device_order(policy, n, Demand(1 if policy.name == "spread" else rng.randint(1, 16)))
            for size in range(1, 17):
                want = policy.choose(n, Demand(size))
                got = first_fit(order, n, Demand(size))
                assert (got is None) == (want is None)
                if want is not None:
                    # equal free memory: either GPU is the same choice
                    assert n.gpus[got[0]].free == n.gpus[want[0]].free, (policy.name, n, size, order)


def test_unhealthy_gpus_come_last_and_are_never_chosen() -> None:
    n = node([4, 8, 12], healthy=(0,))
    order = device_order(BinpackPolicy(), n, Demand(1))
    assert order[-1] == 0 and sorted(order) == [0, 1, 2]
    assert first_fit(order, n, Demand(2)) == (1,)


def test_the_orderer_probes_with_the_size_seen_most() -> None:
    orderer = DeviceOrderer(make_policy("frag"))
    for size in (4, 4, 8):
        orderer.observe(Demand(size))
    assert orderer.probe == Demand(4)
    n = node([5, 16, 9, 2])
    order = orderer.order(n)
    assert sorted(order) == [0, 1, 2, 3] and order[0] == 3  # too full for the probe: first, for smaller shares
    assert first_fit(order, n, Demand(4)) == orderer.policy.choose(n, Demand(4))
    assert DeviceOrderer(make_policy("binpack")).probe == Demand(1)  # exact for every size anyway


def test_claim_shapes_placement_can_price() -> None:
    assert claim_ask(memory_claim("ns", "a", 4)).mib == 4096
    two = memory_claim("ns", "b", 8, count=2, models=["T4", "A10"])
    ask = claim_ask(two)
    assert (ask.mib, ask.count, ask.models, ask.reason) == (8192, 2, ("T4", "A10"), "")
    other = memory_claim("ns", "c", 4)
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "example.com"
    assert claim_ask(other) is None
    cel = memory_claim("ns", "d", 4)
    cel["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": "device.driver != ''"}}]
    assert claim_ask(cel).models == ()  # CEL we cannot read: kube-scheduler enforces it, we rank as any model
