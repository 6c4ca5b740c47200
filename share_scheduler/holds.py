"""The extender's book of holds: GPU memory kept for pods not bound yet (share_core.holds says what a hold
is and whom it applies to).

Fed by the pod watch through the cache (the `gpushare.io/holds` annotation on each anchor pod), so every
replica knows the leader's holds and a restarted extender rebuilds them from one list; the leader also
adds a hold here the moment it decides (`add`), before the annotation's echo comes back. A hold goes when
its holder is bound (the pod has its GPUs), when its anchor pod is deleted or finishes, or at its expiry,
whichever is first; an anchor whose annotation cannot be read holds nothing (logged once per change).

Readers (filter, prioritize, bind) ask `against(pod facts)`: node -> GPU index -> units that pod must see
as taken. With no hold in the book, that is one attribute read: the hot path stays as it was.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import after_bind
from share_core.holds import after_replacement_bound
from share_core.holds import held_units
from share_core.holds import pod_controller_uid
from share_core.holds import pod_priority
from share_core.holds import reservations_yield
from share_scheduler.waiting import found_unschedulable
from share_scheduler.waiting import parse_timestamp

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Anchor:
    """A pod that carries holds: its UID (a recreated pod of the same name is another anchor) and them."""

    uid: str
    holds: tuple[Hold, ...]
    added: float | None = None  # when the leader added them here, until the annotation's echo shows them


ECHO_GRACE = 30.0  # seconds a hold the leader added waits for its annotation to show in the watch
YIELDS_REMEMBERED = 10_000  # pods yielded to within the hour, each counted and logged once


@dataclass(frozen=True, slots=True)
class Asker:
    """Who is asking for room: what decides which holds it must respect."""

    uid: str
    priority: int
    owner_uid: str = ""
    # For the yield rule (`HoldBook.yield_after_s`): GPUs it asks, its creationTimestamp (s since the epoch,
    # 0: unknown) and whether kube-scheduler already found no node for it (PodScheduled False, Unschedulable).
    gpu_count: int | None = None  # None: not told (a preemptor, the loop's own questions): never yielded to
    created: float = 0.0
    found_no_room: bool = False
    key: str = ""  # namespace/name, for the log

    @classmethod
    def of(cls, pod: Mapping[str, Any], gpu_count: int | None = None) -> Asker:
        meta = pod.get("metadata") or {}
        return cls(
            str(meta.get("uid") or ""),
            pod_priority(pod),
            pod_controller_uid(pod),
            gpu_count,
            parse_timestamp(meta.get("creationTimestamp")),
            found_unschedulable(pod),
            f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}",
        )


class HoldBook:
    """Thread-safe; every method is cheap (holds are few: bounded per pod and by their writers)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock  # wall clock: expiries are absolute times written on the API server
        # Reservations yield to a pod of fewer than `min_gpus` GPUs that kube-scheduler found no room for and
        # that has waited (since its creation) longer than this; None: never (share_core.holds.reservations_yield).
        # The extender sets both from its StarvationConfig.
        self.yield_after_s: float | None = None
        self.min_gpus = 2
        self.yields = 0  # pods reservations yielded to (a metric: how often small pods were let into held room)
        self._yielded_to: TTLCache[str, bool] = TTLCache(maxsize=YIELDS_REMEMBERED, ttl=3600.0)
        self._lock = threading.Lock()
        self._anchors: dict[str, Anchor] = {}  # anchor pod key (namespace/name) -> its holds
        self._count = 0  # holds in the book (read without the lock on the hot path)
        self._problems: dict[str, str] = {}  # anchor key -> why its annotation was not read

    @property
    def active(self) -> bool:
        return self._count > 0

    def _recount(self) -> None:
        self._count = sum(len(a.holds) for a in self._anchors.values())

    def _prune(self, now: float) -> None:
        """Drop expired holds (under the lock)."""
        changed = False
        for key, anchor in list(self._anchors.items()):
            live = tuple(h for h in anchor.holds if not h.expired(now))
            if len(live) != len(anchor.holds):
                changed = True
                for h in anchor.holds:
                    if h.expired(now):
                        log.info("%s expired", h.describe())
                if live:
                    self._anchors[key] = Anchor(anchor.uid, live)
                else:
                    del self._anchors[key]
        if changed:
            self._recount()

    # -- writers: the leader's decisions and the pod watch ------------------------------------------

    def add(self, anchor_key: str, anchor_uid: str, holds: Iterable[Hold], replacing: Iterable[Hold] = ()) -> None:
        """The leader made these holds for `anchor_key` (it writes the annotation next), in place of
        `replacing` (a renewed reservation): count them now."""
        new = tuple(holds)
        gone = tuple(replacing)
        with self._lock:
            old = self._anchors.get(anchor_key)
            kept = old.holds if old is not None and old.uid == anchor_uid else ()
            kept = tuple(h for h in kept if h not in gone)
            self._anchors[anchor_key] = Anchor(anchor_uid, kept + new, self._clock())
            self._recount()

    def release(self, anchor_key: str, reason: str) -> list[Hold]:
        """Drop an anchor's holds (the leader gave up on them); returns what was held."""
        with self._lock:
            anchor = self._anchors.pop(anchor_key, None)
            self._recount()
        if anchor is None:
            return []
        for h in anchor.holds:
            log.info("%s released: %s", h.describe(), reason)
        return list(anchor.holds)

    def pod_seen(
        self,
        key: str,
        uid: str,
        node: str,
        owner_uid: str,
        finished: bool,
        holds: tuple[Hold, ...] | None,
        problem: str = "",
        newly_bound: bool = False,
    ) -> None:
        """A pod as the watch shows it. `holds` None: the pod's annotation says nothing, so it holds
        nothing, except what the leader added here within ECHO_GRACE (the annotation is on its way); a
        finished pod holds nothing any more. `newly_bound`: this event is its Binding's echo (the cache
        knew it unbound, or first sees it bound and not started): only then may it use a hold kept for
        its controller's pods (a running pod's later events, the moved pod's own above all, never do)."""
        with self._lock:
            changed = False
            if problem:
                if self._problems.get(key) != problem:
                    log.warning("pod %s: its holds are ignored: %s", key, problem)
                self._problems[key] = problem
            else:
                self._problems.pop(key, None)
            anchor = self._anchors.get(key)
            if anchor is not None and anchor.uid != uid:
                del self._anchors[key]  # another pod by that name: the old one's holds went with it
                anchor, changed = None, True
            if finished:
                if anchor is not None:
                    del self._anchors[key]
                    changed = True
            elif holds is not None and not problem:
                live = tuple(h for h in holds if not h.expired(self._clock()))
                if node:  # bound: its own holds are spent; what it kept for others stays
                    live = tuple(after_bind(live, uid))
                if live:
                    self._anchors[key] = Anchor(uid, live)
                elif anchor is not None:
                    del self._anchors[key]
                changed = True
            elif anchor is not None:
                pending = anchor.added is not None and self._clock() - anchor.added < ECHO_GRACE
                kept = anchor.holds if pending else ()
                if node:
                    kept = tuple(after_bind(kept, uid))
                if kept != anchor.holds:
                    self._anchors[key] = Anchor(uid, kept, anchor.added)
                    changed = True
            if node and newly_bound and self._count:
                changed |= self._spend_owner_hold(uid, owner_uid, node)
            if changed:
                if key in self._anchors and not self._anchors[key].holds:
                    del self._anchors[key]
                self._recount()

    def _spend_owner_hold(self, uid: str, owner_uid: str, node: str) -> bool:
        """A pod newly bound to `node`: a hold its controller had there (a moved pod placed again) is used up."""
        if not owner_uid:
            return False
        for key, anchor in self._anchors.items():
            left = after_replacement_bound(anchor.holds, uid, owner_uid, node)
            if len(left) != len(anchor.holds):
                self._anchors[key] = Anchor(anchor.uid, tuple(left))
                return True
        return False

    def pod_gone(self, key: str) -> None:
        with self._lock:
            self._problems.pop(key, None)
            if self._anchors.pop(key, None) is not None:
                self._recount()

    def keep_only(self, keys: set[str]) -> None:
        """After a full list: anchors the list lacks are gone."""
        with self._lock:
            for key in set(self._anchors) - keys:
                del self._anchors[key]
            for key in set(self._problems) - keys:
                del self._problems[key]
            self._recount()

    # -- readers ------------------------------------------------------------------------------------

    def against(self, asker: Asker) -> dict[str, dict[int, int]]:
        """node -> GPU index -> units `asker` must see as taken ({} when no hold applies)."""
        if not self._count:
            return {}
        with self._lock:
            now = self._clock()
            self._prune(now)
            holds = self._all()
            yielded = self._yields_to(asker, now) and any(
                h.kind is HoldKind.RESERVATION and h.applies_to(asker.priority, asker.uid, asker.owner_uid)
                for h in holds
            )
            if yielded and asker.uid not in self._yielded_to:
                self._yielded_to[asker.uid] = True
                self.yields += 1
                log.info(
                    "pod %s (%d GPU(s)) waited %.0f s with no room: reservations yield to it (--hold-yield-after %g)",
                    asker.key or asker.uid,
                    asker.gpu_count,
                    now - asker.created,
                    self.yield_after_s,
                )
            return held_units(holds, asker.priority, asker.uid, asker.owner_uid, yielded=yielded)

    def _yields_to(self, asker: Asker, now: float) -> bool:
        if self.yield_after_s is None or asker.gpu_count is None or not asker.created:
            return False
        waited = now - asker.created
        return reservations_yield(asker.gpu_count, self.min_gpus, waited, self.yield_after_s, asker.found_no_room)

    def _all(self) -> list[Hold]:
        return [h for anchor in self._anchors.values() for h in anchor.holds]

    def holds(self) -> list[tuple[str, Hold]]:
        """Every live hold with its anchor pod's key (inspect, metrics, the leader's bookkeeping)."""
        with self._lock:
            self._prune(self._clock())
            return [(key, h) for key, anchor in self._anchors.items() for h in anchor.holds]

    def of(self, anchor_key: str) -> tuple[Hold, ...]:
        with self._lock:
            self._prune(self._clock())
            anchor = self._anchors.get(anchor_key)
            return anchor.holds if anchor is not None else ()

    def problems(self) -> dict[str, str]:
        with self._lock:
            return dict(self._problems)
