"""filter's answer for `--filter-keeps best` at scale: the cluster's nodes grouped by state, and per
demand the states in a heap ordered as `extender.best_nodes` decides, kept current from the cache's
change log so a request costs what changed since the last one, not the cluster.
"""

from __future__ import annotations

import heapq
import threading
from bisect import bisect_left
from bisect import insort
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Sequence

from share_placement import Demand
from share_placement import Policy
from share_scheduler.cache import ClusterCache
from share_scheduler.extender import NEG_INF
from share_scheduler.extender import ScoreMemo
from share_scheduler.extender import best_nodes
from share_scheduler.extender import policy_scores
from share_scheduler.extender import score_states
from share_scheduler.nodes import NodeSnapshot


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
        members, sample = self._groups.members, self._groups.sample
        out = []
        missing = []
        for view_id in view_ids:
            group = members.get(view_id)
            if not group:
                continue
            score = table.get(view_id)
            if score is None:
                missing.append(view_id)
            elif score != NEG_INF:  # fits nowhere: no entry
                out.append((-score, group[0], view_id))
        if missing:
            priced = score_states(self.policy, demand, [sample[v] for v in missing], self.policy_lock)
            for view_id, score in zip(missing, priced, strict=True):
                table[view_id] = score
                if score != NEG_INF:
                    out.append((-score, members[view_id][0], view_id))
            self.memo.added(len(missing))
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
