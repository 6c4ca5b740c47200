"""Room for what waits (issue 40), in the extender: `--leave-room on`.

The placement policy is wrapped in share_placement.room.RoomForWaiting, the very wrapper share-sim's
timeline runs (`share-sim timeline --leave-room on`), and told the shapes the simulator's rule picks
(share_placement.waiting_shapes.WaitingShapes): those of the multi-GPU pods of our profile that wait, and
those that waited within the last `linger_s` seconds. A pod *waits* as it does in share-sim's queue: it
asked for room and found none, which kube-scheduler records on the pod (PodScheduled False, reason
Unschedulable; share_scheduler.waiting.found_unschedulable), so a pod merely on its way through a cycle
does not count, and a restarted extender reads the same from the API.

`refresh()` is called by filter, prioritize and bind and at each /metrics scrape. It costs one integer and
one clock comparison unless the cache's multi-GPU waiting pods changed (`WaitingPods.multi_version`, bumped
by the pod watch) or a lingering shape is due to drop out; only then are the waiting multi-GPU pods read
(not every waiting pod). When the shapes change, every memoised answer priced under the old ones is
forgotten (`forget`: the ScoreMemo starts afresh, so BestNodeIndex re-ranks as it does when a learning
policy's table changes), after the new shapes are in the policy, under the policy lock. The node
snapshots' own memo (extender.SNAPSHOT_MEMO_LIMIT) holds only fit and unfit answers, which no policy
decides: nothing there to forget. Bind chooses under the shapes of its own refresh; a GPU filter already
held for a lone node (binder.hold) keeps the choice made at filter, a moment before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Sequence

from share_core.contract import SCHEDULER_NAME
from share_placement import Demand
from share_placement.room import Host
from share_placement.room import RoomForWaiting
from share_placement.room import hosted_shape
from share_placement.room import shape_of
from share_placement.waiting_shapes import LINGER_S
from share_placement.waiting_shapes import WaitingShapes
from share_scheduler.waiting import WaitingPod
from share_scheduler.waiting import WaitingPods

log = logging.getLogger(__name__)


def describe(shape: Demand, unit: str) -> str:
    """A shape for people: `2 GPUs x 16 GiB` (`of model A100|H100` when it names models)."""
    text = f"{shape.count} GPUs x {shape.per_gpu} {unit}"
    return f"{text} of model {'|'.join(shape.models)}" if shape.models else text


class LeaveRoom:
    """Keeps a RoomForWaiting policy told the shapes that wait (see the module's docstring)."""

    def __init__(
        self,
        policy: RoomForWaiting,
        waiting: WaitingPods,
        policy_lock: threading.Lock,
        forget: Callable[[], None],
        scheduler: str = SCHEDULER_NAME,
        linger_s: float = LINGER_S,
        unit: str = "GiB",
        clock: Callable[[], float] = time.time,
        hosts: Callable[[], Sequence[Host]] | None = None,
    ) -> None:
        self.policy = policy
        # The nodes as hosted_shape weighs them (ClusterCache.hosts: the same object until a node changes);
        # None: shapes are not narrowed.
        self.hosts = hosts
        self._hosts_seen: Sequence[Host] = ()
        self.waiting = waiting
        self.policy_lock = policy_lock
        self.forget = forget
        self.scheduler = scheduler
        self.rule = WaitingShapes(linger_s)
        self.unit = unit
        self.clock = clock
        self._lock = threading.Lock()
        self._version = -1  # the WaitingPods.multi_version last read (-1: never)
        self._due = float("-inf")  # when a lingering shape drops out next
        self._at = float("-inf")  # the last refresh
        self._waiting: Counter[Demand] = Counter()  # shape -> pods of it waiting, at the last refresh
        self.changes = 0

    @property
    def shapes(self) -> tuple[Demand, ...]:
        """The shapes the policy leaves room for now."""
        return self.policy.shapes

    def _hosts_same(self) -> bool:
        """No node came, went or changed its GPUs or allocatable since the last refresh, while pods wait
        (which nodes could ever host them decides their shapes: hosted_shape)."""
        return self.hosts is None or not self._waiting or self.hosts() is self._hosts_seen

    def waiting_now(self, shape: Demand) -> int:
        """Pods of `shape` waiting at the last refresh (0: the shape lingers)."""
        return self._waiting.get(shape, 0)

    def refresh(self) -> bool:
        """Tell the policy the shapes that wait now; True when they changed (the memoised answers were
        forgotten). Cheap when nothing changed."""
        if self.waiting.multi_version == self._version and self.clock() < self._due and self._hosts_same():
            return False
        with self._lock:
            now = self.clock()
            version, changed_at, pods = self.waiting.multi_gpu()
            if version == self._version and now < self._due and self._hosts_same():
                return False
            mine = [p for p in pods if p.unschedulable and p.scheduler == self.scheduler]
            shape_for = self._shapes_of({p.demand for p in mine})
            current = Counter(shape_for[p.demand] for p in mine)
            # The shapes whose pods waited at the last refresh waited until the watch's last change among the
            # multi-GPU pods (the one that ended their wait, or a later one; never before the last refresh).
            self.rule.update(self._waiting, max(min(now, changed_at), self._at))
            last = self.rule.update(current, now)
            self._at = now
            old = set(self.policy.shapes)
            with self.policy_lock:
                changed = self.policy.set_waiting(last)
                if changed:
                    self.forget()  # after the new shapes are in: nothing can price under the old ones now
            self._waiting = current
            self._version = version
            self._due = self.rule.expires()
            if changed:
                self.changes += 1
                self._tell(old, set(self.policy.shapes), mine, shape_for)
            return changed

    def _shapes_of(self, demands: set[Demand]) -> dict[Demand, Demand]:
        """Each distinct waiting demand's shape, narrowed to the models whose nodes could ever host it."""
        if self.hosts is None:
            return {d: shape_of(d) for d in demands}
        hosts = self._hosts_seen = self.hosts()
        return {d: shape_of(hosted_shape(d, hosts)) for d in demands}

    def _tell(
        self, old: set[Demand], new: set[Demand], mine: list[WaitingPod], shape_for: dict[Demand, Demand]
    ) -> None:
        who: dict[Demand, list[str]] = {}
        for p in mine:
            who.setdefault(shape_for[p.demand], []).append(p.key)
        parts = []
        for s in sorted(new - old, key=_order):
            pods = sorted(who.get(s, ()))
            why = f"waiting: {', '.join(pods[:3])}{' and more' if len(pods) > 3 else ''}" if pods else "waited lately"
            parts.append(f"now leaving room for {describe(s, self.unit)} ({why})")
        for s in sorted(old - new, key=_order):
            parts.append(
                f"no longer for {describe(s, self.unit)} (no pod of it has waited for {self.rule.linger_s:g}s)"
            )
        left = ", ".join(describe(s, self.unit) for s in sorted(new, key=_order)) or "none"
        log.info("room for what waits: %s; shapes left room for: %s", "; ".join(parts), left)


def _order(shape: Demand) -> tuple[int, int, tuple[str, ...]]:
    return (shape.count, shape.per_gpu, shape.models)
