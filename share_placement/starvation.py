"""No big pod starved: the decisions behind issue 40's remedies, pure, for the extender and share-sim alike.

Under churn a pod that needs several whole GPUs waits behind a stream of small pods: each departure frees
a GPU or part of one and the next small pod takes it. Two remedies, each a pure decision here (the
third, room left for the shapes that wait, is a policy wrapper: share_placement.room):

- **Reservations** (`plan_reservations`): a pod that has waited past a threshold (highest priority, then
  longest wait, first) gets the node where it will fit soonest (`reservation_node`: fewest GPUs short,
  then the fewest units to drain, as running pods' departures are not known) and a RESERVATION hold
  (share_core.holds) on the GPUs it will take: pods of the same or lower priority see them as taken,
  so they drain as their pods leave and no newcomer refills them. Bounded (`ReservationLimits`): at most
  `max_holds` holds, at most `max_share` of the cluster's GPU capacity held, one reservation per node
  (small pods keep every other node), each hold for `ttl_s` at most (then the pod may be given the node
  that is nearest now).
- **Consolidation** (`plan_consolidation`): when a waiting pod is short of GPUs only because small
  pods sit on them, move at most `max_moves` of those pods, each movable (owned by a controller that
  recreates it, or marked movable; never a bare pod), and only when the policy's own choice places
  every moved pod again on the cluster as it will be (the waiting pod's GPUs taken). The node chosen
  needs the fewest moves, then the fewest units moved.

Units are whatever the caller counts in (GiB in the extender, thousandths of a GPU in share-sim). Nodes
are `NodeState`s (the extender's snapshots; share-sim builds them), so both call the very same code.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace

from share_core.holds import Hold
from share_core.holds import HoldKind
from share_placement.model import NEG_INF
from share_placement.model import Demand
from share_placement.model import GpuSlot
from share_placement.model import NodeState
from share_placement.model import Policy
from share_placement.model import model_allowed

# -- what a waiting pod lacks on a node --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shortfall:
    """How far `node` is from taking a demand: the GPUs it would use (`gpus`, indices), how many of
    them lack room now (`short`) and the units still to free on them (`drain`)."""

    node: str
    gpus: tuple[int, ...]
    short: int
    drain: int

    @property
    def key(self) -> tuple[int, int, str]:
        """Soonest first: fewest GPUs short, then least to drain, then the node's name (stable)."""
        return (self.short, self.drain, self.node)


def _usable(g: GpuSlot, demand: Demand) -> bool:
    """A GPU that could ever take one of the demand's shares (healthy, big enough, an allowed model)."""
    return g.healthy and g.total >= demand.per_gpu and (not demand.models or model_allowed(demand.models, g.model))


def shortfall(node: NodeState, demand: Demand, held: Mapping[int, int] | None = None) -> Shortfall | None:
    """Where on `node` the GPU demand would go once room is freed, and how much must be freed first;
    None when the node can never take it (too few usable GPUs, or too little CPU or memory in all).

    The GPUs are the `count` usable ones with the most free room (lowest index on ties); `held` (GPU
    index -> units) counts as taken, as filter counts holds that apply to the asking pod."""
    if demand.count < 1:
        raise ValueError("shortfall is for GPU pods (count >= 1)")
    held = held or {}
    usable = [(max(0, g.free - held.get(g.index, 0)), g.index) for g in node.gpus if _usable(g, demand)]
    if len(usable) < demand.count:
        return None
    usable.sort(key=lambda fi: (-fi[0], fi[1]))
    chosen = usable[: demand.count]
    short = sum(1 for free, _ in chosen if free < demand.per_gpu)
    drain = sum(demand.per_gpu - free for free, _ in chosen if free < demand.per_gpu)
    return Shortfall(node.name, tuple(sorted(i for _, i in chosen)), short, drain)


def reservation_node(
    nodes: Iterable[NodeState],
    demand: Demand,
    taken: Iterable[str] = (),
    held: Mapping[str, Mapping[int, int]] | None = None,
) -> Shortfall | None:
    """The node where the demand will fit soonest (`Shortfall.key`), skipping `taken` nodes (one
    reservation a node); None when no node could ever take it. `held`: node -> GPU -> units held by
    other pods' holds that apply to this one."""
    skip = set(taken)
    held = held or {}
    best: Shortfall | None = None
    for node in nodes:
        if node.name in skip:
            continue
        sf = shortfall(node, demand, held.get(node.name))
        if sf is not None and (best is None or sf.key < best.key):
            best = sf
    return best


# -- reservations -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waiter:
    """A pod waiting for room: who it is, its priority, since when it waits (s), what it asks."""

    uid: str
    name: str  # namespace/name, for people
    priority: int
    since: float
    demand: Demand


@dataclass(frozen=True, slots=True)
class ReservationLimits:
    """The bounds that keep reservations from starving everyone else.

    `after_s`: a pod gets a reservation once it has waited this long; `max_holds`: reservations held at
    once, cluster-wide; `max_share`: the fraction of the cluster's GPU units they may hold together;
    `ttl_s`: how long one hold lasts (its expiry; the pod may then get the node nearest at that time)."""

    after_s: float = 600.0
    max_holds: int = 4
    max_share: float = 0.05
    ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.after_s < 0 or self.max_holds < 0 or not 0.0 <= self.max_share <= 1.0 or not self.ttl_s > 0:
            raise ValueError(
                "reservation limits: after_s >= 0, max_holds >= 0, max_share in [0, 1] and ttl_s > 0 "
                f"(got after_s={self.after_s}, max_holds={self.max_holds}, max_share={self.max_share}, "
                f"ttl_s={self.ttl_s})"
            )


def renewal_horizon(period: float, limits: ReservationLimits) -> float:
    """How soon before its expiry a reservation is planned again (`plan_reservations`' renew_within) by a
    loop that runs every `period` seconds: two periods (a pass may start late), but never more than half
    the hold's life, so a hold is not renewed on the pass that made it."""
    return min(2.0 * period, limits.ttl_s / 2.0)


def keeps_draining(hold: Hold, node: NodeState | None, demand: Demand) -> bool:
    """Whether a reservation's node has drained since the hold was (re)made: fewer GPUs short of the
    demand, or as many and fewer units still to drain on them (holds not counted, then or now). A hold
    that recorded nothing (an older extender's) does not; nor does a node gone or no longer able to host
    the demand."""
    if hold.shortfall is None or node is None:
        return False
    now = shortfall(node, demand)
    return now is not None and (now.short, now.drain) < hold.shortfall


def queue_order(waiters: Iterable[Waiter]) -> list[Waiter]:
    """Highest priority first, then the longest wait (then the UID, so the order is total)."""
    return sorted(waiters, key=lambda w: (-w.priority, w.since, w.uid))


def held_total(holds: Iterable[Hold], kind: HoldKind | None = None) -> int:
    """Units the holds take together (of one kind, or all)."""
    return sum(h.per_gpu * len(h.gpus) for h in holds if kind is None or h.kind is kind)


def plan_reservations(
    waiters: Iterable[Waiter],
    nodes: Sequence[NodeState],
    holds: Sequence[Hold],
    now: float,
    limits: ReservationLimits,
    capacity: int | None = None,
    renew_within: float = 0.0,
) -> list[Hold]:
    """The new RESERVATION holds to make now.

    Waiting GPU pods past `limits.after_s`, in `queue_order`, each without a live reservation, get one on
    their `reservation_node` among the nodes no other live reservation holds, as long as the count and
    share bounds allow (a pod that does not fit in the share left is passed over, the next may).
    `capacity`: the cluster's GPU units (default: summed over `nodes`).

    A reservation that expires within `renew_within` seconds (the caller's next pass would come after
    it) while its pod still waits is planned again now, the pod's own hold counted as free for it: the
    room drained under it stays its pod's when that node is still the soonest, instead of going back to
    the queue at the expiry and being drained again elsewhere. The hold returned for such a pod replaces
    its old one (the caller swaps them); its bounds are the old one's, so a renewal is never refused for
    the count or the share the old hold already took. Only a node that keeps draining is renewed
    (`keeps_draining`): one whose last pods run on for hours would hold its pod there, its other GPUs idle,
    where the expiry lets the pod try elsewhere. Each hold records its node's shortfall when made."""
    by_name = {n.name: n for n in nodes}
    live = [h for h in holds if not h.expired(now)]
    reservations = [h for h in live if h.kind is HoldKind.RESERVATION]
    by_holder = {h.holder_uid: h for h in reservations}
    due = {uid: h for uid, h in by_holder.items() if h.expires - now <= renew_within} if renew_within > 0 else {}
    taken = {h.node: h.holder_uid for h in reservations}  # one reservation a node
    if capacity is None:
        capacity = sum(g.total for n in nodes for g in n.gpus)
    budget = limits.max_share * capacity - held_total(reservations)
    room = limits.max_holds - len(reservations)
    out: list[Hold] = []
    replaced: list[Hold] = []
    for w in queue_order(waiters):
        d = w.demand
        own = due.get(w.uid)
        if own is not None and not keeps_draining(own, by_name.get(own.node), d):
            own = None  # kept until it expires
        if d.count < 1 or (own is None and (w.uid in by_holder or now - w.since < limits.after_s)):
            continue
        own_units = held_total([own]) if own is not None else 0
        units = d.per_gpu * d.count
        if room + (own is not None) <= 0 or units > budget + own_units:
            continue
        # Holds made for others that this pod must respect (a higher-priority pod's reservation); its
        # own hold does not apply to it.
        others: dict[str, dict[int, int]] = {}
        for h in live + out:
            if h.applies_to(w.priority, w.uid) and not any(h is r for r in replaced):
                per = others.setdefault(h.node, {})
                for g in h.gpus:
                    per[g] = per.get(g, 0) + h.per_gpu
        skip = {n for n, uid in taken.items() if uid != w.uid}
        sf = reservation_node(nodes, d, skip, others)
        if sf is None:
            continue
        made = shortfall(by_name[sf.node], d)
        hold = Hold(
            kind=HoldKind.RESERVATION,
            node=sf.node,
            gpus=sf.gpus,
            per_gpu=d.per_gpu,
            priority=w.priority,
            expires=now + limits.ttl_s,
            holder_uid=w.uid,
            holder=w.name,
            shortfall=None if made is None else (made.short, made.drain),
        )
        out.append(hold)
        if own is not None:  # the old hold's node, count and units go to the new one
            replaced.append(own)
            del taken[own.node]
            budget += own_units
            room += 1
        taken[sf.node] = w.uid
        budget -= units
        room -= 1
    return out


# -- consolidation ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Resident:
    """A pod running on a node: its GPUs (indices) and units on each, and whether it may be moved
    (owned by a controller that recreates it, or marked movable by the operator; never a bare pod, nor
    one its PodDisruptionBudget protects now: the caller decides, and says so in `movable`)."""

    uid: str
    name: str
    node: str
    gpus: tuple[int, ...]
    demand: Demand
    movable: bool
    owner_uid: str = ""
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Move:
    """Resident `pod` evicted from its node and placed again on `node`'s `gpus`."""

    pod: Resident
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    """The waiting pod goes to `node`'s `gpus` once `moves` are done."""

    waiter: Waiter
    node: str
    gpus: tuple[int, ...]
    moves: tuple[Move, ...]

    @property
    def units_moved(self) -> int:
        return sum(m.pod.demand.per_gpu * m.pod.demand.count for m in self.moves)

    def holds(self, now: float, ttl_s: float) -> list[Hold]:
        """What the plan holds until the pods are bound: the waiting pod's GPUs (for it), and each moved
        pod's new GPUs (for its controller's recreated pod, or the pod itself when it has none)."""
        out = [
            Hold(
                HoldKind.CONSOLIDATION,
                self.node,
                self.gpus,
                self.waiter.demand.per_gpu,
                self.waiter.priority,
                now + ttl_s,
                self.waiter.uid,
                self.waiter.name,
            )
        ]
        for m in self.moves:
            if m.pod.demand.count == 0:
                continue
            out.append(
                Hold(
                    HoldKind.CONSOLIDATION,
                    m.node,
                    m.gpus,
                    m.pod.demand.per_gpu,
                    self.waiter.priority,
                    now + ttl_s,
                    m.pod.uid,
                    m.pod.name,
                    owner_uid=m.pod.owner_uid,
                )
            )
        return out


@dataclass(slots=True)
class Overlay:
    """The cluster as a consolidation plan changes it: units taken (+) or given back (-) per node and GPU,
    and CPU and memory taken (+) or given back (-) per node."""

    gpu: dict[str, dict[int, int]] = field(default_factory=dict)
    cpu: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)

    def take(self, node: str, gpus: Iterable[int], demand: Demand, sign: int = 1) -> None:
        per = self.gpu.setdefault(node, {})
        for g in gpus:
            per[g] = per.get(g, 0) + sign * demand.per_gpu
        self.cpu[node] = self.cpu.get(node, 0) + sign * demand.cpu
        self.memory[node] = self.memory.get(node, 0) + sign * demand.memory


def apply_overlay(node: NodeState, overlay: Overlay) -> NodeState:
    """`node` with the overlay's changes (free room never below 0 nor above a GPU's total)."""
    gpu = overlay.gpu.get(node.name)
    if not gpu and node.name not in overlay.cpu:
        return node
    gpus = node.gpus
    if gpu:
        gpus = tuple(
            GpuSlot(g.index, g.model, g.total, min(g.total, max(0, g.free - gpu.get(g.index, 0))), g.healthy)
            for g in node.gpus
        )
    cpu = node.cpu_free
    if cpu is not None:
        cpu -= overlay.cpu.get(node.name, 0)
    memory = node.memory_free
    if memory is not None:
        memory -= overlay.memory.get(node.name, 0)
    return NodeState(node.name, gpus, cpu, memory)


# Where the policy would put a demand on the cluster as an overlay changes it: (node, GPU indices) or None.
Placer = Callable[[Demand, "Overlay"], tuple[str, tuple[int, ...]] | None]


def policy_placer(policy: Policy, nodes: Sequence[NodeState]) -> Placer:
    """The policy's own choice over `nodes` as an overlay changes them (highest score, first on ties)."""

    def place(demand: Demand, overlay: Overlay) -> tuple[str, tuple[int, ...]] | None:
        best: NodeState | None = None
        best_score = NEG_INF
        for node in nodes:
            seen = apply_overlay(node, overlay)
            s = policy.score(seen, demand)
            if s > best_score:
                best, best_score = seen, s
        if best is None:
            return None
        chosen = policy.choose(best, demand)
        return None if chosen is None else (best.name, chosen)

    return place


@dataclass(frozen=True, slots=True)
class _Candidate:
    node: str
    gpus: tuple[int, ...]
    movers: tuple[Resident, ...]

    @property
    def key(self) -> tuple[int, int, str]:
        return (len(self.movers), sum(r.demand.per_gpu * r.demand.count for r in self.movers), self.node)


def _candidate(node: NodeState, residents: Sequence[Resident], demand: Demand, max_moves: int) -> _Candidate | None:
    """The cheapest set of movable residents whose leaving makes room for `demand` on `node` (fewest
    pods, then fewest units), or None: too many, or one that must stay is in the way. `residents` are
    already those that may move for this pod or not (`movable` says), see `plan_consolidation`."""
    if node.cpu_free is not None or node.memory_free is not None:
        cpu_back = sum(r.demand.cpu for r in residents if r.movable)
        mem_back = sum(r.demand.memory for r in residents if r.movable)
        if node.cpu_free is not None and node.cpu_free + cpu_back < demand.cpu:
            return None
        if node.memory_free is not None and node.memory_free + mem_back < demand.memory:
            return None
    on_gpu: dict[int, list[Resident]] = {}
    for r in residents:
        for g in r.gpus:
            on_gpu.setdefault(g, []).append(r)
    options: list[tuple[int, int, int, tuple[Resident, ...]]] = []  # (pods, units, index, movers)
    for g in node.gpus:
        if not _usable(g, demand):
            continue
        if g.free >= demand.per_gpu:
            options.append((0, 0, g.index, ()))
            continue
        there = on_gpu.get(g.index, [])
        # Free enough by moving its movable pods, largest first (the fewest pods), until the GPU has the room.
        free = g.free
        movers: list[Resident] = []
        for r in sorted(there, key=lambda r: (-r.demand.per_gpu, r.uid)):
            if free >= demand.per_gpu:
                break
            if not r.movable:
                continue
            movers.append(r)
            free += r.demand.per_gpu
        if free < demand.per_gpu:
            continue
        options.append((len(movers), sum(r.demand.per_gpu for r in movers), g.index, tuple(movers)))
    if len(options) < demand.count:
        return None
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    picked = options[: demand.count]
    movers_all: dict[str, Resident] = {}
    for *_, movers in picked:
        for r in movers:
            movers_all[r.uid] = r
    if not movers_all or len(movers_all) > max_moves:
        return None
    # Host room after the movers leave.
    if node.cpu_free is not None and node.cpu_free + sum(r.demand.cpu for r in movers_all.values()) < demand.cpu:
        return None
    if node.memory_free is not None and (
        node.memory_free + sum(r.demand.memory for r in movers_all.values()) < demand.memory
    ):
        return None
    return _Candidate(node.name, tuple(sorted(o[2] for o in picked)), tuple(movers_all.values()))


def plan_consolidation(
    waiter: Waiter,
    nodes: Sequence[NodeState],
    residents: Mapping[str, Sequence[Resident]],
    policy: Policy | None = None,
    max_moves: int = 2,
    max_tries: int = 8,
    placer: Placer | None = None,
    held: Mapping[str, Mapping[int, int]] | None = None,
) -> tuple[ConsolidationPlan | None, str]:
    """A plan that makes room for `waiter` by moving at most `max_moves` movable pods, or None and why not
    (for a person: an Event, a log line).

    A pod may move when it is `movable` and does not outrank the waiter (priority at most the waiter's).

    Candidate nodes in order of fewest pods moved, then fewest units (at most `max_tries` of them are
    tried); a candidate is taken only when the policy's own choice places every moved pod again, largest
    first, on the cluster as the plan leaves it: the waiter's GPUs taken, the moved pods' old room freed
    (they may land on the same node, other GPUs) and each placed pod's new room taken. `placer` replaces
    the scan of `policy` over `nodes` (share-sim's memoised one); `held`: node -> GPU -> units held by
    holds the waiter and the moved pods must respect (taken in the plan too)."""
    if max_moves < 1:
        return None, "consolidation may move no pod (max_moves < 1)"
    if waiter.demand.count < 1:
        return None, "a CPU-only pod: no GPU to make room on"
    if placer is None:
        if policy is None:
            raise ValueError("plan_consolidation needs a policy or a placer")
        placer = policy_placer(policy, nodes)
    held = held or {}
    demand = waiter.demand
    base = Overlay(gpu={n: dict(g) for n, g in held.items()})
    candidates: list[_Candidate] = []
    for node in nodes:
        sf = shortfall(node, demand, held.get(node.name))
        if sf is not None and sf.short == 0 and _host_room(node, demand):
            return None, f"it fits node {node.name} already: nothing needs to move"
        # More GPUs short than pods that may move: no plan there (one pod on two GPUs could free both,
        # but moving a multi-GPU pod to make room is never the cheap plan this looks for).
        if sf is None or sf.short == 0 or sf.short > max_moves:
            continue
        here = [
            r if not r.movable or r.priority <= waiter.priority else replace(r, movable=False)
            for r in residents.get(node.name, ())
        ]
        c = _candidate(apply_overlay(node, base), here, demand, max_moves)
        if c is not None:
            candidates.append(c)
    if not candidates:
        return None, f"no node can make room by moving at most {max_moves} pod(s) that may move"
    candidates.sort(key=lambda c: c.key)
    for c in candidates[:max_tries]:
        overlay = Overlay(gpu={n: dict(g) for n, g in base.gpu.items()}, cpu=dict(base.cpu), memory=dict(base.memory))
        for r in c.movers:
            overlay.take(r.node, r.gpus, r.demand, sign=-1)
        overlay.take(c.node, c.gpus, demand)
        moves: list[Move] = []
        for r in sorted(c.movers, key=lambda r: (-r.demand.per_gpu * max(1, r.demand.count), r.uid)):
            where = placer(r.demand, overlay)
            if where is None:
                break
            node_name, gpus = where
            if node_name == r.node and tuple(sorted(gpus)) == tuple(sorted(r.gpus)):
                break  # placed back where it is: the plan makes no room
            overlay.take(node_name, gpus, r.demand)
            moves.append(Move(r, node_name, tuple(sorted(gpus))))
        else:
            return ConsolidationPlan(waiter, c.node, c.gpus, tuple(moves)), ""
    tried = min(len(candidates), max_tries)
    return None, f"the policy would not place every moved pod again (tried {tried} node(s))"


def _host_room(node: NodeState, demand: Demand) -> bool:
    return (node.cpu_free is None or node.cpu_free >= demand.cpu) and (
        node.memory_free is None or node.memory_free >= demand.memory
    )
