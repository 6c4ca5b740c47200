"""`frag`'s scores of many node states for one demand, in one pass: what the extender needs when a
demand is new and every state of the cluster must be ranked for it (BestNodeIndex: 5,000 nodes in
5,000 states, each priced once per new demand; `evaluate` one by one costs ~12 us a state).

The same integers as `FragPolicy._evaluate_host` (CPU known, a CPU-only or single-GPU pod, single-GPU
classes only). What a state's price needs apart from the demand is kept per state across demands
(`Pricer.batch_facts`: its CPU class, sums, price before, and the CPU and memory it may lose before
its CPU class or hostable sets move). While the pod leaves both where they are, a share on GPU g
grows the node's fragmentation by

    S - per x total_w + K(g) - wa x min(F(g), F(g) x over // N(g))

with S the state's (free x total_w - keep_w x kept - before), over the CPU left x table weight, and
K (the move of g's kept terms and its own gap price), F and N (the node's fill and CPU need after
it) fixed per state and share size. A GPU whose K is no larger and whose F and F/N are no smaller
than another's is at least as good for every CPU ask, so each state keeps only its undominated GPUs
per share size (usually one or two of eight). Anything else (a class or hostable set that moves,
the last free unit taken, no CPU known) is priced the long way, in this pass or by `evaluate`.
tests/unit/placement/test_frag_scores.py compares the two on random clusters, score for score.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING

from share_placement.model import NEG_INF
from share_placement.model import Demand
from share_placement.model import NodeView
from share_placement.model import model_allowed

if TYPE_CHECKING:
    from share_placement.frag import FragPolicy
    from share_placement.frag_pricing import Pricer

MAX_SHAPES = 32  # share shapes whose fronts are built with every state's facts
# States whose facts are kept (1-2 KB each with their fronts): a 5,000-node cluster's, and the ~15,000
# states its binds leave behind before they are dropped all at once.
FACTS_LIMIT = 20_000

# (K, leftover, position, F, N) of a GPU a share may go on: sorted, the order dominance is swept in
_Move = tuple[int, int, int, int, int]


def frag_scores(policy: FragPolicy, views: Sequence[NodeView], demand: Demand) -> list[float]:
    """[evaluate(view, demand)'s score, or -inf where it does not fit] for every view, in order."""
    _ = policy.table  # refresh first, as evaluate does: the tables below belong to the current one
    pricer = policy._pricer

    def evaluated(view: NodeView) -> float:
        ev = policy.evaluate(view, demand)
        return NEG_INF if ev is None else ev[0]

    count, per, models = demand.count, demand.per_gpu, demand.models
    if count > 1 or pricer.keys or not policy.fast_host or not pricer.table.groups or pricer.wa < 0:
        return [evaluated(view) for view in views]
    if policy.host_quantile is not None and pricer.host_needs is None:
        pricer.host_needs = policy.host_needs()
    hosted = pricer.gap_prices() is not None and pricer.host_needs is not None
    cpu_ask, mem_ask = demand.cpu, demand.memory
    weight, total_w, keep_w, wa = pricer.table.weight, pricer.total_w, pricer.keep_w, pricer.wa
    per_w = per * total_w
    finish = policy._finish
    shape = (per, models)
    facts = pricer.batch_facts
    if len(facts) >= FACTS_LIMIT + len(views):
        facts.clear()  # states gone since (each bind leaves one): priced afresh as they are met
    shapes = pricer.batch_fronts
    if not shapes:
        # A state's fronts are built with its facts for every share size learned (and asked since):
        # the first batch on a table prices every state for all of them, the pods after find them.
        for g in pricer.table.groups:
            if g.count == 1 and not g.models and g.per_gpu > 0:
                shapes[(g.per_gpu, ())] = _Fronts(pricer, g.per_gpu, (), hosted)
    fronts = shapes.get(shape)
    if fronts is None:
        fronts = _Fronts(pricer, per, models, hosted)
        if count == 1 and len(shapes) < MAX_SHAPES:
            shapes[shape] = fronts

    out: list[float] = []
    append = out.append
    for view in views:
        gpus, cpu_free, mem_free = view
        if cpu_free is None:
            append(evaluated(view))
            continue
        fact = facts.get(id(view))
        if fact is None or fact[0] is not view:  # (the fact holds the view: its id is not reused)
            fact = facts[id(view)] = _state_facts(pricer, view, hosted, shapes)
        _, total, kept, fill, need, before, s, cpu_floor, mem_floor, cls, sets, by_shape = fact
        cpu_after = cpu_free - cpu_ask
        mem_after = None if mem_free is None else mem_free - mem_ask
        if cpu_after < 0 or (mem_after is not None and mem_after < 0):
            append(NEG_INF)  # eligible_positions' host check
            continue
        if cpu_after < cpu_floor or (mem_after is not None and mem_after < mem_floor) or total == per:
            append(evaluated(view))  # the CPU class or a hostable set moves, or the last unit goes
            continue
        over = cpu_after * weight
        if count == 0:
            after = total * total_w - (keep_w * kept + wa * (fill * over // need if need > over else fill))
            append(finish(after - before if total else 0, 0, (), gpus, per, cpu_after, total)[0])
            continue
        front = by_shape.get(shape)
        if front is None:
            front = by_shape[shape] = fronts.of(gpus, cls, sets, fill, need)
        best_d = best_left = 0
        best_i = -1
        s_per = s - per_w
        for k, a, i, f, n in front:
            d = s_per + k - wa * (f * over // n if n > over else f)
            if best_i < 0 or d < best_d or (d == best_d and (a < best_left or (a == best_left and i < best_i))):
                best_d, best_left, best_i = d, a, i
        if best_i < 0:
            append(NEG_INF)
        else:
            append(finish(best_d, best_left, (best_i,), gpus, per, cpu_after, total)[0])
    return out


def _state_facts(pricer: Pricer, view: NodeView, hosted: bool, shapes: dict[tuple, _Fronts]) -> tuple:
    """(view, free total, kept, fill, need, price before, S, CPU floor, memory floor, CPU class,
    hostable sets, fronts per share size): the floors are the least CPU and memory left at which
    the state keeps its CPU class and hostable sets (a pod leaving less is priced the long way)."""
    gpus, cpu_free, mem_free = view
    assert cpu_free is not None
    cls = pricer.cpu_class(cpu_free)
    total, kept, fill, need = pricer.node_sums(gpus, cls)
    before = pricer.host_units(total, kept, fill, need, cpu_free)
    cpu_floor = _floor_of(pricer._cpu_breaks, cpu_free)
    mem_floor = 0
    sets: tuple = (None, None)
    if hosted:
        sets = (pricer.hostable(cpu_free, mem_free),) * 2  # (sets the needs' breaks)
        cpu_breaks, mem_breaks = pricer._need_breaks  # type: ignore[misc]
        cpu_floor = max(cpu_floor, _floor_of(cpu_breaks, cpu_free))
        if mem_free is not None:
            mem_floor = _floor_of(mem_breaks, mem_free)
    s = total * pricer.total_w - pricer.keep_w * kept - before
    by_shape = {shape: fronts.of(gpus, cls, sets, fill, need) for shape, fronts in shapes.items()}
    return (view, total, kept, fill, need, before, s, cpu_floor, mem_floor, cls, sets, by_shape)


def _floor_of(breaks: tuple[int, ...], value: int) -> int:
    """The largest break at or below `value` (0 if none): the class holds from it up to the next."""
    j = bisect_right(breaks, value)
    return breaks[j - 1] if j else 0


class _Fronts:
    """Each state's undominated GPUs for one share size, from per-(CPU class, sets) move tables
    built once per batch."""

    def __init__(self, pricer: Pricer, per: int, models: tuple[str, ...], hosted: bool) -> None:
        self.pricer, self.per, self.models, self.hosted = pricer, per, models, hosted
        gp = pricer.gap_prices()
        self.gp = gp
        self.priced = hosted and self.per in gp.price  # type: ignore[union-attr]
        self.tables: dict[tuple, dict[tuple[str, int], tuple[int, int, int] | None]] = {}

    def _move(self, table: dict, g: tuple[str, int], cls: int, sets: tuple) -> tuple[int, int, int] | None:
        """(K, fill change, need change) of a share on g; None where it may not go."""
        pricer, per = self.pricer, self.per
        m, f = g
        if f < per or (self.models and not model_allowed(self.models, m)):
            table[g] = None
            return None
        moves = pricer.share_moves(cls, per, *sets)
        move = moves.get(g)
        if move is None:
            move = pricer.share_move(moves, g, per, cls, *sets)
        dk, dfill, dneed, own, _ = move
        k = -pricer.keep_w * dk
        if not self.hosted:
            k += own
        elif self.priced:
            k += pricer._host_units(own, self.gp)  # type: ignore[arg-type]
        out = table[g] = (k, dfill, dneed)
        return out

    def of(self, gpus: tuple, cls: int, sets: tuple, fill: int, need: int) -> tuple[_Move, ...]:
        """The GPUs a share may go on, less those another is at least as good as for every CPU ask.

        g dominates h when K(g) <= K(h), F(g) >= F(h) and F(g)/N(g) >= F(h)/N(h) (F, N >= 0), and on
        an equal K g comes first in (leftover, position): min(F, F x over // N) is then no smaller
        for g at every over >= 0, so its growth is no larger and it wins any tie. Only a GPU earlier
        in (K, leftover, position) order can dominate a later one, and dominance is transitive: one
        sweep against the GPUs kept so far."""
        key = (cls, *sets)
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = {}
        per = self.per
        cands = []
        for i, g in enumerate(gpus):
            move = table.get(g, False)
            if move is False:
                move = self._move(table, g, cls, sets)
            if move is not None:
                cands.append((move[0], g[1] - per, i, fill + move[1], need + move[2]))
        cands.sort()
        kept: list[_Move] = []
        for c in cands:
            fc, nc = c[3], c[4]
            if fc >= 0 and nc >= 0:
                for o in kept:
                    fo, no = o[3], o[4]
                    if no >= 0 and fo >= fc and fo * nc >= fc * no:
                        break
                else:
                    kept.append(c)
            else:
                kept.append(c)
        return tuple(kept)
