"""filter and prioritize: pure functions from kube-scheduler's request and the cache's node view to
the `k8s.io/kube-scheduler/extender/v1` result (JSON keys are the Go field names, as upstream has no
json tags on these types).

kube-scheduler semantics this follows:
- any HTTP status but 200 fails the call; so does a 200 whose `Error` is set (filter, bind);
- filter: with `nodeCacheCapable: true` the request carries `NodeNames` and the answer must carry
  `NodeNames`; otherwise `Nodes` (a NodeList) in and out. Nodes in `FailedAndUnresolvableNodes` are
  skipped by preemption (evicting pods would not help), those in `FailedNodes` are not;
- prioritize: `[{Host, Score}]`, Score in 0..MaxExtenderPriority (10); kube-scheduler multiplies it by
  the extender's weight and by MaxNodeScore/MaxExtenderPriority; its errors are only logged.
"""

from __future__ import annotations

import heapq
import math
import threading
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import orjson

from share_core.contract import RESOURCE_MEM, MemoryUnit
from share_core.request import InvalidRequest, PodRequest, pod_request
from share_scheduler.cache import ClusterCache, NodeSnapshot, demand_of
from share_scheduler.placement import Demand, Policy, WorkloadTable, fits
from share_scheduler.placement import learns as policy_learns

MAX_EXTENDER_PRIORITY = 10
NEG_INF = float("-inf")
# What filter answers with (`--filter-keeps`): "best", only the nodes the policy scores highest
# (kube-scheduler then needs no prioritize call); "fitting", every node the pod fits on, ranked by a
# prioritize call (the extender's scores added to kube-scheduler's own).
FILTER_KEEPS = ("best", "fitting")
SNAPSHOT_MEMO_LIMIT = 64  # answers kept per node snapshot (distinct demands seen while the node is unchanged)


class BadRequest(ValueError):
    """The request is not what kube-scheduler sends (malformed JSON, missing or mistyped fields)."""


def _field(body: Mapping[str, Any], name: str) -> Any:
    """Go's encoding/json matches keys case-insensitively; accept `Pod` and `pod` alike."""
    if name in body:
        return body[name]
    lowered = name.lower()
    for k, v in body.items():
        if isinstance(k, str) and k.lower() == lowered:
            return v
    return None


# Node names are DNS subdomains (RFC 1123): lower-case letters, digits, '.', '-'. A NodeNames list
# of such names alone needs no JSON escapes, so its bytes can be checked and searched as they are.
_NAME_BYTES = b"abcdefghijklmnopqrstuvwxyz0123456789.-"
_NAMES_KEY = b',"NodeNames":['


class NodeNameList(Sequence[str]):
    """kube-scheduler's NodeNames kept as the JSON it sent; the strings are decoded when first needed.

    At 5,000 nodes, decoding and type-checking the names was ~0.25 ms of filter's ~0.35 (in process;
    ~3x that on a busy machine), on kube-scheduler's serial cycle, while filter nearly always asks
    only whether one node, its index's best, is among them: a byte search."""

    __slots__ = ("_count", "_decoded", "_raw")

    def __init__(self, raw: bytes, count: int) -> None:
        self._raw = raw  # `["name","name",...]`, checked to hold node-name bytes only (_fast_args)
        self._count = count
        self._decoded: list[str] | None = None

    def _names(self) -> list[str]:
        if self._decoded is None:
            self._decoded = orjson.loads(self._raw)
        return self._decoded

    def __len__(self) -> int:
        return self._count

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        key = name.encode()
        if not key or key.translate(None, _NAME_BYTES):
            return name in self._names()  # not a name the byte search can answer for
        return b'"' + key + b'"' in self._raw

    def __getitem__(self, i: Any) -> Any:
        return self._names()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: Sequence[str] | None  # nodeCacheCapable
    nodes: Mapping[str, Any] | None  # the NodeList as sent, otherwise
    node_items: list[Mapping[str, Any]]

    @property
    def names(self) -> Sequence[str]:
        if self.node_names is not None:
            return self.node_names
        return [str((n.get("metadata") or {}).get("name") or "") for n in self.node_items]


def parse_extender_request(raw: bytes) -> ExtenderArgs:
    """An ExtenderArgs body; raises BadRequest naming the problem.

    kube-scheduler's layout (Go's encoding/json: Pod, Nodes, then NodeNames last) with names that
    need no JSON escapes takes a short path: only the pod is decoded, the names stay bytes
    (NodeNameList). Anything else is decoded in full and checked as before."""
    if not raw:
        raise BadRequest("request body is empty")
    fast = _fast_args(raw)
    if fast is not None:
        return fast
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from exc
    return parse_extender_args(body)


def _fast_args(raw: bytes) -> ExtenderArgs | None:
    """kube-scheduler's layout, or None (then the body is decoded in full). Inside a JSON string every
    quote is escaped, so the last `,"NodeNames":[` is the key itself; the section after it must be
    `[` quoted names `]` with nothing but node-name bytes, quotes and commas, in that pattern."""
    at = raw.rfind(_NAMES_KEY)
    if at < 0 or not raw.endswith(b"]}"):
        return None
    section = raw[at + len(_NAMES_KEY) - 1 : -1]
    inner = section[1:-1]
    count = inner.count(b",") + 1 if inner else 0
    if inner and inner.translate(None, _NAME_BYTES) != b'"",' * (count - 1) + b'""':
        return None
    try:
        head = orjson.loads(raw[:at] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(head, dict) or not set(head) <= {"Pod", "Nodes"} or head.get("Nodes") is not None:
        return None
    return ExtenderArgs(_checked_pod(head), NodeNameList(section, count), None, [])


def _checked_pod(body: Mapping[str, Any]) -> Mapping[str, Any]:
    pod = _field(body, "Pod")
    if not isinstance(pod, Mapping):
        raise BadRequest("ExtenderArgs.Pod is missing or not an object")
    meta = pod.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise BadRequest("ExtenderArgs.Pod.metadata is not an object")
    if meta is not None and not isinstance(meta.get("annotations") or {}, Mapping):
        raise BadRequest("ExtenderArgs.Pod.metadata.annotations is not an object")
    return pod


def parse_extender_args(body: Any) -> ExtenderArgs:
    """Validate an ExtenderArgs body; raises BadRequest naming the problem."""
    if not isinstance(body, Mapping):
        raise BadRequest("request body must be a JSON object (ExtenderArgs)")
    pod = _checked_pod(body)
    names = _field(body, "NodeNames")
    nodes = _field(body, "Nodes")
    if names is not None:
        # set(map(type, ...)) runs in C: at 5,000 names a generator of isinstance calls cost more than filter
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("ExtenderArgs.NodeNames must be a list of node names")
        return ExtenderArgs(pod, list(names), None, [])
    if nodes is not None:
        if not isinstance(nodes, Mapping):
            raise BadRequest("ExtenderArgs.Nodes must be a NodeList object")
        items = nodes.get("items") or []
        if not isinstance(items, list) or not all(
            isinstance(n, Mapping) and isinstance(n.get("metadata") or {}, Mapping) for n in items
        ):
            raise BadRequest("ExtenderArgs.Nodes.items must be a list of Node objects")
        for n in items:
            if not isinstance((n.get("metadata") or {}).get("name"), str):
                raise BadRequest("ExtenderArgs.Nodes.items holds a node without metadata.name")
        return ExtenderArgs(pod, None, nodes, list(items))
    raise BadRequest("ExtenderArgs has neither NodeNames nor Nodes")


def pod_demand(pod: Mapping[str, Any]) -> tuple[PodRequest, Demand] | None:
    """The pod's request and placement demand; None if it does not ask for GPU memory.

    Raises InvalidRequest (the message names the problem)."""
    request = pod_request(pod)
    if request is None:
        return None
    return request, demand_of(request)


def _fmt_free(entry: NodeSnapshot, unit: MemoryUnit) -> str:
    parts = []
    for g, used in zip(entry.gpus, entry.used, strict=True):
        note = "" if g.healthy else " (unhealthy)"
        parts.append(f"{g.index}:{max(g.memory - used, 0)} {unit.value}{note}")
    return ", ".join(parts)


def _need(demand: Demand, unit: MemoryUnit) -> str:
    where = "on one GPU" if demand.count == 1 else f"on each of {demand.count} GPUs"
    text = f"pod needs {demand.per_gpu} {unit.value} {where}"
    if demand.models:
        text += f" of model {'|'.join(demand.models)}"
    return text


def _remember(snap: NodeSnapshot, key: Any, value: Any) -> Any:
    memo = snap.memo
    if len(memo) >= SNAPSHOT_MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


def node_fits(entry: NodeSnapshot, demand: Demand) -> bool:
    """Fast path over the snapshot's free vector; the placement module's `fits` is the reference."""
    if not demand.models:
        free = entry.free_desc
        return len(free) >= demand.count and free[demand.count - 1] >= demand.per_gpu
    key = ("fits", demand)
    ok = entry.memo.get(key)
    if ok is None:
        ok = _remember(entry, key, fits(entry.state, demand))
    return ok


def unfit_reason(entry: NodeSnapshot, demand: Demand, unit: MemoryUnit) -> tuple[str, bool]:
    """Why the demand does not fit, for a person; and whether it never could (preemption won't help).

    Memoised on the snapshot: a full cluster fails most nodes for every pod, and their reasons only
    change when the node does."""
    key = ("unfit", demand, unit)
    found = entry.memo.get(key)
    if found is None:
        found = _remember(entry, key, _unfit_reason(entry, demand, unit))
    return found


def _unfit_reason(entry: NodeSnapshot, demand: Demand, unit: MemoryUnit) -> tuple[str, bool]:
    if entry.problem:
        return f"node's {RESOURCE_MEM} inventory is unreadable: {entry.problem}", True
    if not entry.gpus:
        return f"node offers no {RESOURCE_MEM} (no gpushare GPUs)", True
    candidates = [g for g in entry.gpus if g.healthy and demand.model_allowed(g.model)]
    could_ever = sum(1 for g in candidates if g.memory >= demand.per_gpu) >= demand.count
    reason = f"GPUs free: {_fmt_free(entry, unit)}; {_need(demand, unit)}"
    if not candidates and demand.models:
        models = ", ".join(sorted({g.model or "unknown" for g in entry.gpus}))
        reason += f"; no healthy GPU of an allowed model here (node has: {models})"
    elif not could_ever:
        reason += "; no GPU here is that large even when empty"
    return reason, not could_ever


UNKNOWN_NODE = "node is not known to the gpushare extender yet (no such node, or its watch lags)"


def filter_nodes(
    demand: Demand,
    entries: Sequence[tuple[str, NodeSnapshot | None]],
    unit: MemoryUnit,
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Pure: (passing names, FailedNodes, FailedAndUnresolvableNodes).

    kube-scheduler reads the failed maps only to explain a pod no node can take and to tell which
    nodes preemption may help (findNodesThatPassExtenders fills the cycle's diagnosis with them), so
    they are only worked out when no node passes: a pod that has a node gets the short answer."""
    passed: list[str] = []
    unfit: list[tuple[str, NodeSnapshot | None]] = []
    for name, entry in entries:
        if entry is not None and node_fits(entry, demand):
            passed.append(name)
        else:
            unfit.append((name, entry))
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if passed:
        return passed, failed, unresolvable
    for name, entry in unfit:
        if entry is None:
            failed[name] = UNKNOWN_NODE
            continue
        reason, never = unfit_reason(entry, demand, unit)
        (unresolvable if never else failed)[name] = reason
    return passed, failed, unresolvable


def filter_result(
    args: ExtenderArgs, passed: list[str] | None, failed: dict[str, str], unresolvable: dict[str, str], error: str = ""
) -> dict[str, Any]:
    """The ExtenderFilterResult in the form the request came in (NodeNames or Nodes)."""
    keep = args.names if passed is None else passed
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }
    if error:
        return result
    if args.node_names is not None:
        result["NodeNames"] = list(keep)
    else:
        wanted = set(keep)
        node_list = dict(args.nodes or {})
        node_list["items"] = [n for n in args.node_items if (n.get("metadata") or {}).get("name") in wanted]
        result["Nodes"] = node_list
    return result


def normalise_scores(raw: Mapping[str, float]) -> dict[str, int]:
    """Dense rank onto 1..10: the policy's best node(s) get 10, the next distinct score 9, ...

    Linear scaling would squash a 1 GiB best-fit difference on a wide range into one bucket and let
    kube-scheduler pick at random among ties; ranks keep the policy's first choice on top.
    Nodes the demand does not fit (score -inf) get 0.
    """
    finite = sorted({s for s in raw.values() if math.isfinite(s) or s == math.inf}, reverse=True)
    rank = {s: max(MAX_EXTENDER_PRIORITY - i, 1) for i, s in enumerate(finite)}
    return {name: rank.get(s, 0) for name, s in raw.items()}


class ScoreMemo:
    """Policy scores memoised per (demand, node view): shared across requests and across nodes.

    Keyed on the snapshot's `view_id`, never on the node name: a node that changes gets a new
    snapshot whose view id names its new view, so a memoised score can never answer for a state it
    was not computed from, and the many nodes in equal states (empty, full) share one entry.

    Only policies flagged `cacheable` are memoised (random is not). `cacheable` promises purity for a
    fixed learned workload, so for a policy that learns from observe():
    - if it exposes its learned workload as an immutable `WorkloadTable` snapshot (`policy.table`, as
      frag does), the memo is valid exactly as long as that snapshot is the same object;
    - otherwise every observe() starts afresh (`invalidate()`).
    Starting afresh swaps in new dicts rather than clearing the old ones, so a request that computed a
    score under the old workload can only store it where nobody looks any more.
    """

    LIMIT = 200_000  # memoised (demand, view) scores before starting afresh

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.enabled = bool(getattr(policy, "cacheable", False))
        learns = policy_learns(policy)
        # Policies whose learned workload is a WorkloadTable snapshot: memo valid while it is unchanged.
        self._by_table = learns and isinstance(getattr(policy, "table", None), WorkloadTable)
        self.learns = learns and not self._by_table  # invalidated by every observe()
        self._token: object = None
        self._tables: dict[Demand, dict[int, float]] = {}
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def table(self, demand: Demand) -> dict[int, float] | None:
        """view id -> score for this demand (None when the policy may not be memoised)."""
        if not self.enabled:
            return None
        if self._by_table:
            token = self.policy.table  # type: ignore[attr-defined]
            if token is not self._token:
                with self._lock:
                    self._tables = {}
                    self._size = 0
                    self._token = token
        table = self._tables.get(demand)
        if table is None:
            with self._lock:
                table = self._tables.setdefault(demand, {})
        return table

    def added(self, n: int) -> None:
        """`n` scores were stored; start afresh once the memo is over its bound."""
        self.misses += n
        self._size += n
        if self._size >= self.LIMIT:
            self.clear()

    def invalidate(self) -> None:
        """The policy's learned workload may have changed."""
        if self.learns:
            self.clear()

    def clear(self) -> None:
        with self._lock:
            self._tables = {}
            self._size = 0

    def __len__(self) -> int:
        return sum(len(t) for t in self._tables.values())


def _score(
    policy: Policy, demand: Demand, entry: NodeSnapshot, lock: AbstractContextManager[Any] | threading.Lock
) -> float:
    if not node_fits(entry, demand):
        return NEG_INF
    evaluate = getattr(policy, "evaluate", None)
    with lock:
        if evaluate is None:  # a policy with only the older score(NodeState, Demand)
            return policy.score(entry.state, demand)
        ev = evaluate(entry.view, demand)
    return NEG_INF if ev is None else ev[0]


def policy_scores(
    policy: Policy,
    demand: Demand,
    entries: Sequence[tuple[str, NodeSnapshot | None]],
    memo: ScoreMemo | None = None,
    lock: threading.Lock | None = None,
) -> dict[str, float]:
    """The policy's raw score per node (-inf: does not fit), in request order.

    `lock` (the binder's policy lock) is held only around the policy's own evaluations, not for the
    whole request: with a memo most nodes are a dict lookup."""
    guard: AbstractContextManager[Any] | threading.Lock = lock if lock is not None else nullcontext()
    table = memo.table(demand) if memo is not None else None
    raw: dict[str, float] = {}
    if table is None:
        for name, entry in entries:
            raw[name] = NEG_INF if entry is None else _score(policy, demand, entry, guard)
        return raw
    assert memo is not None
    get = table.get
    stored = 0
    for name, entry in entries:
        if entry is None:
            raw[name] = NEG_INF
            continue
        score = get(entry.view_id)
        if score is None:
            score = table[entry.view_id] = _score(policy, demand, entry, guard)
            stored += 1
        raw[name] = score
    memo.hits += len(raw) - stored
    if stored:
        memo.added(stored)
    return raw


def prioritize(
    policy: Policy,
    demand: Demand,
    entries: Sequence[tuple[str, NodeSnapshot | None]],
    memo: ScoreMemo | None = None,
    lock: threading.Lock | None = None,
) -> list[dict[str, Any]]:
    """HostPriorityList for the candidate nodes, in request order."""
    scores = normalise_scores(policy_scores(policy, demand, entries, memo, lock))
    return [{"Host": name, "Score": scores[name]} for name, _ in entries]


def best_nodes(scores: Mapping[str, float], random_ties: bool = False) -> list[str]:
    """The one node the policy chooses: its highest score, ties to the lowest node name; [] if the pod
    fits nowhere (-inf: does not fit; the memoised score decides fit and rank in one lookup per node).

    One node, not the policy's ties: kube-scheduler skips scoring when one node is left
    (schedulePod, "When only one node after predicate, just use it") and otherwise picks at random
    among equal scores (selectHost), so the placement would not be reproducible. The lowest name is
    the rule share-sim follows (first node in input order, and openb's nodes are listed by name), so
    the cluster and the simulator make the same choice (tests/integration/test_live_vs_sim.py).
    `random_ties` (a policy whose ties are meant to be broken at random, as bestfit's are in the paper
    and in share-sim): every tied node, in request order, for kube-scheduler to pick from."""
    top = max(scores.values(), default=NEG_INF)
    if top == NEG_INF:
        return []
    if random_ties:
        return [name for name, score in scores.items() if score == top]
    return [min(name for name, score in scores.items() if score == top)]


class _StateGroups:
    """The cluster's nodes grouped by state (view id), each group's names sorted; one per index.

    Scores are a function of the state, and most nodes share a few states (empty, full), so every
    demand's ranking orders groups, not nodes: a learned workload that moves (frag's table, every
    few pods while it is young) then rescores and re-heaps the distinct states, not the cluster.
    Kept current from the cache's change log (ClusterCache.node_changes); `log` records the groups
    whose membership changed, for the rankings to catch up from."""

    LOG_LIMIT = 100_000

    def __init__(self) -> None:
        self.members: dict[int, list[str]] = {}  # view id -> node names in that state, sorted
        self.sample: dict[int, NodeSnapshot] = {}  # view id -> one snapshot in that state (to score it)
        self.state_of: dict[str, int] = {}  # node -> its view id
        self.cursor: int | None = None  # position in the cache's change log
        self.epoch = 0  # bumped when the groups are rebuilt from a full read: rankings start afresh
        self.log: list[int] = []  # view ids whose members changed; log[0] is change number log_base
        self.log_base = 0

    def catch_up(self, cache: ClusterCache) -> None:
        cursor, changed, afresh = cache.node_changes(self.cursor)
        self.cursor = cursor
        if afresh:
            self.members, self.sample, self.state_of = {}, {}, {}
            self.epoch += 1
            self.log_base += len(self.log)
            self.log = []
            for name, snap in changed:
                if snap is not None:
                    self.state_of[name] = snap.view_id
                    self.sample[snap.view_id] = snap
            for name, view_id in sorted(self.state_of.items()):
                self.members.setdefault(view_id, []).append(name)
            return
        members, log = self.members, self.log
        for name, snap in changed:
            old = self.state_of.get(name)
            new = None if snap is None else snap.view_id
            if old == new:
                continue
            if old is not None:
                group = members[old]
                del group[bisect_left(group, name)]
                if not group:
                    del members[old]
                    del self.sample[old]
                log.append(old)
            if snap is None:
                del self.state_of[name]
                continue
            self.state_of[name] = new  # type: ignore[assignment]
            group = members.get(new)  # type: ignore[arg-type]
            if group is None:
                members[new] = [name]  # type: ignore[index]
                self.sample[new] = snap  # type: ignore[index]
            else:
                insort(group, name)
            log.append(new)  # type: ignore[arg-type]
        if len(log) > self.LOG_LIMIT:
            drop = len(log) // 2
            del log[:drop]
            self.log_base += drop

    @property
    def log_end(self) -> int:
        return self.log_base + len(self.log)


class _Ranking:
    """One demand's states, best first: a heap of (-score, the state's lowest node name, view id).

    An entry is current while its state still has nodes and that name is still the lowest among
    them; others are garbage, dropped when they reach the top. The first current entry is then
    best_nodes' choice: highest score, lowest name among the nodes with it."""

    __slots__ = ("cursor", "epoch", "heap", "table")

    def __init__(self, table: dict[int, float], epoch: int, cursor: int) -> None:
        self.heap: list[tuple[float, str, int]] = []
        self.table = table  # the memo's table the scores came from (a learning policy swaps it)
        self.epoch = epoch
        self.cursor = cursor  # position in the groups' log


class BestNodeIndex:
    """filter's answer for `--filter-keeps best` without scoring every candidate node per request.

    Scoring every node a request names is linear in the cluster (1 ms at 1,000 nodes, 5 at 5,000, in
    Python), on kube-scheduler's serial cycle. Between two pods only the nodes a hold, a bind or the
    watch touched change, so this keeps the nodes grouped by state (_StateGroups) and, per demand,
    the states in a heap ordered as best_nodes decides (_Ranking), catching up per request on the
    states the cache logged as changed (ClusterCache.node_changes). The answer is
    best_nodes(policy_scores(...)) exactly; it falls back to that when the request names a small part
    of the cluster (a walk past many nodes kube-scheduler filtered out would cost more). Only for
    memoisable policies (the scores are the ScoreMemo's) whose ties are not kube-scheduler's to break."""

    DEMANDS = 64  # rankings kept (distinct request shapes seen lately)
    SMALL_REQUEST = 8  # a request naming under 1/8 of the nodes is scored directly

    def __init__(self, policy: Policy, cache: ClusterCache, memo: ScoreMemo, lock: threading.Lock) -> None:
        self.policy = policy
        self.cache = cache
        self.memo = memo
        self.policy_lock = lock
        self._groups = _StateGroups()
        self._rankings: OrderedDict[Demand, _Ranking] = OrderedDict()
        self._lock = threading.Lock()
        self.rebuilds = 0

    @staticmethod
    def usable(policy: Policy) -> bool:
        return bool(getattr(policy, "cacheable", False)) and not getattr(policy, "random_ties", False)

    def best(self, demand: Demand, names: Sequence[str]) -> list[str]:
        """[the node best_nodes would choose among `names`], or [] if the pod fits none of them."""
        if len(names) * self.SMALL_REQUEST < self.cache.node_count():
            return self._direct(demand, names)
        with self._lock:
            table = self.memo.table(demand)
            if table is None:
                return self._direct(demand, names)
            self._groups.catch_up(self.cache)
            ranking = self._ranking(demand, table)
            found = self._first_in(ranking, names)
        if found is _WALKED_TOO_FAR:
            return self._direct(demand, names)
        return [] if found is None else [found]  # type: ignore[list-item]

    def _direct(self, demand: Demand, names: Sequence[str]) -> list[str]:
        entries = self.cache.entries(names)
        return best_nodes(policy_scores(self.policy, demand, entries, self.memo, self.policy_lock))

    def _ranking(self, demand: Demand, table: dict[int, float]) -> _Ranking:
        groups = self._groups
        ranking = self._rankings.get(demand)
        if (
            ranking is None
            or ranking.table is not table  # the learned workload changed: every score may have
            or ranking.epoch != groups.epoch
            or ranking.cursor < groups.log_base
            or groups.log_end - ranking.cursor > len(groups.members)
        ):
            ranking = _Ranking(table, groups.epoch, groups.log_end)
            ranking.heap = self._entries(demand, table, groups.members)
            heapq.heapify(ranking.heap)
            self.rebuilds += 1
        else:
            changed = dict.fromkeys(groups.log[ranking.cursor - groups.log_base :])
            ranking.cursor = groups.log_end
            for entry in self._entries(demand, table, changed):
                heapq.heappush(ranking.heap, entry)
            if len(ranking.heap) > 2 * len(groups.members) + 1024:
                live = {e for e in ranking.heap if self._current(e)}
                ranking.heap = list(live)
                heapq.heapify(ranking.heap)
        self._rankings[demand] = ranking
        self._rankings.move_to_end(demand)
        while len(self._rankings) > self.DEMANDS:
            self._rankings.popitem(last=False)
        return ranking

    def _entries(
        self, demand: Demand, table: dict[int, float], view_ids: Iterable[int]
    ) -> list[tuple[float, str, int]]:
        """Heap entries for these states (those still with nodes), scoring the ones not memoised yet."""
        members, sample, guard = self._groups.members, self._groups.sample, self.policy_lock
        out = []
        stored = 0
        for view_id in view_ids:
            group = members.get(view_id)
            if not group:
                continue
            score = table.get(view_id)
            if score is None:
                score = table[view_id] = _score(self.policy, demand, sample[view_id], guard)
                stored += 1
            if score != NEG_INF:  # fits nowhere: no entry
                out.append((-score, group[0], view_id))
        if stored:
            self.memo.added(stored)
        return out

    def _current(self, entry: tuple[float, str, int]) -> bool:
        group = self._groups.members.get(entry[2])
        return group is not None and group[0] == entry[1]

    def _first_in(self, ranking: _Ranking, names: Sequence[str]) -> object:
        """best_nodes' choice among `names`; None if none fits; _WALKED_TOO_FAR past len(names) steps."""
        heap = ranking.heap
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)  # garbage at the top
        if not heap:
            return None
        if heap[0][1] in names:  # nearly always: kube-scheduler passes every node that fits
            return heap[0][1]  # (a scan in C; hashing every name into a set costs more at 5,000)
        # Walk the states in heap order without taking entries out, one score at a time: the answer
        # is the lowest wanted name among the states with the best score that has any.
        members, wanted, limit = self._groups.members, set(names), len(names)
        frontier = [(heap[0], 0)]
        seen: set[int] = set()
        steps = 0
        level: float | None = None
        found: str | None = None
        while frontier:
            (neg, lowest, view_id), i = frontier[0]
            if level is not None and neg != level:
                if found is not None:
                    return found
                level = None
            heapq.heappop(frontier)
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
            group = members.get(view_id)
            if group is None or group[0] != lowest or view_id in seen:
                continue  # garbage, or a second entry of a state already walked
            seen.add(view_id)
            level = neg
            for name in group:
                steps += 1
                if steps > limit:
                    return _WALKED_TOO_FAR
                if found is not None and name >= found:
                    break
                if name in wanted:
                    found = name
                    break
        return found


_WALKED_TOO_FAR = object()


def invalid_request_message(pod: Mapping[str, Any], exc: InvalidRequest) -> str:
    meta = pod.get("metadata") or {}
    return f"pod {meta.get('namespace', 'default')}/{meta.get('name', '?')}: {exc}"
