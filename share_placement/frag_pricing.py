"""frag's prices: what a placement costs in expected fragmentation and in LP-priced gaps, computed
incrementally (O(1) per changed GPU) and exactly (integers), so equal placements price equal.

The decisions that use these prices are `share_placement.frag.FragPolicy`'s; docs/simulator.md explains
each item of the price.

One piece: the exact prices and the caches that answer for them share one encoding of a node's state
(per model, free units, CPU bracket); a cache kept apart from the arithmetic whose integers it must give
back exactly (tests/unit/placement/test_frag_pricing.py compares them) would drift from it.
"""

from __future__ import annotations

from bisect import bisect_left
from bisect import bisect_right
from collections.abc import Iterable
from collections.abc import Sequence
from fractions import Fraction
from itertools import accumulate
from itertools import repeat
from operator import itemgetter
from typing import Any

from share_placement.model import MISSING
from share_placement.model import GpuView
from share_placement.model import model_allowed
from share_placement.model import room_at_least
from share_placement.patterns import GapPrices
from share_placement.workload import WorkloadTable

# Key sums of a node without CPU information: per multi-GPU key (models, per_gpu), (GPUs with room,
# their free capacity). What the single-GPU groups need is a sum over GPUs (see `Pricer`).
KeySums = tuple[tuple[int, int], ...]
# Per model on a node (see `Pricer.prefix`): the multi-GPU keys' per_gpu ascending, running sums `stay`
# and `cross_free`, per key `cross_usable` and `cross_const`, and per key the node's (room, usable).
Prefix = tuple[
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int, ...],
]


# `Pricer.node_sig`: (keys each GPU has room for, by free ascending; sole model or None; sorted frees).
NodeSig = tuple[tuple[int, ...], str | None, tuple[int, ...]]
# `Pricer.room_prefix`: `by_rooms`'s stay, cross_free, cross_usable, cross_const, then per key where
# room for it starts in the node's sorted frees.
RoomPrefix = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class _RoomsOf(dict):
    """free -> how many of the keys' per_gpu (ascending, `qs`) a GPU with that many units reaches."""

    def __init__(self, qs: tuple[int, ...]) -> None:
        super().__init__()
        self.qs = qs

    def __missing__(self, free: int) -> int:
        v = self[free] = bisect_right(self.qs, free)
        return v


class _GpuTerms(dict):
    """(model, free) -> one GPU's part of `fragmentation_units`'s per-group sums when every group is
    single-GPU, for one CPU class: (sum of ok x usable, of ok x per_gpu x slots, of CPU asked x slots)
    over the groups the GPU may serve (`ok`: pods of the group whose CPU fits; 0 below a share)."""

    def __init__(self, okw: tuple[tuple[tuple[str, ...], int, int, int], ...]) -> None:
        super().__init__()
        self.okw = okw

    def __missing__(self, gpu: tuple[str, int]) -> tuple[int, int, int]:
        m, f = gpu
        kept = fill = need = 0
        for models, per, ok, wcpu in self.okw:
            if f < per or (models and not model_allowed(models, m)):
                continue
            slots = f // per
            kept += ok * f
            fill += ok * per * slots
            need += wcpu * slots
        v = self[gpu] = (kept, fill, need)
        return v


def one_gpu_price(info: tuple[int, int, int], f: int, per: int, vals: Sequence[int], prefix: tuple[Any, ...]) -> int:
    """The exact price of taking `per` from one GPU with `f` free on a node: the GPU's own part
    (`Pricer.gpu_info`), the keys it keeps room for, and, for the keys it falls below, the node's
    usable capacity above each (`vals`: the node's frees sorted, `prefix`: its `room_prefix`)."""
    stay, cross_free, cross_usable, cross_const, idx = prefix
    d, lo, hi = info
    d += per * stay[lo]
    if hi > lo:
        d += f * (cross_free[hi] - cross_free[lo])
        for j in range(lo, hi):
            d += cross_usable[j] * sum(vals[idx[j] :]) + cross_const[j]
    return d


def key_change(frees: Iterable[int], per: int, q: int) -> tuple[int, int]:
    """Taking `per` from GPUs with these frees: the change of a multi-GPU key's (GPUs with room, their
    usable capacity), the key needing `q` per GPU. A GPU that keeps room loses `per` of usable
    capacity; one that falls below `q` leaves the room count and takes all its free capacity with it."""
    dr = du = 0
    for f in frees:
        if f >= q:
            if f - per >= q:
                du -= per
            else:
                dr -= 1
                du -= f
    return dr, du


class HostFacts:
    """What the host path (`FragPolicy._evaluate_host`) reads of one node's GPUs whatever the pod: kept per
    GPU state, since the timeline prices each state for many demands and CPU states."""

    __slots__ = ("bests", "distinct", "keyed", "partial", "strands", "sums")

    def __init__(self, gpus: GpuView, keyed: KeySums | None, bests: dict) -> None:
        # Each distinct GPU state once with its first position, in position order (the candidates).
        first: dict[tuple[str, int], int] = {}
        for i, g in enumerate(gpus):
            first.setdefault(g, i)
        self.distinct = tuple(first.items())
        self.keyed = keyed
        self.partial: tuple[int, ...] | None = None  # frees of the partly used GPUs (below the gap capacity)
        self.sums: dict[int, tuple[int, int, int, int]] = {}  # CPU class -> `Pricer.node_sums`
        self.strands: dict[tuple[frozenset[int], frozenset[int]], int] = {}  # hostable sets -> stranded
        # `FragPolicy._evaluate_host`'s answers (a share's best candidates, a CPU-only pod's price), shared
        # by every order of the same GPUs (`Pricer.host_facts`): prices read the GPUs as a multiset.
        self.bests: dict[tuple, tuple] = bests


class Pricer:
    """`fragmentation_units` changes without CPU information (the extender's case), in O(1) per GPU.

    Without CPU, a hostable single-GPU group keeps `weight x ((1 - w) x usable + w x per x slots)`,
    which is a sum over the node's GPUs (a group with no GPU with room keeps nothing either way): so
    all single-GPU groups together keep `sum over GPUs of V(model, free)`, and a share taken from one
    GPU changes it by `V(model, after) - V(model, free)`, whatever the rest of the node holds. A
    multi-GPU group keeps `A(room) x usable + B(room)` (zero below `count` GPUs with room), so it needs
    the node's (room, usable) per distinct (models, per_gpu) key: few keys, each a bisection. A
    placement's price is then a handful of integer operations per changed GPU, instead of a pass over
    every group for every candidate GPU, and equals `fragmentation_units(after) - ...(before)` exactly.
    A single-GPU share's price also carries the LP gap price (`gap`), an integer per (size, free) that
    every path adds alike.
    """

    def __init__(
        self, table: WorkloadTable, wa: int, wb: int, gap_weight: Fraction = Fraction(0), gpu_unit: int | None = None
    ) -> None:
        self.table = table
        # size -> (CPU, memory) a typical pod of that share size asks (`host_gap`); FragPolicy fills it
        # on the first priced placement that knows CPU (never in the extender, which does not).
        self.host_needs: dict[int, tuple[int, int]] | None = None
        self._interned: dict[frozenset[int], frozenset[int]] = {}
        self._need_breaks: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._hostable_cls: dict[tuple[int, int], frozenset[int]] = {}
        self._host_gaps: dict[int, int] = {}
        # id(view) -> what frag_scores keeps of a node state across demands (this table's prices)
        self.batch_facts: dict[int, tuple] = {}
        self.batch_fronts: dict[tuple[int, tuple[str, ...]], Any] = {}  # share shape -> frag_scores' _Fronts
        self.wa, self.keep_w = wa, wb - wa
        self.total_w = table.weight * wb  # units per unit of free capacity
        # The LP gap price (`gap`): solved on first use, once per table; None until then.
        self._gap_scale = gap_weight * self.total_w
        self._gpu_unit = gpu_unit
        self._gap_prices: GapPrices | None = None
        self._gaps: dict[int, dict[int, int] | None] = {}
        self.singles = tuple((g.models, g.per_gpu, g.weight) for g in table.groups if g.count == 1)
        multi: dict[tuple[tuple[str, ...], int], list[tuple[int, int]]] = {}
        for g in table.groups:
            if g.count != 1:
                multi.setdefault((g.models, g.per_gpu), []).append((g.count, g.weight))
        self.keys = tuple(sorted(multi))
        self._key_groups = tuple(tuple(multi[k]) for k in self.keys)
        self.values: dict[tuple[str, int], int] = {}
        self._by_model: dict[str, tuple[tuple[int, int], ...]] = {}
        self._ab: dict[tuple[int, int], tuple[int, int]] = {}
        self._by_rooms: dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], ...]] = {}
        self.state_prefixes: dict[tuple[GpuView, str], Prefix] = {}  # FragPolicy.prefix_of's memo
        self._crossing: tuple[list[tuple[int, int, int, int]], ...] = tuple([] for _ in self.keys)
        self._qs: dict[str, tuple[int, ...]] = {}
        self._single_loss: dict[int, dict[tuple[str, int], int]] = {}
        self.coef_rows: tuple[list[tuple[int, int]], ...] = tuple([] for _ in self.keys)
        self._unrestricted = all(not models for models, _ in self.keys)
        # With no key restricted to GPU models, every model sees every key, by per_gpu ascending.
        self.all_qs = tuple(sorted(q for _, q in self.keys)) if self._unrestricted else None
        self._multi_infos: dict[tuple[int, tuple[str, ...], str], dict] = {}
        self._gpu_infos: dict[tuple[int, tuple[str, ...], str], dict[int, tuple[int, int, int] | bool]] = {}
        # GPU view -> `node_sig`; FragPolicy hands it on to the next pricer while `all_qs` is the same.
        self.node_sigs: dict[GpuView, NodeSig] = {}
        self._rooms_of = _RoomsOf(self.all_qs or ())
        self.room_prefixes: dict[tuple[int, ...], RoomPrefix] = {}
        # With CPU known and every group single-GPU (no keys), `fragmentation_units` is a sum over the
        # node's GPUs of terms that depend on the GPU and on which classes' CPU fits (`cpu_class`).
        self._cpu_breaks = tuple(sorted({c for g in table.groups for c in g.cpus}))
        self._gpu_terms: dict[int, _GpuTerms] = {}
        # With keys, the host path adds the multi-GPU groups' part per key (`key_terms`, `HostFacts.keyed`).
        self._key_table_groups = tuple(
            tuple(g for g in table.groups if g.count != 1 and (g.models, g.per_gpu) == key) for key in self.keys
        )
        self._key_terms: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        self._host_facts: dict[GpuView, HostFacts] = {}
        self._host_bests: dict[GpuView, dict] = {}  # sorted GPUs -> `HostFacts.bests` of every order of them
        self._bests_size = 0
        # id(view) -> (view, and what `FragPolicy._evaluate_host` reads of it whatever the pod)
        self.view_prefixes: dict[int, tuple] = {}
        # (group aggregates, CPU class or -1) -> `fragmentation_sums` (FragPolicy._units).
        self.class_sums: dict[tuple[tuple, int], tuple[int, int, int]] = {}
        self._host_values: dict[tuple[int, frozenset[int]], int] = {}
        self._share_moves: dict[tuple[int, int, frozenset[int] | None, frozenset[int] | None], dict] = {}

    def cpu_class(self, cpu: int) -> int:
        """Which classes' CPU fits a node with `cpu` free: nodes of one class see the same classes fit
        (`fragmentation_units`'s `bisect_right(g.cpus, cpu_free)` for every group)."""
        return bisect_right(self._cpu_breaks, cpu)

    def gpu_terms(self, cls: int) -> _GpuTerms:
        """(model, free) -> `_GpuTerms` of one GPU for nodes of CPU class `cls`, filled lazily."""
        d = self._gpu_terms.get(cls)
        if d is None:
            thr = self._cpu_breaks[cls - 1] if cls else None
            okw = []
            for g in self.table.groups:
                if g.count != 1:
                    continue  # the multi-GPU groups are the keys' (`key_terms`)
                j = 0 if thr is None else bisect_right(g.cpus, thr)
                okw.append((g.models, g.per_gpu, g.wcum[j], g.wcpu[j]))
            d = self._gpu_terms[cls] = _GpuTerms(tuple(okw))
        return d

    def key_terms(self, k: int, cls: int, room: int) -> tuple[int, int, int]:
        """What the multi-GPU groups of key `k` add to `fragmentation_sums`' (kept, fill, need) on a node
        of CPU class `cls` with `room` GPUs with room for the key: (A, F, N), the node keeping
        `A x usable` (before the keep weight) and `F` of fill, asking `N` of CPU (a group below its count
        of GPUs adds nothing), whatever GPUs hold that room."""
        key = (k, cls, room)
        v = self._key_terms.get(key)
        if v is None:
            thr = self._cpu_breaks[cls - 1] if cls else None
            per = self.keys[k][1]
            a = fill = need = 0
            for g in self._key_table_groups[k]:
                if room < g.count:
                    continue
                j = 0 if thr is None else bisect_right(g.cpus, thr)
                ok, slots = g.wcum[j], room // g.count
                a += ok
                fill += ok * per * g.count * slots
                need += g.wcpu[j] * slots
            v = self._key_terms[key] = (a, fill, need)
        return v

    def host_units(self, total: int, kept_usable: int, fill: int, need: int, cpu: int) -> int:
        """`fragmentation_units` of a node with CPU known, from the sums of its GPUs' `_GpuTerms` and its
        keys' `key_terms` (`kept_usable`, `fill`, `need`) under its CPU class: the same integers."""
        table = self.table
        if total == 0 or not table.groups:
            return 0
        if need > cpu * table.weight:
            fill = fill * cpu * table.weight // need
        return total * self.total_w - (self.keep_w * kept_usable + self.wa * fill)

    def host_facts(self, gpus: GpuView) -> HostFacts:
        """`HostFacts` of a node's GPUs under this table, memoised per GPU state."""
        v = self._host_facts.get(gpus)
        if v is None:
            if len(self._host_facts) >= FACTS_LIMIT:
                self._host_facts.clear()
                self._host_bests.clear()
                self._bests_size = 0
            multiset = tuple(sorted(gpus))
            bests = self._host_bests.get(multiset)
            if bests is None:
                bests = self._host_bests[multiset] = {}
            v = self._host_facts[gpus] = HostFacts(gpus, self.key_sums(gpus) if self.keys else None, bests)
        return v

    def keep_view_prefix(self, key: int, prefix: tuple) -> None:
        """Keep `FragPolicy._evaluate_host`'s per-state part (`view_prefixes`), bounded."""
        if len(self.view_prefixes) >= VIEW_PREFIX_LIMIT:
            self.view_prefixes.clear()
        self.view_prefixes[key] = prefix

    def keep_best(self, facts: HostFacts, key: tuple, value: tuple) -> None:
        """Keep one of `FragPolicy._evaluate_host`'s answers in `facts.bests`, all of them bounded together."""
        if self._bests_size >= BESTS_LIMIT:
            for bests in list(self._host_bests.values()):  # a list first: a filter thread may add one
                bests.clear()
            self._bests_size = 0
        facts.bests[key] = value
        self._bests_size += 1

    def node_sums(self, gpus: GpuView, cls: int, facts: HostFacts | None = None) -> tuple[int, int, int, int]:
        """(free total, and the sums of `gpu_terms(cls)` over the node's GPUs plus its keys' `key_terms`),
        kept in the node's `HostFacts` (`facts`: the caller's, already looked up)."""
        if facts is None:
            facts = self.host_facts(gpus)
        v = facts.sums.get(cls)
        if v is None:
            v = facts.sums[cls] = self._sum_terms(gpus, cls, facts.keyed)
        return v

    def stranded(self, facts: HostFacts, gpus: GpuView, before: frozenset[int], after: frozenset[int]) -> int:
        """`_stranded` over every partly used GPU of the node (none chosen), kept in its facts per pair
        of (interned) hostable sets."""
        key = (before, after)
        v = facts.strands.get(key)
        if v is None:
            gp = self._gap_prices
            assert gp is not None
            partial = facts.partial
            if partial is None:
                cap = gp.capacity
                partial = facts.partial = tuple(f for _, f in gpus if 0 < f < cap)
            hv = self.host_value
            v = facts.strands[key] = sum(hv(f, before) - hv(f, after) for f in partial)
        return v

    def _sum_terms(self, gpus: GpuView, cls: int, keyed: KeySums | None) -> tuple[int, int, int, int]:
        terms = self.gpu_terms(cls)
        kept = fill = need = total = 0
        for g in gpus:
            k, a, n = terms[g]
            kept += k
            fill += a
            need += n
            total += g[1]
        for k, (room, usable) in enumerate(keyed or ()):
            a, f, n = self.key_terms(k, cls, room)
            kept += a * usable
            fill += f
            need += n
        return total, kept, fill, need

    def host_value(self, free: int, sizes: frozenset[int]) -> int:
        """`GapPrices.host_value`, memoised per (free, interned set)."""
        key = (free, sizes)
        v = self._host_values.get(key)
        if v is None:
            gp = self._gap_prices
            assert gp is not None
            v = self._host_values[key] = gp.host_value(free, sizes)
        return v

    def share_moves(
        self, cls: int, per: int, before: frozenset[int] | None, after: frozenset[int] | None
    ) -> dict[tuple[str, int], tuple[int, int, int, int, int]]:
        """(model, free) -> `share_move`, one dict per (CPU class after, share size, hostable sets)."""
        return lazy_table(self._share_moves, (cls, per, before, after))

    def share_move(
        self,
        moves: dict,
        gpu: tuple[str, int],
        per: int,
        cls: int,
        before: frozenset[int] | None,
        after: frozenset[int] | None,
    ) -> tuple[int, int, int, int, int]:
        """What a share of `per` on `gpu` changes, whatever node it is on (nodes of CPU class `cls`
        after it, and the hostable sets `moves` belongs to): the change of the node's three
        `gpu_terms` sums; the gap price's own part (`gap` without host sets, else the GPU's
        host-aware loss in 1 / denominator units, K before less K after less the price); and what
        the GPU itself adds to the node's stranded sum (subtracted: it is the chosen one)."""
        m, f = gpu
        terms = self.gpu_terms(cls)
        k0, a0, n0 = terms[gpu]
        k1, a1, n1 = terms[(m, f - per)]
        if before is None or after is None:
            own = self.gap(f, per)
            strand = 0
        else:
            gp = self._gap_prices
            assert gp is not None
            own = self.host_value(f, before) - self.host_value(f - per, after) - gp.price_units(per)
            strand = self.host_value(f, before) - self.host_value(f, after) if 0 < f < gp.capacity else 0
        v = moves[gpu] = (k1 - k0, a1 - a0, n1 - n0, own, strand)
        return v

    def value(self, model: str, free: int) -> int:
        """What all single-GPU groups keep of one GPU of `model` with `free` units."""
        key = (model, free)
        v = self.values.get(key)
        if v is None:
            v = 0
            wa, keep_w = self.wa, self.keep_w
            for models, per, weight in self.singles:
                if free >= per and (not models or model_allowed(models, model)):
                    v += weight * (keep_w * free + wa * per * (free // per))
            self.values[key] = v
        return v

    def gap_prices(self) -> GapPrices | None:
        """The bin-packing LP's prices of the learned share sizes (`patterns.GapPrices`), solved once per
        table on first use (a few ms for ~20 sizes); None when the gap price is off or nothing is shared.

        Shares are the single-GPU classes asking less than a GPU: `gpu_unit` when the caller knows it
        (share-sim: the largest GPU), else the largest per-GPU request learned (a whole-GPU pod's)."""
        gp = self._gap_prices
        if gp is None and self._gap_scale:
            groups = self.table.groups
            unit = self._gpu_unit or max((g.per_gpu for g in groups), default=0)
            counts: dict[int, int] = {}
            for g in groups:
                if g.count == 1 and 0 < g.per_gpu < unit:
                    counts[g.per_gpu] = counts.get(g.per_gpu, 0) + g.weight
            if counts:
                gp = self._gap_prices = GapPrices(counts, unit)
        return gp

    def gap_of(self, per: int) -> dict[int, int] | None:
        """free -> `gap(free, per)` filled lazily, or None when a share of `per` has no gap price."""
        d = self._gaps.get(per, MISSING)
        if d is MISSING:
            gp = self.gap_prices()
            d = self._gaps[per] = {} if gp is not None and per in gp.price else None
        return d  # type: ignore[return-value]

    def gap(self, free: int, per: int) -> int:
        """What a share of `per` on a GPU with `free` units loses at the LP's prices (`GapPrices.loss`),
        x the policy's gap weight, in this pricer's integer units (rounded once: every path adds the
        same integer, so the fast paths still equal the recount exactly)."""
        d = self.gap_of(per)
        if d is None:
            return 0
        v = d.get(free)
        if v is None:
            gp = self._gap_prices
            assert gp is not None
            v = d[free] = round(self._gap_scale * gp.loss(free, per))
        return v

    def hostable(self, cpu: int, memory: int | None) -> frozenset[int]:
        """The priced share sizes whose typical pod (`host_needs`) a node with `cpu` and `memory` free
        could still host."""
        breaks = self._need_breaks
        if breaks is None:
            needs = self.host_needs
            assert needs is not None
            breaks = self._need_breaks = (
                tuple(sorted({c for c, _ in needs.values()})),
                tuple(sorted({m for _, m in needs.values()})),
            )
        # The set depends only on which of the needs' CPU and memory values the node reaches: kept per
        # that class (the timeline asks for a new free CPU and memory at nearly every event).
        cls = (bisect_right(breaks[0], cpu), -1 if memory is None else bisect_right(breaks[1], memory))
        got = self._hostable_cls.get(cls)
        if got is None:
            gp, needs = self._gap_prices, self.host_needs
            assert gp is not None and needs is not None
            got = frozenset(
                s for s, (c, m) in needs.items() if s in gp.priced and c <= cpu and (memory is None or m <= memory)
            )
            got = self._interned.setdefault(got, got)  # one object per set: `host_gap` compares by identity
            self._hostable_cls[cls] = got
        return got

    def host_gap(
        self, gpus: GpuView, pos: int, per: int, host: tuple[int, int | None], host_after: tuple[int, int | None]
    ) -> int:
        """`gap` when the node's free CPU and memory are known (`host`, and `host_after` the share).

        A gap is worth K_h, the knapsack at the LP's prices over only the sizes whose typical pod the
        node can still host (`hostable`): a half-full GPU on a node with no CPU left for any share that
        would fit it is worth nothing, not what its free units could earn. A share of `per` on GPU
        `pos` loses V(before) - V(after) - pi(per), V the sum of K_h over the node's partly used GPUs
        and GPU `pos` (the share's CPU and memory can strand the node's other gaps too). Node-local,
        and `gap` itself wherever the node can host every size before and after. A one-GPU pod of a
        size with no price (a whole GPU, a size not yet learned) pays `host_strand`."""
        f = gpus[pos][1]
        gp = self.gap_prices()
        if gp is None or self.host_needs is None:
            return self.gap(f, per)
        if per not in gp.price:
            return self.host_strand(gpus, (pos,), host, host_after)
        before, after = self.hostable(*host), self.hostable(*host_after)
        v = gp.host_value(f, before) - gp.host_value(f - per, after) - gp.price_units(per)
        return self._host_units(v + self._stranded(gp, gpus, (pos,), before, after), gp)

    def host_strand(
        self, gpus: GpuView, chosen: tuple[int, ...], host: tuple[int, int | None], host_after: tuple[int, int | None]
    ) -> int:
        """What a pod that is not a priced share (whole GPUs, several GPUs, CPU only) costs the node's
        other partly used GPUs at the host-aware gap price: its CPU and memory may leave them no pod."""
        gp = self.gap_prices()
        if gp is None or self.host_needs is None:
            return 0
        v = self._stranded(gp, gpus, chosen, self.hostable(*host), self.hostable(*host_after))
        return self._host_units(v, gp) if v else 0

    @staticmethod
    def _stranded(
        gp: GapPrices, gpus: GpuView, chosen: tuple[int, ...], before: frozenset[int], after: frozenset[int]
    ) -> int:
        """What the partly used GPUs outside `chosen` lose (1 / `gp.denominator` units) when what the
        node can host goes from `before` to `after`: V's part that the pod's CPU and memory move."""
        if before is after:  # interned by `hostable`: the same set, nothing moves
            return 0
        value, cap = gp.host_value, gp.capacity
        return sum(
            value(g, before) - value(g, after) for j, (_, g) in enumerate(gpus) if 0 < g < cap and j not in chosen
        )

    def _host_units(self, v: int, gp: GapPrices) -> int:
        """A host-aware loss `v` (in 1 / `gp.denominator` units) x the gap weight, in this pricer's
        integer units, rounded once per value as `gap` rounds."""
        units = self._host_gaps.get(v)
        if units is None:
            units = self._host_gaps[v] = round(self._gap_scale * Fraction(v, gp.denominator))
        return units

    def single_loss(self, per: int) -> dict[tuple[str, int], int]:
        """(model, free) -> what taking `per` units from that GPU costs the single-GPU groups, plus the
        free capacity it removes (`value(free) - value(free - per) - per x total_w`), filled lazily."""
        d = self._single_loss.get(per)
        if d is None:
            d = self._single_loss[per] = {}
        return d

    def keys_for(self, model: str) -> tuple[tuple[int, int], ...]:
        """(key index, per_gpu) of the multi-GPU keys that may use `model`, by per_gpu ascending."""
        out = self._by_model.get(model)
        if out is None:
            out = tuple(
                sorted(
                    ((k, q) for k, (models, q) in enumerate(self.keys) if not models or model_allowed(models, model)),
                    key=lambda x: (x[1], x[0]),
                )
            )
            self._by_model[model] = out
        return out

    def coefficients(self, k: int, room: int) -> tuple[int, int]:
        """(A, B): the multi-GPU groups of key `k` keep `A x usable + B` of a node with `room` GPUs."""
        ab = self._ab.get((k, room))
        if ab is None:
            a = b = 0
            per = self.keys[k][1]
            for count, weight in self._key_groups[k]:
                if room >= count:
                    a += weight
                    b += weight * count * (room // count)
            ab = self._ab[(k, room)] = (self.keep_w * a, self.wa * per * b)
        return ab

    def crossing(self, k: int, room: int) -> tuple[int, int, int, int]:
        """(A(room), A(room - 1), A(room) - A(room - 1), B(room) - B(room - 1)) for key `k` (zeros
        but A at room 0), from a per-key list: `prefix_of` reads it once per key and node."""
        row = self._crossing[k]
        while len(row) <= room:
            r = len(row)
            a, b = self.coefficients(k, r)
            if r == 0:
                row.append((a, 0, 0, 0))
            else:
                a0, b0 = self.coefficients(k, r - 1)
                row.append((a, a0, a - a0, b - b0))
        return row[room]

    def prefix_of(self, gpus: GpuView, model: str) -> Prefix:
        """`prefix(model, key_sums(gpus))`, computed straight from the node's GPUs: one sort, and the
        bisections for every key in one call when no key is restricted to GPU models."""
        qs = self.qs_for(model)
        if self._unrestricted:  # every key may use every GPU: one sorted list serves them all
            vals = sorted(map(itemgetter(1), gpus))
            running = [0, *accumulate(vals)]
            n, total = len(vals), running[-1]
            idx = list(map(bisect_left, repeat(vals, len(qs)), qs))
            rooms = tuple([n - i for i in idx])
            usables = tuple([total - running[i] for i in idx])
        else:
            keys = self.keys
            frees: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
            room_list, usable_list = [], []
            for k, q in self.keys_for(model):
                room, usable = room_at_least(frees, gpus, keys[k][0], q)
                room_list.append(room)
                usable_list.append(usable)
            rooms, usables = tuple(room_list), tuple(usable_list)
        return (qs, *self.by_rooms(model, rooms), rooms, usables)

    def one_gpu_infos(self, per: int, models: tuple[str, ...], model: str) -> dict[int, tuple[int, int, int] | bool]:
        """free -> `gpu_info((model, free), per, models)`, filled lazily: what a share of this size and
        model set needs to know of one GPU of `model`, whatever node it is on."""
        return lazy_table(self._gpu_infos, (per, models, model))

    def multi_infos(
        self, per: int, models: tuple[str, ...], model: str
    ) -> dict[tuple[int, ...], tuple[int, int, tuple[tuple[int, int, int, int], ...]]]:
        """frees of the chosen GPUs (ascending) -> `multi_info(model, per, models, frees)`, lazily."""
        return lazy_table(self._multi_infos, (per, models, model))

    def multi_info(
        self, model: str, per: int, models: tuple[str, ...], picked: tuple[int, ...]
    ) -> tuple[int, int, tuple[tuple[int, int, int, int], ...]]:
        """What a share of `per` on each of GPUs of `model` with frees `picked` (ascending, each with
        room) costs whatever node they are on: (the single-GPU groups' cost plus the free capacity
        taken; the first key (of `all_qs`) not every chosen GPU stays above; per key some chosen GPU
        crosses or leaves room in, (key position, key index, change of its room, change of its usable
        capacity)). `Pricer.delta`'s terms less the node's room and usable capacity per key."""
        d = 0
        for f in picked:
            d += self.value(model, f) - self.value(model, f - per) - per * self.total_w
        qs = self.all_qs or ()
        lo = bisect_right(qs, picked[0] - per)  # keys every chosen GPU keeps room for
        moves = []
        ks = self.keys_for(model)
        for j in range(lo, bisect_right(qs, picked[-1], lo)):
            k, q = ks[j]
            dr, du = key_change(picked, per, q)
            if dr or du:
                moves.append((j, k, dr, du))
        return d, lo, tuple(moves)

    def gpu_info(self, gpu: tuple[str, int], per: int, models: tuple[str, ...]) -> tuple[int, int, int] | bool:
        """For taking `per` units from `gpu`: (what it costs the single-GPU groups, plus the free
        capacity it removes; the first key (of `all_qs`) it does not stay above; the first it stays
        below): `delta_one` less the parts that depend on the node. False: the GPU cannot take it."""
        m, f = gpu
        if f < per or (models and not model_allowed(models, m)):
            return False
        a = f - per
        qs = self.all_qs or ()
        lo = bisect_right(qs, a)
        d = self.value(m, f) - self.value(m, a) - per * self.total_w + self.gap(f, per)
        return d, lo, bisect_right(qs, f, lo)

    def node_sig(self, gpus: GpuView) -> NodeSig:
        """What the fast paths need of a node's GPUs when the keys are unrestricted (`all_qs` not
        None), a pure function of the GPUs and `all_qs` (so a new table with the same keys keeps it):
        - per GPU, by free ascending, how many keys it has room for: the node's room per key, which
          picks the shared `room_prefix`;
        - the one GPU model of the node (None: none or several);
        - its frees, sorted (the usable capacity for key j: `sum(frees[idx[j]:])`, `idx` from
          `room_prefix`)."""
        vals = tuple(sorted(map(itemgetter(1), gpus)))
        models = set(map(itemgetter(0), gpus))
        v = (tuple(map(self._rooms_of.__getitem__, vals)), models.pop() if len(models) == 1 else None, vals)
        if len(self.node_sigs) >= MEMO_LIMIT:
            self.node_sigs.clear()
        self.node_sigs[gpus] = v
        return v

    def room_prefix(self, sig: tuple[int, ...]) -> RoomPrefix:
        """`by_rooms` for a node with this `node_sig` signature, and per key the position in the
        node's sorted frees where room for it starts (`idx`); memoised on the signature: few differ
        among many nodes (a few hundred among 5,000)."""
        v = self.room_prefixes.get(sig)
        if v is None:
            if len(self.room_prefixes) >= 100_000:
                self.room_prefixes.clear()
            idx = tuple([bisect_right(sig, j) for j in range(len(self.all_qs or ()))])
            n = len(sig)
            v = self.room_prefixes[sig] = (*self.by_rooms("", tuple([n - i for i in idx])), idx)
        return v

    def by_rooms(
        self, model: str, rooms: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The parts of `prefix` that depend on the keys' room counts alone (nodes share them)."""
        key = (model, rooms)
        v = self._by_rooms.get(key)
        if v is None:
            stay, cross_free, cross_usable, cross_const = [0], [0], [], []
            s = cf = 0
            for (k, _), room in zip(self.keys_for(model), rooms, strict=True):
                a, a0, da, db = self.crossing(k, room)
                s += a
                if room:
                    cf += a0
                else:  # no GPU of this node has room for the key: no share can cross it
                    da = db = 0
                stay.append(s)
                cross_free.append(cf)
                cross_usable.append(da)
                cross_const.append(db)
            # Tuples of ints: the garbage collector stops tracking them.
            v = (tuple(stay), tuple(cross_free), tuple(cross_usable), tuple(cross_const))
            if len(self._by_rooms) >= 100_000:
                self._by_rooms.clear()
            self._by_rooms[key] = v
        return v

    def qs_for(self, model: str) -> tuple[int, ...]:
        """The per_gpu of `keys_for(model)`, in its order."""
        qs = self._qs.get(model)
        if qs is None:
            qs = self._qs[model] = tuple(q for _, q in self.keys_for(model))
        return qs

    def coefficient_row(self, k: int, room: int) -> list[tuple[int, int]]:
        """`coefficients(k, r)` for r = 0..room at least, as a list (read by index in hot loops)."""
        row = self.coef_rows[k]
        while len(row) <= room:
            row.append(self.coefficients(k, len(row)))
        return row

    def kept(self, k: int, room: int, usable: int) -> int:
        """What the multi-GPU groups of key `k` keep of a node with `room` GPUs holding `usable`."""
        a, b = self.coefficients(k, room)
        return a * usable + b

    def prefix(self, model: str, sums: KeySums) -> Prefix:
        """What pricing one GPU of `model` needs of a node with these key sums, so that a share is
        priced with two bisections whatever the number of keys (keys by per_gpu ascending).

        A share that leaves a GPU with room for key k only lowers the key's usable capacity, which
        changes what it keeps by `A(room) x share` (running sum `stay`). A share that takes the GPU
        below the key's per_gpu removes it from the room count: the key keeps
        `A(room - 1) x free + (A(room) - A(room - 1)) x usable + B(room) - B(room - 1)` less, linear in
        the GPU's free units (running sum `cross_free` of A(room - 1); per key `cross_usable` =
        A(room) - A(room - 1) and `cross_const` = B(room) - B(room - 1), for the few keys a share crosses)."""
        ks = self.keys_for(model)
        rooms = tuple(sums[k][0] for k, _ in ks)
        usables = tuple(sums[k][1] for k, _ in ks)
        return (self.qs_for(model), *self.by_rooms(model, rooms), rooms, usables)

    def crossed(self, pre: Prefix, lo: int, hi: int, free: int) -> int:
        """What the keys lo..hi-1 (a GPU with `free` units drops below their per_gpu) keep less."""
        _, _, cross_free, cross_usable, cross_const, _, usables = pre
        d = free * (cross_free[hi] - cross_free[lo])
        for j in range(lo, hi):
            d += cross_usable[j] * usables[j] + cross_const[j]
        return d

    def delta_one(self, sums: KeySums, model: str, free: int, after: int) -> int:
        """`delta` for one GPU, without visiting the keys it stays above or below."""
        value = self.value
        d = value(model, free) - value(model, after) - (free - after) * self.total_w
        if not self.keys:
            return d
        pre = self.prefix(model, sums)
        qs, stay = pre[0], pre[1]
        lo = bisect_right(qs, after)
        hi = bisect_right(qs, free, lo)
        return d + (free - after) * stay[lo] + self.crossed(pre, lo, hi, free)

    def key_sums(self, gpus: GpuView) -> KeySums:
        """(GPUs with room, their free capacity) per multi-GPU key."""
        frees: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
        return tuple(room_at_least(frees, gpus, models, per) for models, per in self.keys)

    def delta(self, sums: KeySums, changes: Sequence[tuple[str, int, int]]) -> int:
        """`fragmentation_units` after minus before, for GPUs changing (model, free, after)."""
        d = 0
        taken = 0
        value = self.value
        for m, f, a in changes:
            taken += f - a
            d -= value(m, a) - value(m, f)
        d -= taken * self.total_w
        if not self.keys:
            return d
        if len(changes) == 1:
            m, f, a = changes[0]
            for k, per in self.keys_for(m):
                if per > f:
                    break
                room, usable = sums[k]
                if a >= per:
                    d -= self.kept(k, room, usable - (f - a)) - self.kept(k, room, usable)
                else:
                    d -= self.kept(k, room - 1, usable - f) - self.kept(k, room, usable)
            return d
        shifts: dict[int, list[int]] = {}
        for m, f, a in changes:
            for k, per in self.keys_for(m):
                if per > f:
                    break
                s = shifts.setdefault(k, [0, 0])
                if a >= per:
                    s[1] -= f - a
                else:
                    s[0] -= 1
                    s[1] -= f
        for k, (dr, du) in shifts.items():
            room, usable = sums[k]
            d -= self.kept(k, room + dr, usable + du) - self.kept(k, room, usable)
        return d


def quantile(counted: list[tuple[int, int]], q: float) -> int:
    """The value at position min(n - 1, int(q x n)) of the n values (each listed with its count) sorted."""
    counted.sort()
    n = sum(c for _, c in counted)
    at = min(n - 1, int(q * n))
    for value, c in counted:
        if at < c:
            return value
        at -= c
    raise ValueError("no values")  # pragma: no cover - n > 0 whenever a size was observed


# Entries kept in each memo of frag's (the pricer's node signatures, FragPolicy's evaluations).
MEMO_LIMIT = 400_000
# `HostFacts` kept (about a kilobyte each with their dicts): far more than a cluster's live GPU states.
FACTS_LIMIT = 50_000
VIEW_PREFIX_LIMIT = 20_000  # node states (a cluster's live states, with room to spare)
BESTS_LIMIT = 400_000  # `HostFacts.bests` entries kept in all (~200 bytes each)


def lazy_table(tables: dict[Any, dict], key: Any, limit: int = 1024) -> dict:
    """tables[key], a new empty table if there is none (filled lazily by the caller); past `limit` keys
    (many sizes seen since the learned table was built) every table starts afresh."""
    table = tables.get(key)
    if table is None:
        if len(tables) >= limit:
            tables.clear()
        table = tables[key] = {}
    return table


# The CPU and memory a share size's "typical" pod asks, for frag's host-aware gap price: the median
# (docs/simulator.md, `frag` item 7).
HOST_QUANTILE = 0.5

# frag's weight on the LP gap price (`Pricer.gap`), in GPU units per unit of loss: large enough that the
# loss decides first and frag's fragmentation price breaks its ties (docs/simulator.md, `frag` item 6).
GAP_WEIGHT = 1000.0
