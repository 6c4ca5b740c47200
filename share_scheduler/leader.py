"""Which extender replica acts on its own (evictions, reservations, consolidation): the one beside the
kube-scheduler that holds the leader Lease.

The chart runs kube-scheduler and the extender in one pod, so only the leading kube-scheduler ever calls
its extender; what the extender does unasked must follow the same leader, or two replicas would evict
twice. kube-scheduler names itself in the Lease as `<hostname>_<uuid>` (cmd/kube-scheduler/app/options,
makeLeaderElectionConfig), and both containers of the pod share its hostname: this replica leads while
the Lease's holder starts with `<our hostname>_` and its renewTime is within leaseDurationSeconds (both
clocks are the node's). Without a Lease (leader election off: one replica) this replica always leads.

The Lease is read every `poll` seconds in a thread; `is_leader()` is a field read. A read that fails
keeps the last answer until the Lease would have lapsed, then says "not leader": when in doubt, do not act.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from share_core.kube import KubeClient
from share_core.kube import KubeError

log = logging.getLogger(__name__)

DEFAULT_POLL = 2.0  # seconds; kube-scheduler's retryPeriod in the chart


def parse_lease_ref(text: str) -> tuple[str, str]:
    """`namespace/name` -> (namespace, name); ValueError naming the problem."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--leader-lease must be NAMESPACE/NAME of kube-scheduler's Lease, got {text!r}")
    return namespace, name


def _time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def holds_lease(lease: Mapping[str, Any], identity: str, now: float) -> bool:
    """Pure: whether kube-scheduler `identity` (our hostname) holds this coordination.k8s.io/v1 Lease now."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if not holder.startswith(identity + "_"):
        return False
    renewed = _time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return False
    return now < renewed + duration


class Leadership:
    """`is_leader()`: whether this replica may act unasked. See the module docstring."""

    def __init__(
        self,
        kube: KubeClient | None,
        lease: str | None,
        identity: str | None = None,
        poll: float = DEFAULT_POLL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.lease = parse_lease_ref(lease) if lease else None
        self.identity = identity or socket.gethostname()
        self.poll = poll
        self._clock = clock
        self._leader = self.lease is None
        self._valid_until = float("inf") if self.lease is None else 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_change: list[Callable[[bool], None]] = []

    def on_change(self, fn: Callable[[bool], None]) -> None:
        """Call `fn(leading)` whenever this replica starts or stops leading."""
        self._on_change.append(fn)

    def is_leader(self) -> bool:
        if self._leader and self._clock() >= self._valid_until:
            self._set(False, "its Lease lapsed without a successful read")
        return self._leader

    def _set(self, leading: bool, why: str) -> None:
        if leading == self._leader:
            return
        self._leader = leading
        log.info("this extender %s acting on its own: %s", "starts" if leading else "stops", why)
        for fn in self._on_change:
            try:
                fn(leading)
            except Exception:  # a listener's bug must not stop the leadership loop
                log.exception("leadership listener failed")

    def refresh(self) -> bool:
        """Read the Lease once and update the answer; returns it."""
        if self.lease is None or self.kube is None:
            return self.is_leader()
        namespace, name = self.lease
        try:
            lease = self.kube.get_path(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
        except KubeError as exc:
            log.debug("reading Lease %s/%s failed: %s", namespace, name, exc)
            return self.is_leader()
        now = self._clock()
        leading = holds_lease(lease, self.identity, now)
        spec = lease.get("spec") or {}
        if leading:
            self._valid_until = (_time(spec.get("renewTime")) or now) + int(spec.get("leaseDurationSeconds") or 0)
        holder = spec.get("holderIdentity") or "nobody"
        self._set(leading, f"Lease {namespace}/{name} is held by {holder} (this pod is {self.identity})")
        return self._leader

    def start(self) -> None:
        if self.lease is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.poll)

    def stop(self) -> None:
        self._stop.set()
