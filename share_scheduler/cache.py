"""The extender's view of the cluster: each node's GPUs and what is promised on each of them, and each
node's allocatable CPU, memory and pod slots and what every pod bound there requests of them.

Functional core, imperative shell: `pod_record` and `Contribution` turn API objects into plain facts,
and `ClusterCache` keeps per-node *used* vectors that are updated incrementally as facts change, so
filter never walks pods (5,000 nodes x 8 GPUs with 40,000 pods must stay in milliseconds).

Two sources of truth are merged:
- the API server (list + watch): a pod counts on a GPU when it is bound to a node, carries our
  assignment annotations and has not finished; every bound pod that has not finished counts its CPU,
  memory and one pod slot on its node, whoever scheduled it (share_core.podresources: as
  kube-scheduler's NodeInfo counts it);
- our own binds, which count *before* the API server shows them ("assumed" pods, in a TTLCache): from
  the moment bind chooses a GPU until the watch shows the pod bound, is rolled back, or the TTL expires
  (a Binding that never appeared); and filter's holds, which count a lone node's GPUs for a pod from
  its filter to its bind (`hold`, lapsing after HOLD_TTL unless bind turns them into an assumption);
- in DRA mode, our ResourceSlices (a node's GPUs) and the allocated ResourceClaims (each device result a
  contribution, share_scheduler.drastate), with filter's holds on the device a claim will get.

One piece: the invariant "each node's used vectors equal the sum of what is counted on it" is kept by
every writer (watches of four kinds, bind, filter's holds, expiry) under one lock; the pure parts
(nodes.py, drastate.py) live apart, the writers that must share the lock stay here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from cachetools import TTLCache

from share_core.assignment import pod_is_finished
from share_core.assignment import pod_key
from share_core.contract import MemoryUnit
from share_core.dra import ClaimAsk
from share_core.dra import claim_name
from share_core.gpus import GpuInfo
from share_core.gpus import node_gpus
from share_core.podresources import node_allocatable
from share_core.request import InvalidRequest
from share_placement import Demand
from share_placement import NodeState
from share_placement import NodeView
from share_placement.room import Host
from share_scheduler.drastate import CLAIM_PART
from share_scheduler.drastate import DraIndex
from share_scheduler.holds import HoldBook
from share_scheduler.nodes import NO_ALLOCATABLE
from share_scheduler.nodes import Assumed
from share_scheduler.nodes import Contribution
from share_scheduler.nodes import NodeEntry
from share_scheduler.nodes import NodeSnapshot
from share_scheduler.nodes import PodFacts
from share_scheduler.nodes import PodRecord
from share_scheduler.nodes import demand_of
from share_scheduler.nodes import pod_holds_facts
from share_scheduler.nodes import pod_record
from share_scheduler.waiting import Parsed
from share_scheduler.waiting import WaitingPods
from share_scheduler.waiting import parse_requests
from share_scheduler.waiting import waiting_pod

log = logging.getLogger(__name__)

DEFAULT_ASSUME_TTL = 300.0  # seconds an assumed pod counts without the API server confirming its Binding
HOLD_TTL = 30.0  # seconds filter's hold on a node's GPUs waits for the pod's bind (or its claims' allocation)
CLAIM_HOLD = "hold:"  # key prefix of filter's hold on the GPUs a pod's claims will be allocated
CHANGE_LOG_LIMIT = 200_000  # node changes kept for node_changes() readers; one that falls behind re-reads all
VIEW_INTERN_LIMIT = 50_000  # distinct node views remembered for sharing view ids (at least 4 per node)


class ClusterCache:
    """Thread-safe cluster view. Writers: the watch threads and the binder; readers: HTTP handlers."""

    def __init__(
        self,
        unit: MemoryUnit = MemoryUnit.GiB,
        assume_ttl: float = DEFAULT_ASSUME_TTL,
        timer: Callable[[], float] = time.monotonic,
        on_new_pod: Callable[[Demand], None] | None = None,
        dra: bool = False,
    ) -> None:
        self.unit = unit
        self.dra = dra
        self._lock = threading.RLock()
        self._timer = timer
        self._nodes: dict[str, NodeEntry] = {}
        self._pods: dict[str, PodRecord] = {}
        self._assumed: TTLCache[str, Assumed] = TTLCache(maxsize=1_000_000, ttl=assume_ttl, timer=timer)
        self.hold_ttl = min(HOLD_TTL, assume_ttl)
        self._hold_deadlines: OrderedDict[str, float] = OrderedDict()  # key -> deadline, oldest first
        self._counted: dict[str, Contribution] = {}  # what each pod currently adds to the used vectors
        self._by_node: dict[str, set[str]] = {}  # node -> keys in _counted on it (recount without a scan)
        self._seen_requests: set[str] = set()  # pods already reported to on_new_pod (uid or key)
        self._on_new_pod = on_new_pod
        self._synced = {"nodes": False, "pods": False}
        if dra:
            self._synced.update(resourceslices=False, resourceclaims=False)
        self._dra = DraIndex(unit)
        self._claim_holds: dict[str, set[str]] = {}  # claim key -> hold keys waiting for its allocation
        # Views seen -> their ids, so nodes in equal states share one id. Bounded: when it is full it
        # starts afresh; ids are never reused, so older snapshots keep ids that still name their view.
        self._views: dict[NodeView, int] = {}
        # Names of nodes whose snapshot changed, in order (node_changes): lets a reader keep per-node
        # derived data current by visiting only what moved. `_changes[0]` is change number `_changes_base`.
        self._changes: list[str] = []
        self._changes_base = 0
        # How many GPUs of each memory size (units) the nodes have: the largest is what a GPU holds at most.
        self._gpu_sizes: Counter[int] = Counter()
        self._largest_gpu = 0
        self._on_largest_gpu: Callable[[int], None] | None = None
        self._node_specs = 0  # bumped whenever a node's GPUs or allocatable change (`hosts`)
        self._hosts: tuple[int, tuple[Host, ...]] = (-1, ())
        # GPU memory held for pods not bound yet (preemption, reservations), fed by the pod watch.
        self.holds = HoldBook()
        # Unbound pods asking GPU memory, with their age (the reservations loop, waits by class).
        self.waiting = WaitingPods()

    def set_observer(self, on_new_pod: Callable[[Demand], None] | None) -> None:
        """Called once per pod with its demand, GPU or not (under the cache lock: keep it quick); a pod
        whose GPU request is invalid is not reported."""
        with self._lock:
            self._on_new_pod = on_new_pod

    def set_largest_gpu_observer(self, on_change: Callable[[int], None] | None) -> None:
        """Called with the largest GPU's memory (units; 0 with no GPU) now and whenever it changes, under the
        cache lock: keep it quick. frag's gap price packs shares into GPUs of that size."""
        with self._lock:
            self._on_largest_gpu = on_change
            if on_change is not None:
                on_change(self._largest_gpu)

    @property
    def largest_gpu(self) -> int:
        with self._lock:
            return self._largest_gpu

    def _count_gpus(self, gpus: Iterable[GpuInfo], sign: int) -> None:
        self._node_specs += 1  # called whenever a node is added, replaced or removed
        for g in gpus:
            self._gpu_sizes[g.memory] += sign
            if self._gpu_sizes[g.memory] <= 0:
                del self._gpu_sizes[g.memory]

    def hosts(self) -> tuple[Host, ...]:
        """The distinct kinds of node (GPUs per model, allocatable CPU and memory; None when a node reports
        none), as share_placement.room.hosted_shape weighs which nodes could ever host a pod: a few dozen
        however many nodes. The same object until a node's GPUs or allocatable change."""
        with self._lock:
            version, hosts = self._hosts
            if version == self._node_specs:
                return hosts
            kinds: set[Host] = set()
            for entry in self._nodes.values():
                alloc = entry.allocatable
                cpu = alloc.cpu if alloc != NO_ALLOCATABLE else None
                memory = alloc.memory if alloc != NO_ALLOCATABLE else None
                for model, count in Counter(g.model for g in entry.gpus).items():
                    kinds.add((model, count, cpu, memory))
            hosts = tuple(kinds)
            self._hosts = (self._node_specs, hosts)
            return hosts

    def _tell_largest_gpu(self) -> None:
        """After a whole change (a node replaced, a relist): what it was in between is nobody's business."""
        largest = max(self._gpu_sizes, default=0)
        if largest != self._largest_gpu:
            self._largest_gpu = largest
            if self._on_largest_gpu is not None:
                self._on_largest_gpu(largest)

    # -- sync state ------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        with self._lock:
            return all(self._synced.values())

    # -- internal: keep used vectors equal to the sum of contributions ---------------------------

    def _changed(self, name: str) -> None:
        self._changes.append(name)
        if len(self._changes) > CHANGE_LOG_LIMIT:
            drop = len(self._changes) // 2
            del self._changes[:drop]
            self._changes_base += drop

    def _apply(self, c: Contribution, sign: int) -> None:
        entry = self._nodes.get(c.node)
        if entry is None:
            return
        for index in c.indices:
            pos = entry.position.get(index)
            if pos is not None:
                entry.used[pos] += sign * c.per_gpu
        entry.cpu += sign * c.cpu
        entry.memory += sign * c.memory
        entry.pods += sign * c.pods
        entry.touch()
        self._changed(c.node)

    def _effective(self, key: str) -> Contribution | None:
        """Pure rule: a pod bound per the API counts as the API says; else our assumption counts. A DRA
        claim's part counts as its allocation says."""
        if key.startswith(CLAIM_PART):
            return self._dra.part(key)
        record = self._pods.get(key)
        if record is not None and record.node:
            return record.contribution
        assumed = self._assumed.get(key)
        return assumed.contribution if assumed is not None else None

    def _refresh(self, key: str) -> None:
        want = self._effective(key)
        have = self._counted.get(key)
        if want == have:
            return
        if have is not None:
            self._apply(have, -1)
            del self._counted[key]
            self._by_node[have.node].discard(key)
        if want is not None:
            self._apply(want, +1)
            self._counted[key] = want
            self._by_node.setdefault(want.node, set()).add(key)

    def _expire(self) -> None:
        expired = list(self._assumed.expire())
        for key, assumed in expired:
            log.warning(
                "assumed pod %s on node %s GPU %s expired: no Binding seen within %.0fs; its memory is free again",
                key,
                assumed.contribution.node,
                ",".join(map(str, assumed.contribution.indices)),
                self._assumed.ttl,
            )
            self._refresh(key)
        now = self._timer()
        deadlines = self._hold_deadlines
        while deadlines:
            key, deadline = next(iter(deadlines.items()))
            if deadline > now:
                break
            deadlines.popitem(last=False)
            assumed = self._assumed.get(key)
            if assumed is not None and assumed.held:
                del self._assumed[key]
                log.info(
                    "pod %s: filter's hold on node %s GPU %s lapsed: no bind within %.0fs (kube-scheduler chose "
                    "otherwise or the pod went away); its memory is free again",
                    key,
                    assumed.contribution.node,
                    ",".join(map(str, assumed.contribution.indices)),
                    self.hold_ttl,
                )
                self._refresh(key)

    def _recount_node(self, name: str) -> None:
        entry = self._nodes.get(name)
        if entry is None:
            return
        entry.used = [0] * len(entry.gpus)
        entry.cpu = entry.memory = entry.pods = 0
        for key in self._by_node.get(name, ()):
            c = self._counted[key]
            for index in c.indices:
                pos = entry.position.get(index)
                if pos is not None:
                    entry.used[pos] += c.per_gpu
            entry.cpu += c.cpu
            entry.memory += c.memory
            entry.pods += c.pods
        entry.touch()
        self._changed(name)

    # -- nodes -----------------------------------------------------------------------------------

    def _node_entry(self, node: Mapping[str, Any]) -> NodeEntry:
        name = str((node.get("metadata") or {}).get("name") or "")
        allocatable = node_allocatable(node)
        if allocatable.problem:
            log.warning("node %s: allocatable counted as 0 where unreadable: %s", name, allocatable.problem)
        try:
            return NodeEntry.build(name, node_gpus(node), allocatable=allocatable)
        except InvalidRequest as exc:
            log.warning("node %s: ignoring its GPUs: %s", name, exc)
            return NodeEntry.build(name, (), problem=str(exc), allocatable=allocatable)

    def _with_slices(self, entry: NodeEntry) -> NodeEntry:
        """A node without GPUs of its own (no device plugin annotation) takes those our slices publish."""
        if entry.problem or (entry.gpus and not entry.order):
            return entry
        gpus, order = self._dra.node_gpus(entry.name)
        out = NodeEntry.build(entry.name, gpus, allocatable=entry.allocatable)
        out.order = order
        return out

    def _set_node_locked(self, node: Mapping[str, Any]) -> None:
        entry = self._with_slices(self._node_entry(node))
        old = self._nodes.get(entry.name)
        if (
            old is not None
            and old.gpus == entry.gpus
            and old.order == entry.order
            and old.problem == entry.problem
            and old.allocatable == entry.allocatable
        ):
            return
        self._nodes[entry.name] = entry
        self._count_gpus(old.gpus if old is not None else (), -1)
        self._count_gpus(entry.gpus, +1)
        self._recount_node(entry.name)

    def upsert_node(self, node: Mapping[str, Any]) -> None:
        with self._lock:
            self._set_node_locked(node)
            self._tell_largest_gpu()

    def delete_node(self, name: str) -> None:
        with self._lock:
            old = self._nodes.pop(name, None)
            if old is not None:
                self._count_gpus(old.gpus, -1)
                self._tell_largest_gpu()
                self._changed(name)

    def replace_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """A full list: the nodes it lacks are gone."""
        with self._lock:
            names = set()
            for node in nodes:
                self._set_node_locked(node)
                names.add(str((node.get("metadata") or {}).get("name") or ""))
            for name in set(self._nodes) - names:
                self._count_gpus(self._nodes.pop(name).gpus, -1)
                self._changed(name)
            self._tell_largest_gpu()
            self._synced["nodes"] = True
            if self._synced["pods"]:
                self._warm()

    # -- DRA: our ResourceSlices and the claims allocated from them --------------------------------

    def _slices_changed(self, nodes: Iterable[str], claims: Iterable[str]) -> None:
        for name in nodes:
            old = self._nodes.get(name)
            if old is None:
                continue
            entry = self._with_slices(old)
            if entry is old or (entry.gpus == old.gpus and entry.order == old.order):
                continue
            self._nodes[name] = entry
            self._count_gpus(old.gpus, -1)
            self._count_gpus(entry.gpus, +1)
            self._recount_node(name)
        for claim in claims:
            for key in self._dra.resolve(claim):
                self._refresh(key)
        self._tell_largest_gpu()

    def upsert_slice(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._slices_changed(*self._dra.set_slice(str((obj.get("metadata") or {}).get("name", "")), obj))

    def delete_slice(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._slices_changed(*self._dra.set_slice(str((obj.get("metadata") or {}).get("name", "")), None))

    def replace_slices(self, objs: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            names = set()
            nodes: set[str] = set()
            claims: set[str] = set()
            for obj in objs:
                name = str((obj.get("metadata") or {}).get("name", ""))
                names.add(name)
                n, c = self._dra.set_slice(name, obj)
                nodes |= n
                claims |= c
            for name in set(self._dra.slices) - names:
                n, c = self._dra.set_slice(name, None)
                nodes |= n
                claims |= c
            self._slices_changed(nodes, claims)
            self._synced["resourceslices"] = True

    def _claim_changed(self, key: str, obj: Mapping[str, Any] | None) -> None:
        touched, _ = self._dra.set_claim(key, obj)
        for part in touched:
            self._refresh(part)
        if obj is None or self._dra.allocated(key):
            self._release_claim_holds(key)

    def upsert_claim(self, obj: Mapping[str, Any]) -> None:
        ns, name = claim_name(obj)
        with self._lock:
            self._expire()
            self._claim_changed(f"{ns}/{name}", obj)

    def delete_claim(self, obj: Mapping[str, Any]) -> None:
        ns, name = claim_name(obj)
        with self._lock:
            self._expire()
            self._claim_changed(f"{ns}/{name}", None)

    def replace_claims(self, objs: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            self._expire()
            touched, allocated = self._dra.replace_claims(objs)
            for part in touched:
                self._refresh(part)
            for key in [*allocated, *(k for k in self._claim_holds if k not in self._dra.claims)]:
                self._release_claim_holds(key)
            self._synced["resourceclaims"] = True

    def claim(self, namespace: str, name: str) -> tuple[bool, bool, ClaimAsk | None]:
        """(known, allocated, what it asks of our DeviceClass) of one ResourceClaim."""
        with self._lock:
            key = f"{namespace}/{name}"
            entry = self._dra.claims.get(key)
            if entry is None:
                return False, False, None
            return True, bool(entry.results), entry.ask

    def learn_claim(self, obj: Mapping[str, Any]) -> None:
        """A claim filter read from the API server (the watch had not brought it yet)."""
        ns, name = claim_name(obj)
        with self._lock:
            if f"{ns}/{name}" not in self._dra.claims:
                self._claim_changed(f"{ns}/{name}", obj)

    def hold_claims(self, pod: str, uid: str, contribution: Contribution, claims: Iterable[str]) -> None:
        """Count the GPU memory a pod's claims will take on the device(s) the allocator will pick, from
        filter until their allocation shows (it then counts as itself) or `hold_ttl` passes."""
        key = f"{CLAIM_HOLD}{pod}"
        with self._lock:
            for claim in claims:
                self._claim_holds.setdefault(claim, set()).add(key)
            self._hold_locked(key, uid, contribution)

    def _release_claim_holds(self, claim: str) -> None:
        for key in self._claim_holds.pop(claim, ()):
            if self._assumed.pop(key, None) is not None:
                self._hold_deadlines.pop(key, None)
                self._refresh(key)

    # -- pods ------------------------------------------------------------------------------------

    def facts(self, pod: Mapping[str, Any]) -> PodFacts:
        """Everything the cache keeps of a pod, parsed outside the lock; the dict can then go."""
        record = pod_record(pod)
        demand: Demand | None = None
        memo: list[Parsed] = []

        def parsed() -> Parsed:  # the containers parsed once, whoever asks first (a watch's hot path)
            if not memo:
                memo.append(parse_requests(pod))
            return memo[0]

        # A DRA pod's GPUs are in its claims: the extender teaches the policy its whole demand at filter
        # (`note_demand`), when the claims are read; counted here it would look like a CPU-only pod.
        claims = self.dra and bool((pod.get("spec") or {}).get("resourceClaims"))
        if not claims and self._on_new_pod is not None and (record.uid or record.key) not in self._seen_requests:
            both = parsed()
            if not isinstance(both, InvalidRequest):
                request, host_request = both
                c = record.contribution
                host = (c.cpu, c.memory) if c is not None else host_request[:2]
                demand = demand_of(request, *host)
        holds, hold_problem = pod_holds_facts(pod)
        waiting = waiting_pod(pod, parsed) if not record.node else None
        return PodFacts(record, pod_is_finished(pod), demand, holds, hold_problem, waiting)

    def _note_request(self, facts: PodFacts) -> None:
        """Tell a workload-aware policy about each pod once (at the initial sync and as pods arrive):
        every pod, as share-sim teaches its policy every pod of the trace, CPU-only ones included."""
        if self._on_new_pod is None or facts.demand is None:
            return
        ident = facts.record.uid or facts.record.key
        if ident in self._seen_requests:
            return
        self._seen_requests.add(ident)
        self._on_new_pod(facts.demand)

    def note_demand(self, uid: str, demand: Demand) -> None:
        """Tell a workload-aware policy about a pod whose demand filter worked out (a DRA pod), once."""
        if self._on_new_pod is None or not uid:
            return
        with self._lock:
            if uid not in self._seen_requests:
                self._seen_requests.add(uid)
                self._on_new_pod(demand)

    def _set_pod_locked(self, facts: PodFacts) -> None:
        record = facts.record
        old = self._pods.get(record.key)
        if old is not None and old.uid == record.uid and old.node and not record.node:
            # nodeName never goes from set to unset for one pod: this event predates the Binding.
            return
        self._note_request(facts)
        newly_bound = bool(record.node) and (
            (old.uid != record.uid or not old.node) if old is not None else not record.started
        )
        self.holds.pod_seen(
            record.key,
            record.uid,
            record.node,
            record.owner_uid,
            facts.finished,
            facts.holds,
            facts.hold_problem,
            newly_bound,
        )
        self.waiting.seen(record.key, record.uid, record.node, facts.waiting)
        self._pods[record.key] = record
        assumed = self._assumed.get(record.key)
        if assumed is not None and (record.node or (assumed.uid and record.uid and assumed.uid != record.uid)):
            # The API server now says where the pod is (or it is another pod by that name): trust it.
            del self._assumed[record.key]
        if record.node and record.contribution is None and facts.finished:
            self._assumed.pop(record.key, None)
        self._refresh(record.key)

    def _drop_pod_locked(self, key: str) -> None:
        record = self._pods.pop(key, None)
        self._assumed.pop(key, None)
        self.holds.pod_gone(key)
        self.waiting.gone(key)
        if record is not None:
            self._seen_requests.discard(record.uid or key)
        self._refresh(key)

    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        facts = self.facts(pod)
        with self._lock:
            self._expire()
            self._set_pod_locked(facts)

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        with self._lock:
            self._expire()
            self._drop_pod_locked(pod_key(pod))

    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full list: pods it lacks are gone (assumed pods stay: the list may predate their bind).

        `pods` may be a generator over pages as they arrive: each pod is parsed outside the lock (a
        relist of 40,000 pods then holds it ~3x shorter) and its dict dropped at once."""
        parsed = [self.facts(pod) for pod in pods]
        with self._lock:
            self._expire()
            keys = set()
            for facts in parsed:
                self._set_pod_locked(facts)
                keys.add(facts.record.key)
            self.holds.keep_only(keys)
            self.waiting.keep_only(keys)
            for key in set(self._pods) - keys:
                record = self._pods.pop(key)
                self._seen_requests.discard(record.uid or key)
                self._refresh(key)
            self._synced["pods"] = True
            self._warm()

    def _warm(self) -> None:
        """Build the snapshots a full list changed now, not in the first filter after it."""
        for entry in self._nodes.values():
            if entry._snap is None:
                self._snapshot(entry)

    # -- the binder's side -----------------------------------------------------------------------

    def assume(self, key: str, uid: str, contribution: Contribution) -> None:
        """Count a pod on its chosen GPUs now, before the API server shows it bound."""
        with self._lock:
            self._expire()
            self._assumed[key] = Assumed(uid, contribution, self._timer())
            record = self._pods.get(key)
            if record is not None and record.node:
                # A stale bound record for this name (a deleted pod we have not heard of): ours wins.
                self._pods[key] = PodRecord(record.key, uid, "", None)
            self._refresh(key)

    def hold(self, key: str, uid: str, contribution: Contribution) -> None:
        """Count a pod on GPUs filter expects its bind to take (it left kube-scheduler one node).

        The next pod's filter then sees them taken, as kube-scheduler's own cache already does; the
        hold lapses after `hold_ttl` unless bind turns it into an assumption (`assume`)."""
        with self._lock:
            self._hold_locked(key, uid, contribution)

    def _hold_locked(self, key: str, uid: str, contribution: Contribution) -> None:
        self._expire()
        now = self._timer()
        self._assumed[key] = Assumed(uid, contribution, now, held=True)
        self._hold_deadlines[key] = now + self.hold_ttl
        self._hold_deadlines.move_to_end(key)
        self._refresh(key)

    def assumption(self, key: str) -> Assumed | None:
        """What the cache counts for a pod not (yet) shown bound: a hold or an assumption."""
        with self._lock:
            self._expire()
            record = self._pods.get(key)
            if record is not None and record.node:
                return None
            return self._assumed.get(key)

    def forget(self, key: str) -> None:
        """Roll back an assumption (the bind failed)."""
        with self._lock:
            self._assumed.pop(key, None)
            self._refresh(key)

    # -- readers ---------------------------------------------------------------------------------

    def _snapshot(self, entry: NodeEntry) -> NodeSnapshot:
        if entry._snap is None and len(self._views) >= max(VIEW_INTERN_LIMIT, 4 * len(self._nodes)):
            self._views = {}
        return entry.snapshot(self._views)

    def node_state(self, name: str) -> NodeState | None:
        snap = self.node_snapshot(name)
        return snap.state if snap is not None else None

    def node_snapshot(self, name: str, held: Mapping[int, int] | None = None) -> NodeSnapshot | None:
        """The node now; with `held` (GPU index -> units held for others), as a pod that must respect
        those holds sees it."""
        with self._lock:
            self._expire()
            entry = self._nodes.get(name)
            if entry is None:
                return None
            return self._held_snapshot(entry, held) if held else self._snapshot(entry)

    def _held_snapshot(self, entry: NodeEntry, held: Mapping[int, int]) -> NodeSnapshot:
        """A snapshot of the node with `held` more taken; interned like any other (same view, same id),
        so scores memoised for that view answer for it too."""
        if len(self._views) >= max(VIEW_INTERN_LIMIT, 4 * len(self._nodes)):
            self._views = {}
        return entry.holding(held).snapshot(self._views)

    def entries(
        self, names: Iterable[str], held: Mapping[str, Mapping[int, int]] | None = None
    ) -> list[tuple[str, NodeSnapshot | None]]:
        """Immutable snapshots of the named nodes for filter/prioritize/bind (None: unknown node); with
        `held` (node -> GPU index -> units, HoldBook.against), the held nodes as the asking pod sees them.

        Only the lookups happen under the lock; a snapshot is rebuilt only for a node that changed
        since it was last read, so a request over 5,000 unchanged nodes allocates almost nothing."""
        with self._lock:
            self._expire()
            get = self._nodes.get
            snapshot = self._snapshot
            if held:
                return [
                    (
                        name,
                        None
                        if (e := get(name)) is None
                        else (self._held_snapshot(e, held[name]) if name in held else (e._snap or snapshot(e))),
                    )
                    for name in names
                ]
            return [(name, None if (e := get(name)) is None else (e._snap or snapshot(e))) for name in names]

    def node_changes(self, cursor: int | None) -> tuple[int, list[tuple[str, NodeSnapshot | None]], bool]:
        """The nodes whose snapshot changed since `cursor` (a cursor this returned before), each with
        its snapshot now (None: the node is gone), and the cursor for next time. When `cursor` is None
        or older than the log reaches, every node instead, and True: start afresh from these."""
        with self._lock:
            self._expire()
            end = self._changes_base + len(self._changes)
            get = self._nodes.get
            snapshot = self._snapshot
            if cursor is None or cursor < self._changes_base:
                return end, [(name, e._snap or snapshot(e)) for name, e in self._nodes.items()], True
            names = dict.fromkeys(self._changes[cursor - self._changes_base :])
            return (
                end,
                [(name, None if (e := get(name)) is None else (e._snap or snapshot(e))) for name in names],
                False,
            )

    def pods_on(self, node: str) -> list[PodRecord]:
        """The pods the API server shows bound to `node` and counted there (preemption's candidates)."""
        with self._lock:
            self._expire()
            pods = self._pods
            return [pods[k] for k in self._by_node.get(node, ()) if k in pods and pods[k].node == node]

    def record(self, key: str) -> PodRecord | None:
        """What the cache knows of a pod (namespace/name), bound or not."""
        with self._lock:
            return self._pods.get(key)

    def victim_running(self, node: str, uid: str) -> bool:
        """Whether the pod of `uid` is still bound to `node` and not terminating (preemption's check that
        its victims are going)."""
        return any(r.uid == uid and not r.terminating for r in self.pods_on(node))

    def node_count(self) -> int:
        return len(self._nodes)

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def usage(self) -> dict[str, dict[int, int]]:
        """node -> GPU index -> units promised (what the tests compare with the annotations)."""
        with self._lock:
            self._expire()
            return {name: {g.index: u for g, u in zip(e.gpus, e.used, strict=True)} for name, e in self._nodes.items()}

    def host_usage(self) -> dict[str, tuple[int, int, int]]:
        """node -> (CPU millicores, memory bytes, pods) requested there (what the fault tests compare with
        a fresh list counted by share_core.podresources)."""
        with self._lock:
            self._expire()
            return {name: (e.cpu, e.memory, e.pods) for name, e in self._nodes.items()}

    def snapshot(self, node: str | None = None) -> dict[str, Any]:
        """The /inspect view: per node, per GPU, who holds what; pods chosen but not yet bound."""
        with self._lock:
            self._expire()
            holders: dict[str, dict[int, list[dict[str, Any]]]] = {}
            for key, c in self._counted.items():
                record = self._pods.get(key)
                bound = record is not None and bool(record.node)
                for index in c.indices:
                    holders.setdefault(c.node, {}).setdefault(index, []).append(
                        {
                            "pod": key,
                            "memory": c.per_gpu,
                            "bound": bound,
                            "assigned": bool(record.assigned) if bound and record else False,
                        }
                    )
            names = [node] if node is not None else sorted(self._nodes)
            nodes = []
            for name in names:
                entry = self._nodes.get(name)
                if entry is None:
                    continue
                gpus = []
                for g, used in zip(entry.gpus, entry.used, strict=True):
                    pods = sorted(holders.get(name, {}).get(g.index, []), key=lambda p: p["pod"])
                    gpus.append(
                        {
                            "index": g.index,
                            "uuid": g.uuid,
                            "model": g.model,
                            "healthy": g.healthy,
                            "total": g.memory,
                            "allocated": used,
                            "free": max(g.memory - used, 0),
                            "pods": pods,
                        }
                    )
                item: dict[str, Any] = {
                    "name": name,
                    "total": sum(g.memory for g in entry.gpus),
                    "allocated": sum(entry.used),
                    "gpus": gpus,
                    "host": {
                        "allocatable": {
                            "cpu": f"{entry.allocatable.cpu}m",
                            "memory": str(entry.allocatable.memory),
                            "pods": entry.allocatable.pods,
                        },
                        "requested": {"cpu": f"{entry.cpu}m", "memory": str(entry.memory), "pods": entry.pods},
                    },
                }
                if entry.problem:
                    item["problem"] = entry.problem
                nodes.append(item)
            pending = sorted(
                (
                    {
                        "pod": key,
                        "node": a.contribution.node,
                        "gpus": list(a.contribution.indices),
                        "memory": a.contribution.per_gpu * len(a.contribution.indices),
                    }
                    for key, a in self._assumed.items()
                    if self._counted.get(key) == a.contribution
                    and a.contribution.indices
                    and not (self._pods.get(key) and self._pods[key].node)
                ),
                key=lambda p: p["pod"],
            )
            if node is not None:
                pending = [p for p in pending if p["node"] == node]
            problems = sorted(f"pod {r.key}: {r.problem}" for r in self._pods.values() if r.problem)
            return {"unit": self.unit.value, "nodes": nodes, "pending": pending, "problems": problems}
