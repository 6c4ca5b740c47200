"""Preemption that frees room on ONE GPU: the extender's preempt verb, and its own preemption where
kube-scheduler never calls the verb. The victim choice itself is share_placement.preemption (pure); this
is the shell around it: PodDisruptionBudgets, the cluster cache, holds, evictions, events, metrics.

How kube-scheduler meets an extender here (pkg/scheduler/framework/preemption/preemption.go, extender.go):
- DefaultPreemption's dry run (DryRunPreemption) runs kube-scheduler's own filter plugins only. A node
  whose total `nvidia.com/gpu-mem` already fits (fragmentation only: the nodes our filter failed, since
  kube-scheduler calls filter only with nodes its own plugins passed) yields no victim: 1.33-1.37 turn that
  into the error "expected at least one victim pod on node" and, when no node has a candidate, never call
  the preempt verb; 1.38 passes such nodes to the verb with an empty victim list (placeholders).
- callExtenders sends `NodeNameToMetaVictims` (nodeCacheCapable: UIDs); our answer replaces it. Any node
  of kube-scheduler's snapshot may be answered, with at least one victim (1.33-1.37 fail the whole call on
  an empty list unless the extender is ignorable); convertToVictims fails the whole call if a UID is not
  a pod kube-scheduler knows on that node. A node left out is dropped. `NumPDBViolations` is trusted.
- SelectCandidate then ranks what we answered by pickOneNodeForPreemption, whose last ties (start time,
  then map order) are not ours: we answer ONE node, our best, so its choice is ours and the GPUs can be
  held for the preemptor at once. prepareCandidate marks each victim DisruptionTarget
  (PreemptionByScheduler) and deletes it, ignoring PodDisruptionBudgets (they only rank candidates).

Where kube-scheduler has no candidate at all (1.33-1.37, fragmentation only), filter notes the pod's best
candidate among the nodes it failed (`after_filter`); if the verb is not called for it within `defer`
seconds (it is called in the same scheduling cycle when kube-scheduler has candidates, and then takes the
noted node into account), the leader evicts by the same rule as kube-scheduler does: the DisruptionTarget
condition, then DELETE with the victim's own grace period. PodDisruptionBudgets are a preference here
too, not a veto (the Eviction API would refuse): the verb's victims are deleted by kube-scheduler the
same way, and a veto would leave the preemptor pending where kube-scheduler itself would not.

Once per decision: the decision is a PREEMPTION hold (share_core.holds) on the preemptor, in the book at
once and in its `gpushare.io/holds` annotation for a restarted extender or the other replica. While it
lives, the verb answers no candidate for that pod (as PodEligibleToPreemptOthers refuses a pod whose
victims are still terminating) and filter notes nothing; the freed GPUs count as taken for every pod of
no higher priority until the preemptor is bound, deleted, or the hold expires. A hold the verb made whose
victims never start terminating (kube-scheduler failed to evict) is released after `verify` seconds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

import orjson

from share_core.contract import ANN_HOLDS
from share_core.contract import MemoryUnit
from share_core.events import EventQueue
from share_core.holds import Hold
from share_core.holds import HoldKind
from share_core.holds import encode_holds
from share_core.holds import may_preempt
from share_core.holds import pod_priority
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.request import InvalidRequest
from share_placement import Demand
from share_placement import GpuSlot
from share_placement.preemption import Candidate
from share_placement.preemption import PodOnNode
from share_placement.preemption import PreemptionNode
from share_placement.preemption import choose_victims
from share_scheduler.budgets import BudgetIndex
from share_scheduler.cache import ClusterCache
from share_scheduler.extender import BadRequest
from share_scheduler.extender import _field
from share_scheduler.extender import pod_demand
from share_scheduler.holds import Asker
from share_scheduler.nodes import PodRecord

log = logging.getLogger(__name__)

DEFAULT_HOLD_SECONDS = 120.0  # a preemptor's freed GPUs are kept for it this long (victims' grace included)
DEFAULT_DEFER_SECONDS = 2.0  # filter's noted candidate waits this long for kube-scheduler's own preemption
DEFAULT_VERIFY_SECONDS = 15.0  # a verb's decision whose victims never start terminating is dropped after this
DEFAULT_READY_GRACE = 60.0  # once the freed GPUs are free, the preemptor has this long to be bound
NOTE_PATIENCE = 10.0  # seconds a note waits for the pod watch to show its pod
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"  # v1.PodReasonPreemptionByScheduler


# -- the cluster as preemption sees it ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Preemptor:
    key: str
    uid: str
    namespace: str
    name: str
    priority: int
    scheduler: str
    demand: Demand

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> Preemptor:
        """Raises InvalidRequest for a pod whose GPU request cannot be read."""
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        _, demand = pod_demand(pod)
        return cls(
            f"{ns}/{name}",
            str(meta.get("uid") or ""),
            ns,
            name,
            pod_priority(pod),
            str((pod.get("spec") or {}).get("schedulerName") or "default-scheduler"),
            demand,
        )

    def ref(self) -> dict[str, Any]:
        return {"metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid}}


def victim_of(record: PodRecord, budgets: BudgetIndex, allowed: dict[str, int]) -> PodOnNode:
    c = record.contribution
    ns, _, name = record.key.partition("/")
    keys, found = budgets.selecting(ns, name, dict(record.labels))
    allowed.update(found)
    return PodOnNode(
        record.uid,
        record.priority,
        tuple((i, c.per_gpu) for i in c.indices) if c is not None else (),
        c.cpu if c is not None else 0,
        c.memory if c is not None else 0,
        keys,
        record.started or time.time(),  # upstream takes a pod without a start time as started now
        record.terminating,
        record.key,
    )


def preemption_nodes(
    cache: ClusterCache, budgets: BudgetIndex, names: Iterable[str], held: Mapping[str, Mapping[int, int]]
) -> tuple[list[PreemptionNode], dict[str, int]]:
    """The named nodes (unknown ones left out) as the victim choice takes them: GPU free counting every pod,
    assumption and hold `held` says this preemptor must respect (terminating pods included: their memory is
    not free until they are gone), host room as NodeResourcesFit counts it, the pods bound there."""
    out, allowed = [], {}
    for name, snap in cache.entries(list(names), dict(held) if held else None):
        if snap is None:
            continue
        gpus = tuple(
            GpuSlot(g.index, g.model, g.memory, g.memory - used, g.healthy)
            for g, used in zip(snap.gpus, snap.used, strict=True)
        )
        a, (cpu, memory, pods) = snap.allocatable, snap.requested
        victims = tuple(victim_of(r, budgets, allowed) for r in cache.pods_on(name))
        out.append(PreemptionNode(name, gpus, victims, a.cpu - cpu, a.memory - memory, a.pods - pods))
    return out, allowed


# -- the verb's wire form -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    pod: Mapping[str, Any]
    proposal: dict[str, tuple[str, ...]]  # node -> victim UIDs kube-scheduler proposed ([] on 1.38 placeholders)


def parse_preemption_args(raw: bytes) -> PreemptionArgs:
    """An ExtenderPreemptionArgs body (k8s.io/kube-scheduler/extender/v1): `Pod` and
    `NodeNameToMetaVictims` (nodeCacheCapable) or `NodeNameToVictims` (whole pods); BadRequest otherwise."""
    if not raw:
        raise BadRequest("request body is empty")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from exc
    if not isinstance(body, Mapping):
        raise BadRequest("request body must be a JSON object (ExtenderPreemptionArgs)")
    pod = _field(body, "Pod")
    if not isinstance(pod, Mapping) or not isinstance(pod.get("metadata") or {}, Mapping):
        raise BadRequest("ExtenderPreemptionArgs.Pod is missing or not a pod object")
    meta = _field(body, "NodeNameToMetaVictims")
    whole = _field(body, "NodeNameToVictims")
    source, by_uid = (meta, True) if meta is not None else (whole, False)
    if source is None:
        source = {}
    if not isinstance(source, Mapping):
        raise BadRequest("NodeNameToMetaVictims must map node names to victims")
    proposal: dict[str, tuple[str, ...]] = {}
    for node, victims in source.items():
        if victims is None:
            proposal[str(node)] = ()
            continue
        if not isinstance(victims, Mapping):
            raise BadRequest(f"victims of node {node!r} must be an object with Pods")
        pods = _field(victims, "Pods") or []
        if not isinstance(pods, list):
            raise BadRequest(f"victims of node {node!r}: Pods must be a list")
        uids = []
        for p in pods:
            if not isinstance(p, Mapping):
                raise BadRequest(f"victims of node {node!r}: each pod must be an object")
            uid = _field(p, "UID") if by_uid else (p.get("metadata") or {}).get("uid")
            if not isinstance(uid, str) or not uid:
                raise BadRequest(f"victims of node {node!r}: a pod without a UID")
            uids.append(uid)
        proposal[str(node)] = tuple(uids)
    return PreemptionArgs(pod, proposal)


def preemption_result(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """The ExtenderPreemptionResult: victims by UID, most important first (kube-scheduler reads Pods[0])."""
    return {
        "NodeNameToMetaVictims": {
            c.node: {"Pods": [{"UID": v.uid} for v in c.victims], "NumPDBViolations": c.pdb_violations}
            for c in candidates
        }
    }


# -- the shell ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Noted:
    """filter's best candidate for a pod no node passed, waiting `defer` for kube-scheduler's preemption."""

    preemptor: Preemptor
    node: str
    due: float
    first: float = 0.0  # when filter noted it


@dataclass(slots=True)
class Decision:
    """A preemption under way: its hold, victims, and how it ends (the preemptor bound on those GPUs)."""

    preemptor: Preemptor
    candidate: Candidate
    hold: Hold
    source: str  # "verb" or "extender"
    decided: float
    verified: bool = False
    victims_left: set[str] = field(default_factory=set)


class Preemption:
    """The preempt verb, filter's hook and the leader's worker (see the module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        cache: ClusterCache,
        unit: MemoryUnit,
        events: EventQueue,
        metrics: Any,
        is_leader: Callable[[], bool],
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        defer: float = DEFAULT_DEFER_SECONDS,
        verify: float = DEFAULT_VERIFY_SECONDS,
        clock: Callable[[], float] = time.time,
        budgets: BudgetIndex | None = None,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.unit = unit
        self.events = events
        self.metrics = metrics
        self.is_leader = is_leader
        self.hold_seconds = hold_seconds
        self.defer = defer
        self.verify = verify
        self.clock = clock
        self.budgets = budgets if budgets is not None else BudgetIndex()
        self._lock = threading.Lock()
        self._noted: dict[str, Noted] = {}  # preemptor UID -> filter's note
        self._decisions: dict[str, Decision] = {}  # preemptor UID -> a decision being carried out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready: set[tuple[str, str, tuple[int, ...]]] = set()  # holds renewed once their GPUs were free
        self._waiting: set[tuple[str, str, tuple[int, ...]]] = set()  # holds seen waiting for their victims
        self.ready_grace = DEFAULT_READY_GRACE

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self, interval: float = 0.5) -> None:
        self._thread = threading.Thread(target=self._run, args=(interval,), name="gpushare-preemption", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:  # the worker must outlive a bug in one round
                log.exception("preemption worker round failed")

    # -- what the pod already has -----------------------------------------------------------------------

    def _preempting(self, p: Preemptor) -> Hold | None:
        """The live PREEMPTION hold this pod already has (its decision is being carried out), if any."""
        for h in self.cache.holds.of(p.key):
            if h.kind is HoldKind.PREEMPTION and h.holder_uid == p.uid and not h.expired(self.clock()):
                return h
        return None

    def _nodes(self, p: Preemptor, names: Iterable[str]) -> tuple[list[PreemptionNode], dict[str, int]]:
        held = self.cache.holds.against(Asker(p.uid, p.priority)) if self.cache.holds.active else {}
        return preemption_nodes(self.cache, self.budgets, names, held)

    # -- the verb ---------------------------------------------------------------------------------------

    def preempt(self, raw: bytes) -> tuple[int, Any]:
        counts = self.metrics.preempt_calls
        try:
            args = parse_preemption_args(raw)
        except BadRequest as exc:
            counts.labels("bad_request").inc()
            return 400, {"Error": str(exc)}
        if not self.cache.synced:
            counts.labels("not_synced").inc()
            return 503, {"Error": "gpushare extender is still syncing its cache; retry"}
        try:
            p = Preemptor.of(args.pod)
        except InvalidRequest as exc:
            counts.labels("invalid_request").inc()
            log.info("preempt: pod %s: %s; no candidate", (args.pod.get("metadata") or {}).get("name"), exc)
            return 200, preemption_result(())
        if not may_preempt(args.pod):
            counts.labels("preemption_policy_never").inc()
            return 200, preemption_result(())
        if self._preempting(p) is not None:
            # its victims are still terminating: kube-scheduler's PodEligibleToPreemptOthers rule
            counts.labels("already_preempting").inc()
            return 200, preemption_result(())
        with self._lock:
            noted = self._noted.pop(p.uid, None)
        names = list(args.proposal)
        if noted is not None and noted.node not in args.proposal:
            names.append(noted.node)  # filter's fragmentation-only node: any node of the snapshot may be answered
        nodes, allowed = self._nodes(p, names)
        known = {pod.uid for n in nodes for pod in n.pods}
        unknown = sum(1 for uids in args.proposal.values() for uid in uids if uid not in known)
        if unknown:
            self.metrics.preempt_unknown_victims.inc(unknown)
            log.info(
                "preempt %s: %d victim(s) kube-scheduler proposed are not in our cache (watch lag)", p.key, unknown
            )
        ranked = [c for c in choose_victims(nodes, p.demand, p.priority, allowed) if c.victims]
        if not ranked:
            counts.labels("no_candidate").inc()
            log.info("preempt %s: no node where evicting lower-priority pods frees %s", p.key, self._need(p))
            return 200, preemption_result(())
        best = ranked[0]
        proposed = set(args.proposal.get(best.node, ()))
        chosen = {v.uid for v in best.victims}
        self.metrics.preempt_victims_added.inc(len(chosen - proposed))
        self.metrics.preempt_victims_dropped.inc(len(proposed - chosen))
        counts.labels("answered").inc()
        self._decide(p, best, "verb")
        return 200, preemption_result([best])

    # -- filter's note and the leader's own preemption --------------------------------------------------

    def after_filter(self, pod: Mapping[str, Any], failed: Iterable[str]) -> None:
        """filter passed no node for `pod` (its FailedNodes: preemption may help there). Note its best
        candidate among them for the worker, unless the pod may not preempt or already is."""
        if not self.is_leader() or not may_preempt(pod):
            return
        try:
            p = Preemptor.of(pod)
        except InvalidRequest:
            return
        if p.demand.count == 0 or not p.uid or self._preempting(p) is not None:
            return
        with self._lock:
            if p.uid in self._noted or p.uid in self._decisions:
                return
        nodes, allowed = self._nodes(p, failed)
        ranked = [c for c in choose_victims(nodes, p.demand, p.priority, allowed) if c.victims]
        if not ranked:
            return
        with self._lock:
            self._noted.setdefault(p.uid, Noted(p, ranked[0].node, self.clock() + self.defer, self.clock()))

    def tick(self) -> None:
        """One round of the worker: act on notes kube-scheduler did not take up, check decisions."""
        now = self.clock()
        with self._lock:
            due = [n for n in self._noted.values() if n.due <= now]
            for n in due:
                del self._noted[n.preemptor.uid]
        for n in due:
            self._act_on(n)
        self._check_decisions(now)
        if self.is_leader():
            self._renew_ready(now)

    def _renew_ready(self, now: float) -> None:
        """A preemptor whose freed GPUs became free (its victims are gone; this process saw them going): its
        hold now ends `ready_grace` seconds from here (the time to be bound once the GPU is really free),
        written to its annotation. The write is also the pod update that makes kube-scheduler try
        the pod again at once: a pod our filter rejected waits in its unschedulable pool for a cluster event,
        and the victims' deletion alone was seen to leave it there (after an extender restart)."""
        for key, hold in self.cache.holds.holds():
            if hold.kind is not HoldKind.PREEMPTION or (hold.holder_uid, hold.node, hold.gpus) in self._ready:
                continue
            record = self.cache.record(key)
            if record is None or record.uid != hold.holder_uid or record.node:
                continue
            asker = Asker(hold.holder_uid, hold.priority)
            held = self.cache.holds.against(asker).get(hold.node)
            snap = self.cache.node_snapshot(hold.node, held)
            if snap is None:
                continue
            free = {g.index: g.memory - used for g, used in zip(snap.gpus, snap.used, strict=True)}
            ident = (hold.holder_uid, hold.node, hold.gpus)
            if any(free.get(g, 0) < hold.per_gpu for g in hold.gpus):
                self._waiting.add(ident)  # a victim is still terminating
                continue
            if ident not in self._waiting:
                continue  # free since this process first saw it: nothing was waited for
            self._ready.add(ident)
            # From now, not from the decision: and the annotation must change (whole seconds), or the write
            # is no update kube-scheduler sees.
            expires = math.ceil(now + self.ready_grace)
            if expires == math.ceil(hold.expires):
                expires += 1
            renewed = replace(hold, expires=float(expires))
            others = [h for h in self.cache.holds.of(key) if h != hold]
            ns, _, name = key.partition("/")
            try:
                self.kube.patch_pod_annotations(ns, name, {ANN_HOLDS: encode_holds([*others, renewed])})
            except KubeError as exc:
                log.info("could not renew the preemption hold of %s: %s", key, exc)
                continue
            with self._lock:
                decision = self._decisions.get(hold.holder_uid)
                if decision is not None:
                    decision.hold = renewed
            log.info(
                "%s: its victims are gone; held %.0fs more", renewed.describe(self.unit.value), renewed.expires - now
            )

    def _act_on(self, noted: Noted) -> None:
        p = noted.preemptor
        if not self.is_leader():
            return
        record = self.cache.record(p.key)
        if record is None and self.clock() - noted.first < NOTE_PATIENCE:
            with self._lock:  # the pod watch has not brought it yet: look again next round
                self._noted.setdefault(p.uid, replace(noted, due=self.clock()))
            return
        if record is None or record.uid != p.uid or record.node:
            return  # deleted, replaced or placed meanwhile
        if self._preempting(p) is not None:
            return
        nodes, allowed = self._nodes(p, [noted.node])
        ranked = [c for c in choose_victims(nodes, p.demand, p.priority, allowed) if c.victims]
        if not ranked:
            return  # room appeared (or the victims went) meanwhile: the next cycle places it
        best = ranked[0]
        self._decide(p, best, "extender")
        for v in best.victims:
            self._evict(p, best, v)

    def _evict(self, p: Preemptor, c: Candidate, v: PodOnNode) -> None:
        """As kube-scheduler's PreemptPod: the DisruptionTarget condition, then DELETE (grace period kept)."""
        ns, _, name = v.name.partition("/")
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": f"{p.scheduler}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            self.kube.add_pod_condition(ns, name, condition)
            self.kube.remove_pod(ns, name, v.uid)
        except NotFound:
            log.info("victim %s of %s was already gone", v.name, p.key)
            return
        except KubeError as exc:
            self.metrics.preempt_eviction_errors.inc()
            log.warning("could not preempt %s (node %s) for %s: %s", v.name, c.node, p.key, exc)
            return
        self.metrics.preempt_evictions.inc()
        log.info("preempted %s on node %s for %s", v.name, c.node, p.key)

    # -- a decision: hold, annotation, events, metrics ----------------------------------------------------

    def _need(self, p: Preemptor) -> str:
        where = "on one GPU" if p.demand.count == 1 else f"on each of {p.demand.count} GPUs"
        return f"{p.demand.per_gpu} {self.unit.value} {where}"

    def _decide(self, p: Preemptor, c: Candidate, source: str) -> None:
        now = self.clock()
        hold = Hold(
            HoldKind.PREEMPTION, c.node, c.gpus, p.demand.per_gpu, p.priority, now + self.hold_seconds, p.uid, p.key
        )
        self.cache.holds.add(p.key, p.uid, [hold])
        with self._lock:
            self._decisions[p.uid] = Decision(p, c, hold, source, now, victims_left={v.uid for v in c.victims})
        self.metrics.preemptions.labels(source).inc()
        self.metrics.preemption_victims.observe(len(c.victims))
        threading.Thread(
            target=self._announce, args=(p, c, hold), name="gpushare-preempt-announce", daemon=True
        ).start()

    def _announce(self, p: Preemptor, c: Candidate, hold: Hold) -> None:
        """The annotation (a restarted extender rebuilds the hold from it) and the events, off the hot path."""
        try:
            # every hold the pod anchors (another writer's too), this one included
            holds = [h for h in self.cache.holds.of(p.key) if h != hold] + [hold]
            self.kube.patch_pod_annotations(p.namespace, p.name, {ANN_HOLDS: encode_holds(holds)})
        except KubeError as exc:
            log.warning("could not record the preemption hold on %s (it holds in this process only): %s", p.key, exc)
        unit = self.unit.value
        freed = c.freed
        gpus = ", ".join(f"GPU {g} ({freed[g]} {unit} freed)" for g in c.gpus)
        victims = ", ".join(v.name for v in c.victims)
        self.events.record(
            p.ref(),
            "GpuSharePreempting",
            f"preempting {len(c.victims)} lower-priority pod(s) on node {c.node} to free {self._need(p)}: {gpus}; "
            f"victims {victims}; the freed memory is held for this pod for {self.hold_seconds:.0f}s",
        )
        for v in c.victims:
            ns, _, name = v.name.partition("/")
            mine = ", ".join(f"GPU {i} ({u} {unit})" for i, u in v.gpus) or "no GPU memory"
            self.events.record(
                {"metadata": {"namespace": ns, "name": name, "uid": v.uid}},
                "GpuSharePreempted",
                f"preempted on node {c.node} for {p.key} (priority {p.priority} over {v.priority}): frees {mine}",
                "Warning",
            )

    def _check_decisions(self, now: float) -> None:
        """Each decision ends with the preemptor bound on its GPUs (success), or counts as evictions that
        did not lead to it within the hold's time; a verb's decision whose victims never started going is
        dropped (kube-scheduler did not carry it out), its hold released."""
        with self._lock:
            decisions = list(self._decisions.values())
        for d in decisions:
            p, c = d.preemptor, d.candidate
            record = self.cache.record(p.key)
            gone = record is None or record.uid != p.uid
            if not gone and record is not None and record.node:
                got = set(record.contribution.indices) if record.contribution is not None else set()
                if record.node == c.node and set(c.gpus) <= got:
                    self.metrics.preemption_outcomes.labels("bound_on_freed_gpus").inc()
                else:
                    self.metrics.preemption_outcomes.labels("bound_elsewhere").inc()
                    self.metrics.preemption_wasted_evictions.inc(len(c.victims))
                self._finish(p)
                continue
            if gone:
                self.metrics.preemption_outcomes.labels("preemptor_deleted").inc()
                self.metrics.preemption_wasted_evictions.inc(len(c.victims))
                self.cache.holds.release(p.key, "preemptor deleted")
                self._finish(p)
                continue
            if not d.verified:
                left = {uid for uid in d.victims_left if self.cache.victim_running(c.node, uid)}
                d.victims_left = left
                d.verified = len(left) < len(c.victims)
                if not d.verified and now - d.decided > self.verify:
                    self.metrics.preemption_outcomes.labels("not_carried_out").inc()
                    log.warning(
                        "preemption for %s on node %s: no victim started terminating in %.0fs; hold released",
                        p.key,
                        c.node,
                        self.verify,
                    )
                    self.cache.holds.release(p.key, "its victims were never evicted")
                    self._clear_annotation(p)
                    self._finish(p)
                    continue
            if now >= d.hold.expires:
                self.metrics.preemption_outcomes.labels("timed_out").inc()
                self.metrics.preemption_wasted_evictions.inc(len(c.victims))
                log.warning(
                    "preemption for %s on node %s: not bound on GPU %s within %.0fs",
                    p.key,
                    c.node,
                    ",".join(map(str, c.gpus)),
                    self.hold_seconds,
                )
                self._finish(p)

    def _clear_annotation(self, p: Preemptor) -> None:
        try:
            self.kube.patch_pod_annotations(p.namespace, p.name, {ANN_HOLDS: None})
        except KubeError as exc:
            log.info("could not clear the hold annotation of %s: %s", p.key, exc)

    def _finish(self, p: Preemptor) -> None:
        with self._lock:
            self._decisions.pop(p.uid, None)

    def pending(self) -> dict[str, Any]:
        """For inspect and tests: notes and decisions under way."""
        with self._lock:
            return {
                "noted": {n.preemptor.key: n.node for n in self._noted.values()},
                "decisions": {
                    d.preemptor.key: {"node": d.candidate.node, "gpus": list(d.candidate.gpus), "source": d.source}
                    for d in self._decisions.values()
                },
            }
