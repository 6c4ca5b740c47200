"""The policy in DRA mode: the order a node's devices are published in, and the device the allocator takes.

kube-scheduler scores no devices (kubernetes/enhancements#4970): its structured allocator takes the first
device that fits, walking pools by name, each pool's slices, and each slice's `devices` in array order
(`allocateOne`, k8s.io/dynamic-resource-allocation/structured/internal/incubating). share-dra owns the
one slice of its node's one pool, so the array order is ours to set: listed in the order the policy would
pick them, first fit *is* the policy's pick.

One order serves every request size only where the policy's preference does not depend on the size.
`binpack` (best fit) is such a policy: listed fullest first (ties by index), the first GPU with room for
any size is the fullest that fits, which is binpack's choice. `spread` is the reverse. `frag`'s choice
depends on the size; the order lists the GPUs too full for the size asked most (`DeviceOrderer.probe`)
first, fullest first, then frag's pick for that size, its pick among the rest, and so on; for other
sizes first fit may differ from frag's pick
(`bench/bench_dra.py placement` measures what that costs; docs/dra.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from share_placement.model import Demand
from share_placement.model import NodeState
from share_placement.model import Policy
from share_placement.model import learns
from share_placement.model import model_allowed


def first_fit(order: tuple[int, ...], node: NodeState, demand: Demand) -> tuple[int, ...] | None:
    """The GPU indices the structured allocator gives `demand` on `node` with devices listed in `order`:
    for each of `count` shares, the first listed device not yet taken by this demand, healthy, of an
    allowed model, with `per_gpu` free (shares of one demand on distinct GPUs: the `distinctAttribute`
    constraint our multi-GPU claims carry). None when the node cannot take it. Host CPU and memory are
    kube-scheduler's NodeResourcesFit's business, not the allocator's: not checked here."""
    by_index = {g.index: g for g in node.gpus}
    chosen: list[int] = []
    for index in order:
        g = by_index.get(index)
        if g is None or not g.healthy or g.free < demand.per_gpu or not _allowed(demand, g.model):
            continue
        chosen.append(index)
        if len(chosen) == demand.count:
            return tuple(chosen)
    return None


def _allowed(demand: Demand, model: str) -> bool:
    return not demand.models or model_allowed(demand.models, model)


def device_order(policy: Policy, node: NodeState, probe: Demand) -> tuple[int, ...]:
    """Every GPU index of `node` in publishing order. First the GPUs a one-GPU `probe` share does not fit
    on, fullest first: first fit gives them only smaller shares, and best fit is what every packing
    policy does with those. Then the rest in the order the policy picks them for `probe` shares: its pick
    among all, then its pick among the rest, ... Unhealthy GPUs last. For binpack this is fullest first
    whatever the probe: first fit is then binpack's choice for every size."""
    one = replace(probe, count=1, models=(), cpu=0, memory=0)
    healthy = [g for g in node.gpus if g.healthy]
    tight = sorted((g for g in healthy if g.free < one.per_gpu), key=lambda g: (g.free, g.index))
    remaining = [g for g in healthy if g.free >= one.per_gpu]
    order = [g.index for g in tight]
    while remaining:
        chosen = policy.choose(replace(node, gpus=tuple(remaining), cpu_free=None, memory_free=None), one)
        if not chosen:
            break
        order.append(chosen[0])
        remaining = [g for g in remaining if g.index != chosen[0]]
    order += [g.index for g in sorted(remaining, key=lambda g: (g.free, g.index))]
    order += [g.index for g in node.gpus if not g.healthy]
    return tuple(order)


class DeviceOrderer:
    """The order share-dra publishes, for one policy, learning the sizes claims ask as they come.

    `probe` is, for a workload-aware policy (`frag`), the one-GPU size seen most often (1 unit until any
    is seen): the size whose placement the order gets exactly right; for the others 1 unit (every GPU
    with room, in the policy's order: exact for every size for `binpack` and `spread`)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.sizes: Counter[int] = Counter()
        self._gpu_unit = 0

    def observe(self, demand: Demand) -> None:
        if demand.count and demand.per_gpu > 0:
            self.sizes[demand.per_gpu] += demand.count
        self.policy.observe(demand)

    @property
    def probe(self) -> Demand:
        size = self.sizes.most_common(1)[0][0] if self.sizes and learns(self.policy) else 1
        return Demand(per_gpu=size)

    def order(self, node: NodeState) -> tuple[int, ...]:
        largest = max((g.total for g in node.gpus), default=0)
        if largest != self._gpu_unit and hasattr(self.policy, "set_gpu_unit"):
            # frag's gap price packs shares into GPUs of the largest size; a node agent knows its own.
            self.policy.set_gpu_unit(largest or None)
            self._gpu_unit = largest
        return device_order(self.policy, node, self.probe)
