"""`frag`: place each pod where the learned workload's expected fragmentation grows least.

The prices live in `share_placement.frag_pricing`; this module decides: which GPUs on a node, the
memoised and indexed fast paths, and the ties.

One piece: the decision paths (the full recount, the memoised and indexed paths, the host fast path)
must choose alike; they stand side by side so that a change to one is made to all (the placement tests
compare them choice for choice).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from bisect import bisect_right
from collections.abc import Sequence
from fractions import Fraction
from itertools import accumulate
from operator import itemgetter
from typing import Any

from share_placement.binpack import best_fit
from share_placement.frag_pricing import GAP_WEIGHT
from share_placement.frag_pricing import HOST_QUANTILE
from share_placement.frag_pricing import MEMO_LIMIT
from share_placement.frag_pricing import KeySums
from share_placement.frag_pricing import NodeSig
from share_placement.frag_pricing import Prefix
from share_placement.frag_pricing import Pricer
from share_placement.frag_pricing import key_change
from share_placement.frag_pricing import one_gpu_price
from share_placement.frag_pricing import quantile
from share_placement.frag_scores import frag_scores
from share_placement.model import MISSING
from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import GpuView
from share_placement.model import NodeView
from share_placement.model import ViewPolicy
from share_placement.model import eligible_positions
from share_placement.model import model_allowed
from share_placement.workload import Aggregates
from share_placement.workload import ClassKey
from share_placement.workload import ObservedClasses
from share_placement.workload import WorkloadTable
from share_placement.workload import fill_ratio
from share_placement.workload import fragmentation_sums
from share_placement.workload import group_aggregates
from share_placement.workload import shift_aggregates
from share_placement.workload import units_from_sums


class FragPolicy(ViewPolicy):
    """Least growth of expected fragmentation under the learned workload; best fit on ties."""

    name = "frag"
    MEMO_LIMIT = MEMO_LIMIT
    PREFIX_LIMIT = 50_000  # per-state running sums kept (a few hundred bytes each; 5,000 nodes need 5,000)

    def __init__(
        self,
        fill_weight: float = 0.6,
        pressure: float = 3.0,
        gap_weight: float = GAP_WEIGHT,
        gpu_unit: int | None = None,
        host_quantile: float | None = HOST_QUANTILE,
    ) -> None:
        if not 0.0 <= fill_weight <= 1.0 or pressure < 0 or gap_weight < 0:
            raise ValueError("frag: fill_weight must be in [0, 1], pressure and gap_weight non-negative")
        if host_quantile is not None and not 0.0 <= host_quantile <= 1.0:
            raise ValueError("frag: host_quantile must be in [0, 1] (or None: the gap price ignores CPU)")
        self.host_quantile = host_quantile
        # `_evaluate_host`, the one-pass path with CPU known; False: every candidate recounted (tests).
        self.fast_host = True
        # Whether `evaluate` keeps its answers per (demand, view): the extender asks about many nodes in
        # one state; share-sim, which memoises per node state itself, turns it off (`policy_memo_off`).
        self.memo_evaluations = True
        # (per_gpu, cpu, memory) -> single-GPU pods observed: what a share size's pods ask of a host.
        self._share_asks: dict[tuple[int, int, int], int] = {}
        self.fill_weight = fill_weight
        self._wa, self._wb = fill_ratio(fill_weight)
        self.pressure = pressure
        self.gap_weight = gap_weight
        self._gap_w = Fraction(gap_weight).limit_denominator(1000)
        self.gpu_unit = gpu_unit
        self._lock = threading.Lock()
        self._classes = ObservedClasses()
        self._groups: set[tuple[tuple[str, ...], int, int]] = set()  # (models, per_gpu, count) observed
        self._table = WorkloadTable((), 0)
        self._pricer = Pricer(self._table, self._wa, self._wb, self._gap_w, gpu_unit)
        self._pressure: dict[str, float] = {}
        self._agg_memo: dict[GpuView, Aggregates] = {}
        # (sorted GPUs, model, free, per_gpu) -> `shift_aggregates` of that node's aggregates: one GPU of
        # the node losing a share, whatever the node's CPU (the timeline asks it for many CPU states).
        self._shift_memo: dict[tuple[GpuView, str, int, int], Aggregates] = {}
        self._sums_memo: dict[GpuView, KeySums] = {}
        self._memo: dict[Any, int] = {}
        self._eval_memo: dict[Demand, dict[NodeView, Evaluation]] = {}
        self._eval_size = 0
        self._last: tuple[Demand | None, dict[NodeView, Evaluation], dict[Demand, dict[NodeView, Evaluation]]] = (
            None,
            {},
            {},
        )

    def observe(self, demand: Demand) -> None:
        if demand.count <= 0 or demand.per_gpu <= 0:
            return  # CPU-only pods fragment no GPU
        models = tuple(sorted(m.lower() for m in demand.models))
        key = (demand.per_gpu, demand.count, models, demand.cpu)
        with self._lock:
            if key not in self._classes.counts:
                group = (models, demand.per_gpu, demand.count)
                if group not in self._groups:
                    # A shape the table has no group for: priced without it until the refresh, so at
                    # once. A new CPU ask in a known group is one pod among the group's, stale as
                    # any count is until the next refresh (re-pricing 5,000 node states for it would
                    # cost the next filter ~100 ms).
                    self._groups.add(group)
                    self._classes.stale = True
            self._classes.add(key)
            if demand.count == 1:
                ask = (demand.per_gpu, demand.cpu, demand.memory)
                self._share_asks[ask] = self._share_asks.get(ask, 0) + 1

    def set_gpu_unit(self, units: int | None) -> None:
        """The capacity of a GPU the gap price packs shares into (the cluster's largest GPU, in units), told
        by the extender as nodes come and go; None: the largest per-GPU request learned. A change gives a
        new table snapshot, so whatever was priced with the old capacity is priced again."""
        with self._lock:
            if units != self.gpu_unit:
                self.gpu_unit = units
                self._classes.stale = True

    @property
    def table(self) -> WorkloadTable:
        """The current snapshot of the learned workload (rebuilt lazily after observe())."""
        self._classes.refresh(self._lock, self._rebuild)
        return self._table

    def _rebuild(self, counts: dict[ClassKey, float]) -> None:
        table = WorkloadTable.from_counts(counts)
        pricer = Pricer(table, self._wa, self._wb, self._gap_w, self.gpu_unit)
        if [(g.models, g.per_gpu) for g in table.groups] != [(g.models, g.per_gpu) for g in self._table.groups]:
            self._agg_memo = {}  # the sums depend on the groups' sizes, not their weights
            self._shift_memo = {}
        if pricer.keys != self._pricer.keys:
            self._sums_memo = {}
        if pricer.all_qs is not None and pricer.all_qs == self._pricer.all_qs:
            pricer.node_sigs = self._pricer.node_sigs  # the nodes' room positions stand
        self._table, self._pricer = table, pricer
        self._pressure = {}
        self._memo = {}
        self._eval_memo = {}
        self._eval_size = 0

    def host_needs(self) -> dict[int, tuple[int, int]]:
        """Per single-GPU size: the `host_quantile` of its pods' CPU asks and of their memory asks
        (`Pricer.host_gap`'s typical pod), from what was observed."""
        q = self.host_quantile or 0.0
        with self._lock:
            asks = list(self._share_asks.items())
        by_size: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        for (per, cpu, mem), n in asks:
            cpus, mems = by_size.setdefault(per, ([], []))
            cpus.append((cpu, n))
            mems.append((mem, n))
        return {per: (quantile(cpus, q), quantile(mems, q)) for per, (cpus, mems) in by_size.items()}

    def model_pressure(self, model: str) -> float:
        """Probability that a pod is restricted to GPU models that include `model` (scarce capacity)."""
        v = self._pressure.get(model)
        if v is None:
            v = sum(g.prob for g in self.table.groups if g.models and model_allowed(g.models, model))
            self._pressure[model] = v
        return v

    def aggregates(self, gpus_sorted: GpuView) -> Aggregates:
        """`group_aggregates` of a node's GPUs (sorted, so nodes in the same state share them)."""
        a = self._agg_memo.get(gpus_sorted)
        if a is None:
            a = group_aggregates(gpus_sorted, self.table)
            if len(self._agg_memo) >= self.MEMO_LIMIT:
                self._agg_memo.clear()
            self._agg_memo[gpus_sorted] = a
        return a

    def key_sums(self, gpus_sorted: GpuView, pricer: Pricer) -> KeySums:
        """`Pricer.key_sums` of a node's GPUs, kept across table rebuilds while the keys stay."""
        s = self._sums_memo.get(gpus_sorted)
        if s is None:
            s = pricer.key_sums(gpus_sorted)
            if len(self._sums_memo) >= self.MEMO_LIMIT:
                self._sums_memo.clear()
            self._sums_memo[gpus_sorted] = s
        return s

    def prefix_of(self, gpus: GpuView, model: str, pricer: Pricer) -> Prefix:
        """`Pricer.prefix_of`, memoised per node state and model in the pricer itself (so an entry can
        only ever be read with the table it was computed for, whichever thread rebuilt the table)."""
        memo = pricer.state_prefixes
        key = (gpus, model)
        v = memo.get(key)
        if v is None:
            v = pricer.prefix_of(gpus, model)
            if len(memo) >= self.PREFIX_LIMIT:
                memo.clear()
            memo[key] = v
        return v

    def node_units(self, gpus: GpuView, cpu_free: int | None) -> int:
        """`fragmentation_units` of a node under the current table (memoised per sorted state)."""
        gpus_sorted = tuple(sorted(gpus))
        key = (gpus_sorted, cpu_free)
        v = self._memo.get(key)
        if v is None:
            _ = self.table  # refresh first: the pricer below belongs to the current table
            pricer = self._pricer
            v = self._units(sum(f for _, f in gpus), self.aggregates(gpus_sorted), cpu_free, pricer)
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = v
        return v

    def _units(self, total: int, aggs: Aggregates, cpu_free: int | None, pricer: Pricer) -> int:
        """`fragmentation_units` under `pricer`'s table, its pass over the groups kept per CPU class (in the
        pricer, as `prefix_of`'s memo: read only with the table it was computed for): nodes whose free CPU
        differs within a class share it, and the timeline prices many CPU states of one GPU state."""
        table = pricer.table
        if total == 0 or not table.groups:
            return 0
        key = (aggs, -1 if cpu_free is None else pricer.cpu_class(cpu_free))
        memo = pricer.class_sums
        sums = memo.get(key)
        if sums is None:
            sums = fragmentation_sums(aggs, cpu_free, table, self._wa, self._wb)
            if len(memo) >= self.PREFIX_LIMIT:  # a key keeps its aggregates alive: the smaller bound
                memo.clear()
            memo[key] = sums
        return units_from_sums(total, sums, cpu_free, table, self._wa, self._wb)

    def node_fragmentation(self, gpus: GpuView, cpu_free: int | None) -> float:
        """Expected fragmentation of a node under the current table (`fragmentation`, memoised)."""
        units = self.node_units(gpus, cpu_free)
        return units / (self.table.weight * self._wb) if units else 0.0

    def scores(self, views: Sequence[NodeView], demand: Demand) -> list[float]:
        """evaluate's score (-inf: does not fit) for many states at once (`frag_scores`)."""
        return frag_scores(self, views, demand)

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        _ = self.table  # refresh first, so the memo below belongs to the current table
        if not self.memo_evaluations:
            return self._evaluate(view, demand)
        # One dict per demand, keyed by the view alone: its keys and values are tuples of numbers and
        # strings, which the cyclic garbage collector stops tracking, so a memo of many entries adds
        # nothing to every full collection's work (a (view, demand) key holds the tracked Demand).
        # A filter pass asks about every node for one Demand object: skip hashing it again.
        last_demand, memo, outer = self._last
        if last_demand is not demand or outer is not self._eval_memo:
            outer = self._eval_memo
            memo = outer.get(demand)
            if memo is None:
                memo = outer.setdefault(demand, {})
            self._last = (demand, memo, outer)
        ev = memo.get(view, MISSING)
        if ev is MISSING:
            if view[1] is None:  # the extender's case: one call less
                if demand.count == 1:
                    ev = self._evaluate_one_gpu(view, demand, self._pricer)
                else:
                    ev = self._evaluate_gpus(view, demand, self._pricer)
            else:
                ev = self._evaluate(view, demand)
            if self._eval_size >= self.MEMO_LIMIT:  # start afresh
                memo = {}
                self._eval_memo = {demand: memo}
                self._eval_size = 0
            self._eval_size += 1
            memo[view] = ev
        return ev  # type: ignore[return-value]

    def _evaluate_one_gpu(self, view: NodeView, demand: Demand, pricer: Pricer) -> Evaluation:
        """`_evaluate` for a single-GPU demand without CPU information (the extender's common case).

        The same candidates in the same order and the same exact prices as the general path, in one
        pass over the GPUs: the multi-GPU keys' running sums are built once per model on the node.
        """
        gpus, _, mem_free = view
        if mem_free is not None and mem_free < demand.memory:
            return None
        per, models = demand.per_gpu, demand.models
        if pricer.all_qs is not None:
            # No key restricted to models: the node enters through its sorted frees alone. Where they
            # reach each key's per_gpu (its room per key) picks running sums shared by every node with
            # the same room counts; what depends on one GPU alone is looked up per GPU state; only the
            # keys a share crosses need this node's usable capacity. `delta_one`, exactly, and the same
            # candidate wins: the least price, then the least left (distinct for distinct frees).
            sig_entry = pricer.node_sigs.get(gpus)
            if sig_entry is None:
                sig_entry = pricer.node_sig(gpus)
            sig, sole, vals = sig_entry
            prefix = pricer.room_prefixes.get(sig) or pricer.room_prefix(sig)
            total = sum(vals)
            best_d = best_left = 0
            best = None
            if sole is not None:  # one model: the candidates are the distinct frees with room
                if models and not model_allowed(models, sole):
                    return None
                infos = pricer.one_gpu_infos(per, models, sole)
                prev = -1
                for f in vals[bisect_left(vals, per) :]:
                    if f == prev:
                        continue
                    prev = f
                    info = infos.get(f)
                    if info is None:
                        info = infos[f] = pricer.gpu_info((sole, f), per, models)
                    d = one_gpu_price(info, f, per, vals, prefix)  # type: ignore[arg-type]
                    if best is None or d < best_d:
                        best_d, best_left, best = d, f - per, f
                if best is None:
                    return None
                # `_finish` for one GPU without CPU, written out (the same float operations in the
                # same order, so the same score): this runs once per distinct node state.
                delta_f = best_d / pricer.total_w if best_d else 0.0
                if self.pressure:
                    mp = self._pressure.get(sole)
                    delta_f += self.pressure * (self.model_pressure(sole) if mp is None else mp) * per
                score = -(delta_f + 1e-7 * best_left + 1e-10 * (total - per + 0.0))
                return score, (gpus.index((sole, best)),)
            else:  # several models: each distinct GPU state, in the order of its first position
                for g in dict.fromkeys(gpus):
                    m, f = g
                    infos = pricer.one_gpu_infos(per, models, m)
                    info = infos.get(f)
                    if info is None:
                        info = infos[f] = pricer.gpu_info(g, per, models)
                    if info is False:
                        continue
                    d = one_gpu_price(info, f, per, vals, prefix)  # type: ignore[arg-type]
                    a = f - per
                    if best is None or d < best_d or (d == best_d and a < best_left):
                        best_d, best_left, best = d, a, g
                if best is None:
                    return None
                pos = gpus.index(best)
            return self._finish(best_d, best_left, (pos,), gpus, per, None, total)
        # What the single-GPU groups lose when this demand takes one GPU (model, free): the same on
        # every node, so one dict per size serves them all.
        single = pricer.single_loss(per)
        gaps = pricer.gap_of(per)
        keys = pricer.keys
        prefixes: dict[str, Prefix] = {}
        best_d = best_left = 0
        best: tuple[str, int] | None = None
        # Each distinct GPU state once, in the order of its first position (dict.fromkeys keeps it).
        for g in dict.fromkeys(gpus):
            m, f = g
            if f < per or (models and not model_allowed(models, m)):
                continue
            a = f - per
            d = single.get(g)
            if d is None:
                d = single[g] = pricer.value(m, f) - pricer.value(m, a) - per * pricer.total_w
            if gaps is not None:
                x = gaps.get(f)
                d += pricer.gap(f, per) if x is None else x
            if keys:
                pre = prefixes.get(m)
                if pre is None:
                    pre = prefixes[m] = self.prefix_of(gpus, m, pricer)
                qs = pre[0]
                lo = bisect_right(qs, a)
                hi = bisect_right(qs, f, lo)
                d += per * pre[1][lo]
                if hi > lo:
                    d += pricer.crossed(pre, lo, hi, f)
            if best is None or d < best_d or (d == best_d and a < best_left):
                best_d, best_left, best = d, a, g
        if best is None:
            return None
        return self._finish(best_d, best_left, (gpus.index(best),), gpus, per, None, sum(map(itemgetter(1), gpus)))

    def _evaluate_gpus(self, view: NodeView, demand: Demand, pricer: Pricer) -> Evaluation:
        """`_evaluate` for a multi-GPU demand without CPU information: the best-fit GPUs, priced as
        `Pricer.delta` does, with the keys every chosen GPU stays above taken from the running sums."""
        gpus, _, mem_free = view
        if mem_free is not None and mem_free < demand.memory:
            return None
        per, count, models = demand.per_gpu, demand.count, demand.models
        if pricer.all_qs is not None and count > 1:
            sig_entry = pricer.node_sigs.get(gpus)
            if sig_entry is None:
                sig_entry = pricer.node_sig(gpus)
            if sig_entry[1] is not None:
                return self._evaluate_gpus_one_model(gpus, per, count, models, pricer, sig_entry)
        elig = [(f, i) for i, (m, f) in enumerate(gpus) if f >= per and (not models or model_allowed(models, m))]
        if len(elig) < count:
            return None
        elig.sort()  # least room first, lowest index on ties: `best_fit`
        picked = elig[:count]
        chosen = tuple(sorted(i for _, i in picked))
        model = gpus[picked[0][1]][0] if picked else ""
        keys = pricer.keys
        d = 0
        left = -per * count
        if picked and keys:
            single = pricer.single_loss(per)  # includes the free capacity each GPU gives up
            for f, i in picked:
                g = gpus[i]
                if g[0] != model:
                    break
                left += f
                x = single.get(g)
                if x is None:
                    x = single[g] = pricer.value(model, f) - pricer.value(model, f - per) - per * pricer.total_w
                d += x
            else:
                qs, stay, _, _, _, rooms, usables = self.prefix_of(gpus, model, pricer)
                lo = bisect_right(qs, picked[0][0] - per)  # keys every chosen GPU keeps room for
                d += count * per * stay[lo]
                ks = pricer.keys_for(model)
                frees = [f for f, _ in picked]
                for j in range(lo, bisect_right(qs, picked[-1][0], lo)):
                    k, q = ks[j]
                    dr, du = key_change(frees, per, q)
                    room, usable = rooms[j], usables[j]
                    row = pricer.coefficient_row(k, room)
                    a1, b1 = row[room + dr]
                    a0, b0 = row[room]
                    d -= a1 * (usable + du) + b1 - a0 * usable - b0
                return self._finish(d, left, chosen, gpus, per, None)
        # Mixed models on the chosen GPUs, no multi-GPU keys, or a CPU-only demand: the general sum.
        changes = [(gpus[i][0], f, f - per) for f, i in picked]
        d = pricer.delta(self.key_sums(tuple(sorted(gpus)), pricer) if keys else (), changes)
        left = sum(f for f, _ in picked) - per * count
        return self._finish(d, left, chosen, gpus, per, None)

    def _evaluate_gpus_one_model(
        self, gpus: GpuView, per: int, count: int, models: tuple[str, ...], pricer: Pricer, sig_entry: NodeSig
    ) -> Evaluation:
        """`_evaluate_gpus` on a node of one GPU model with unrestricted keys, from its `node_sig`: the
        best-fit GPUs are the `count` least frees with room (lowest positions on ties), and their price
        is `Pricer.delta`'s, with every key's room and usable capacity read off the sorted frees."""
        sole = sig_entry[1]
        assert sole is not None
        if models and not model_allowed(models, sole):
            return None
        sig, _, vals = sig_entry
        n = len(vals)
        i0 = bisect_left(vals, per)
        if n - i0 < count:
            return None
        picked = vals[i0 : i0 + count]
        shares = pricer.multi_infos(per, models, sole)
        info = shares.get(picked)
        if info is None:
            info = shares[picked] = pricer.multi_info(sole, per, models, picked)
        d, lo, moves = info
        stay, _, _, _, idx = pricer.room_prefix(sig)
        d += count * per * stay[lo]
        if moves:  # the keys some chosen GPU crosses: their room and usable capacity on this node
            running = tuple(accumulate(vals, initial=0))
            total = running[-1]
            rows = pricer.coef_rows
            for j, k, dr, du in moves:
                i = idx[j]
                room, usable = n - i, total - running[i]
                row = rows[k]
                if len(row) <= room:
                    row = pricer.coefficient_row(k, room)
                a1, b1 = row[room + dr]
                a0, b0 = row[room]
                d -= a1 * (usable + du) + b1 - a0 * usable - b0
        # The positions: every GPU with room below the last picked free, then the first ones at it.
        last = picked[-1]
        at_last = count - (bisect_left(vals, last) - i0)
        chosen = []
        for i, (_, f) in enumerate(gpus):
            if per <= f < last:
                chosen.append(i)
            elif f == last and at_last:
                chosen.append(i)
                at_last -= 1
        return self._finish(d, sum(picked) - per * count, tuple(chosen), gpus, per, None, sum(vals))

    def _finish(
        self,
        units: int,
        left: int,
        chosen: tuple[int, ...],
        gpus: GpuView,
        per: int,
        cpu_after: int | None,
        node_free: int | None = None,
    ) -> Evaluation:
        """The score of the chosen placement from its exact fragmentation growth (`units`)."""
        total_w = self._pricer.total_w
        delta_f = units / total_w if units else 0.0
        # One float, lexicographic in practice: fragmentation growth, then the chosen GPU's leftover,
        # then the node's leftover free GPU and CPU (best fit). Deltas differ by >= ~1e-4 in practice.
        if node_free is None:
            node_free = sum(f for _, f in gpus)
        node_left = node_free - per * len(chosen)
        cpu_term = 0.0 if cpu_after is None else cpu_after / (cpu_after + 1e6)
        if self.pressure and chosen:
            # Scarcity: GPU capacity that pods restricted to this GPU model need costs more to take,
            # so pods that may run elsewhere leave it to them (constant for a pod that may not).
            delta_f += self.pressure * self.model_pressure(gpus[chosen[0]][0]) * per * len(chosen)
        return -(delta_f + 1e-7 * left + 1e-10 * (node_left + cpu_term)), chosen

    def _evaluate_host(self, view: NodeView, demand: Demand, pricer: Pricer) -> Evaluation:
        """`_evaluate` with CPU known, for a CPU-only or single-GPU demand: the same candidates, the same
        exact integer prices, in one pass over the GPUs.

        `fragmentation_units` is then a sum over the node's GPUs (`Pricer.gpu_terms`, memoised per
        (model, free) and CPU class) plus, per multi-GPU key, a term of the node's (room, usable) for
        the key (`Pricer.key_terms`), and one division for the node's CPU; a candidate changes one
        GPU's terms and, for the keys it had room for, the key's usable capacity (or its room, where the
        share takes it below the key's per_gpu). The host-aware gap price's stranded part is a sum over
        the node's partly used GPUs less the candidate's own. The general path recounts both per
        candidate (tests/unit/placement: `test_host_fast_path_*` check the two give the same evaluation)."""
        gpus, cpu_free, mem_free = view
        assert cpu_free is not None
        if cpu_free < demand.cpu or (mem_free is not None and mem_free < demand.memory):
            return None  # `eligible_positions`' host test
        per, models = demand.per_gpu, demand.models
        # What does not depend on the pod, once per node state: each is priced for several pods (the
        # timeline asks for every demand that may fit it). Keyed by the view object, which the entry keeps
        # alive (so its id cannot be reused while it stands); `hosted` cannot change within one pricer
        # (its first evaluation fills `host_needs`, and the gap prices are solved once).
        prefix = pricer.view_prefixes.get(id(view))
        if prefix is None or prefix[0] is not view:
            facts = pricer.host_facts(gpus)
            cls = pricer.cpu_class(cpu_free)
            if self.host_quantile is not None and pricer.host_needs is None:
                pricer.host_needs = self.host_needs()
            gp = pricer.gap_prices()
            hosted = gp is not None and pricer.host_needs is not None
            before_set = pricer.hostable(cpu_free, mem_free) if hosted else None
            prefix = (view, facts, cls, pricer.node_sums(gpus, cls, facts), gp, hosted, before_set)
            pricer.keep_view_prefix(id(view), prefix)
        _, facts, cls, (total, kept, fill, need), gp, hosted, before_set = prefix
        cpu_after = cpu_free - demand.cpu
        cls_after = pricer.cpu_class(cpu_after)
        if hosted:
            after_set = pricer.hostable(cpu_after, None if mem_free is None else mem_free - demand.memory)
        # Every price here reads the CPU only through the classes and sets above, unless the node's CPU
        # caps its fill (`host_units`), before or after the pod: the answer (the best candidates) is then
        # the same for every order of these GPUs and every free CPU and memory in these classes, so it is
        # kept per (share, classes, sets) in the facts of the GPUs' multiset, with the largest CPU ask
        # after the pod (`max_need`), which must stay under the cap for it to hold.
        weight = pricer.table.weight
        over = cpu_after * weight
        uncapped = need <= cpu_free * weight
        sets = (before_set, after_set) if hosted else (None, None)
        bests_key = (per, models, demand.count, cls, cls_after, *sets)
        if uncapped:
            hit = facts.bests.get(bests_key)
            if hit is not None and hit[3] <= over:
                best_d, best_left, tied, _ = hit
                if not tied:  # a CPU-only pod
                    return self._finish(best_d, 0, (), gpus, per, cpu_after, total)
                best_i = gpus.index(tied[0]) if len(tied) == 1 else min(gpus.index(g) for g in tied)
                return self._finish(best_d, best_left, (best_i,), gpus, per, cpu_after, total)
        if demand.count:  # the candidates: each distinct GPU state with room, at its first position
            if models:
                elig = [(g, i) for g, i in facts.distinct if g[1] >= per and model_allowed(models, g[0])]
            else:
                elig = [(g, i) for g, i in facts.distinct if g[1] >= per]
            if not elig:
                return None
        before = pricer.host_units(total, kept, fill, need, cpu_free)
        if cls_after != cls:
            _, kept, fill, need = pricer.node_sums(gpus, cls_after, facts)
        stranded = 0  # `Pricer._stranded` over every partly used GPU of the node
        moved = False
        if hosted and before_set is not after_set:
            moved = True
            stranded = pricer.stranded(facts, gpus, before_set, after_set)
        if demand.count == 0:
            after = pricer.host_units(total, kept, fill, need, cpu_after)
            if stranded:
                assert gp is not None
                after += pricer._host_units(stranded, gp)
            if uncapped and need <= over:
                pricer.keep_best(facts, bests_key, (after - before, 0, (), need))
            return self._finish(after - before, 0, (), gpus, per, cpu_after, total)
        # What taking `per` from a GPU changes in the node's sums, and its own gap price part: per
        # (model, free), the same on every node of these CPU class and hostable sets.
        moves = pricer.share_moves(cls_after, per, *sets)
        # `host_units` after the share, written out (one call per candidate is most of the cost).
        total_after = total - per
        base = total_after * pricer.total_w
        keep_w, wa = pricer.keep_w, pricer.wa
        host_units = pricer._host_units
        best_d = best_left = best_i = 0
        best = False
        tied: list[tuple[str, int]] = []  # the GPU states at the best (price, left): one but on mixed models
        max_need = 0
        priced = hosted and per in gp.price  # type: ignore[union-attr]
        keyed = facts.keyed
        for g, i in elig:
            move = moves.get(g)
            if move is None:
                move = pricer.share_move(moves, g, per, cls_after, *sets)
            dk, dfill, dneed, own, strand = move
            if keyed is not None:  # the keys this GPU had room for: their part after the share
                m, f = g
                a_left = f - per
                for k, q in pricer.keys_for(m):
                    if q > f:
                        break
                    room, usable = keyed[k]
                    a0, f0, n0 = pricer.key_terms(k, cls_after, room)
                    if a_left >= q:
                        dk -= a0 * per
                    else:
                        a1, f1_, n1_ = pricer.key_terms(k, cls_after, room - 1)
                        dk += a1 * (usable - f) - a0 * usable
                        dfill += f1_ - f0
                        dneed += n1_ - n0
            if total_after == 0:
                d = -before
            else:
                f1, n1 = fill + dfill, need + dneed
                if n1 > max_need:
                    max_need = n1
                if n1 > over:
                    f1 = f1 * over // n1
                d = base - (keep_w * (kept + dk) + wa * f1) - before
            if not hosted:
                d += own
            else:
                v = stranded - strand if moved else 0
                if priced:
                    d += host_units(v + own, gp)  # type: ignore[arg-type]
                elif v:
                    d += host_units(v, gp)  # type: ignore[arg-type]
            a = g[1] - per
            if not best or d < best_d or (d == best_d and a < best_left):
                best_d, best_left, best_i, best = d, a, i, True
                tied = [g]
            elif d == best_d and a == best_left:
                tied.append(g)
        if not best:
            return None
        if uncapped and max_need <= over:
            pricer.keep_best(facts, bests_key, (best_d, best_left, tuple(tied), max_need))
        return self._finish(best_d, best_left, (best_i,), gpus, per, cpu_after, total)

    def _evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        pricer = self._pricer
        if view[1] is None:
            if demand.count == 1:
                return self._evaluate_one_gpu(view, demand, pricer)
            return self._evaluate_gpus(view, demand, pricer)
        gpus, cpu_free, _ = view
        if cpu_free is not None and demand.count <= 1 and self.fast_host:
            return self._evaluate_host(view, demand, pricer)
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        table = pricer.table
        cpu_after = None if cpu_free is None else cpu_free - demand.cpu
        node_free = sum(f for _, f in gpus)
        per = demand.per_gpu
        if demand.count == 1:
            candidates: list[tuple[int, ...]] = []
            seen = set()
            for i in elig:
                if gpus[i] not in seen:
                    seen.add(gpus[i])
                    candidates.append((i,))
        else:
            candidates = [best_fit(view, elig, demand.count)]
        best: tuple[int, int, tuple[int, ...]] | None = None
        if cpu_free is None:
            # The extender's case: exact incremental prices, O(1) per changed GPU (see Pricer).
            sums = self.key_sums(tuple(sorted(gpus)), pricer) if pricer.keys else ()
            for chosen in candidates:
                if len(chosen) == 1:
                    m, f = gpus[chosen[0]]
                    delta = pricer.delta_one(sums, m, f, f - per) + pricer.gap(f, per)
                else:
                    delta = pricer.delta(sums, [(gpus[i][0], gpus[i][1], gpus[i][1] - per) for i in chosen])
                left = sum(gpus[i][1] for i in chosen) - per * len(chosen)
                if best is None or (delta, left) < best[:2]:
                    best = (delta, left, chosen)
        else:
            before = self.node_units(gpus, cpu_free)
            gpus_sorted = tuple(sorted(gpus))
            aggs = self.aggregates(gpus_sorted) if demand.count == 1 else ()
            shift_memo = self._shift_memo
            if self.host_quantile is not None and pricer.host_needs is None:
                pricer.host_needs = self.host_needs()
            mem_free = view[2]
            host = (cpu_free, mem_free)
            host_after = (cpu_after, None if mem_free is None else mem_free - demand.memory)
            for chosen in candidates:
                if demand.count == 1:
                    # One GPU changes: update the per-group sums instead of recounting the node.
                    m, f = gpus[chosen[0]]
                    key = (gpus_sorted, m, f, per)
                    shifted = shift_memo.get(key)
                    if shifted is None:
                        shifted = shift_aggregates(aggs, table, m, f, f - per)
                        if len(shift_memo) >= self.MEMO_LIMIT:
                            shift_memo.clear()
                        shift_memo[key] = shifted
                    after = self._units(node_free - per, shifted, cpu_after, pricer) + pricer.host_gap(
                        gpus, chosen[0], per, host, host_after
                    )
                else:
                    after_gpus = list(gpus)
                    for i in chosen:
                        m, f = after_gpus[i]
                        after_gpus[i] = (m, f - per)
                    after = self.node_units(tuple(after_gpus), cpu_after) + pricer.host_strand(
                        gpus, chosen, host, host_after
                    )
                delta = after - before
                left = sum(gpus[i][1] for i in chosen) - per * len(chosen)
                if best is None or (delta, left) < best[:2]:
                    best = (delta, left, chosen)
        assert best is not None
        units, left, chosen = best
        return self._finish(units, left, chosen, gpus, per, cpu_after)
