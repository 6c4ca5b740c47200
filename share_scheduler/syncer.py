"""Feed the cache from the API server: list, then watch; on any break, back off and list again.

Each resource (nodes, pods) has its own thread. A watch that ends — server timeout, connection lost,
410 Gone — is followed by a fresh list that *replaces* the cache's view: whatever was missed while
no watch was open is repaired, so the cache cannot drift from the API server for longer than one
list. (A watch resumed from its resourceVersion would skip the list, but a list per watch cycle is
what keeps a missed event from living forever; it costs one paginated list every few minutes.)
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from share_core.kube import Gone
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import WatchEvent
from share_core.retry import Backoff
from share_scheduler.cache import ClusterCache

log = logging.getLogger(__name__)

# The DRA collections the cache reads in DRA mode, by the kind names the metrics and logs use.
DRA_KINDS = {
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
}
# PodDisruptionBudgets, which preemption weighs (share_scheduler.preempt).
PDB_PATH = "/apis/policy/v1/poddisruptionbudgets"


# Young-generation threshold and the gen1/gen2 multipliers used once the cache is built. A
# filter/prioritize over 5,000 nodes allocates ~10-20k container objects (its response alone is one
# dict per node), which at CPython's default (700, 10, 10) means a full collection every few
# requests; after gc.freeze() the "25% more long-lived objects" guard no longer holds it back, and a
# full collection walks every memo the policies keep (measured: a 50-60 ms pause every ~5 requests
# with frag). With these, young collections are ~15x rarer and a full one is considered only every
# ~50M net allocations (thousands of requests). Short-lived cycles (an exception and its frames) are
# still reclaimed by the young collections; only cycles that live long wait for the rarer full one.
GC_THRESHOLDS = (10_000, 50, 100)


_paused = 0
_paused_lock = threading.Lock()


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic garbage collection while the first lists are parsed (both threads may be in one).

    The first list of 40,000 pods makes millions of short-lived dicts and the cache's long-lived
    records: at CPython's default thresholds the collector runs full scans over the growing heap
    again and again, and parsing took 2.5 s instead of 0.5 (measured; most of the extender's time to
    ready). JSON makes no reference cycles, so nothing is lost by waiting; settle_gc() collects once
    the cache is built, and a list that fails turns collection back on at once."""
    global _paused
    with _paused_lock:
        if _paused == 0:
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0:
                gc.enable()


def settle_gc() -> None:
    """Call once the first full list is in the cache (the server does; bench/ mirrors it).

    That list made most objects this process will ever hold: collect, move them out of the garbage
    collector's generations (gc.freeze) so full scans stop walking them, and make collections rarer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Syncer:
    """One reflector thread per kind; `stop()` ends them (a watch in progress ends at its next event or timeout)."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ClusterCache,
        watch_timeout: int = 300,
        backoff: Callable[[], Backoff] = Backoff,
        budgets: Any = None,
    ) -> None:
        self.kube = kube
        self.cache = cache
        # PodDisruptionBudgets (preemption's first rule), when given: an object with replace(items),
        # upsert(obj), delete(obj) (share_scheduler.preempt.BudgetIndex). Not part of `cache.synced`.
        self.budgets = budgets
        self.watch_timeout = watch_timeout
        self._backoff = backoff
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # DRA mode: our ResourceSlices and every ResourceClaim too (share_scheduler.drastate).
        self.kinds = ("nodes", "pods", *DRA_KINDS) if cache.dra else ("nodes", "pods")
        if budgets is not None:
            self.kinds = (*self.kinds, "pdbs")
        self.lists = dict.fromkeys(self.kinds, 0)
        self.errors = dict.fromkeys(self.kinds, 0)
        self._frozen = False

    def start(self) -> None:
        for kind in self.kinds:
            t = threading.Thread(target=self._run, args=(kind,), name=f"gpushare-sync-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def sync_once(self, kind: str) -> str:
        """One full list applied to the cache; returns the list's resourceVersion."""
        start = time.monotonic()
        with collection_paused() if not self._frozen else contextlib.nullcontext():
            if kind == "nodes":
                result = self.kube.list_nodes()
                self.cache.replace_nodes(result.items)
                count, rv = len(result.items), result.resource_version
            elif kind == "pdbs":
                result = self.kube.list_path(PDB_PATH)
                self.budgets.replace(result.items)
                count, rv = len(result.items), result.resource_version
            elif kind in DRA_KINDS:
                result = self.kube.list_path(DRA_KINDS[kind])
                replace = self.cache.replace_slices if kind == "resourceslices" else self.cache.replace_claims
                replace(result.items)
                count, rv = len(result.items), result.resource_version
            else:
                # Page by page: the next page is fetched while this one is parsed, and no page outlives its parse.
                pages = self.kube.pod_pages()
                self.cache.replace_pods(itertools.chain.from_iterable(pages))
                count, rv = pages.count, pages.resource_version
        synced = time.monotonic()
        self.lists[kind] += 1
        settled = ""
        if not self._frozen and self.cache.synced:
            self._frozen = True
            settle_gc()
            settled = f", then settled the heap in {time.monotonic() - synced:.2f}s"
        log.info("listed and applied %d %s (resourceVersion %s) in %.2fs%s", count, kind, rv, synced - start, settled)
        return rv

    def _watch(self, kind: str, rv: str) -> Iterator[WatchEvent]:
        if kind == "pdbs":
            return self.kube.watch_path(PDB_PATH, rv, timeout_seconds=self.watch_timeout)
        if kind in DRA_KINDS:
            return self.kube.watch_path(DRA_KINDS[kind], rv, timeout_seconds=self.watch_timeout)
        if kind == "nodes":
            return self.kube.watch_nodes(rv, timeout_seconds=self.watch_timeout)
        # slim: in protobuf from the API server, only what the cache reads (share_core.kubeproto).
        return self.kube.watch_pods(rv, timeout_seconds=self.watch_timeout, slim=True)

    def _apply(self, kind: str, ev: WatchEvent) -> None:
        if ev.type == "BOOKMARK":
            return
        if kind == "nodes":
            if ev.type == "DELETED":
                self.cache.delete_node(str((ev.object.get("metadata") or {}).get("name") or ""))
            else:
                self.cache.upsert_node(ev.object)
        elif kind == "pdbs":
            (self.budgets.delete if ev.type == "DELETED" else self.budgets.upsert)(ev.object)
        elif kind == "resourceslices":
            (self.cache.delete_slice if ev.type == "DELETED" else self.cache.upsert_slice)(ev.object)
        elif kind == "resourceclaims":
            (self.cache.delete_claim if ev.type == "DELETED" else self.cache.upsert_claim)(ev.object)
        elif ev.type == "DELETED":
            self.cache.delete_pod(ev.object)
        else:
            self.cache.upsert_pod(ev.object)

    def _run(self, kind: str) -> None:
        backoff = self._backoff()
        while not self._stop.is_set():
            try:
                rv = self.sync_once(kind)
                for ev in self._watch(kind, rv):
                    if self._stop.is_set():
                        return
                    self._apply(kind, ev)
                backoff.reset()
                log.debug("%s watch ended; re-listing", kind)
            except Gone as exc:
                log.info("%s watch expired (410 Gone: %s); re-listing", kind, exc)
            except KubeError as exc:
                self.errors[kind] += 1
                log.warning("%s list/watch failed: %s; retrying with backoff", kind, exc)
                if backoff.wait(self._stop):
                    return
            except Exception:  # a bug must not kill the thread that keeps the cache true
                self.errors[kind] += 1
                log.exception("%s sync loop crashed; retrying with backoff", kind)
                if backoff.wait(self._stop):
                    return
