"""Memory held for a pod that is not bound yet: the one notion behind preemption, reservations and
consolidation.

When the scheduler side frees or sets aside GPU memory for one pod (the holder), that memory must not
be taken by the next small pod in kube-scheduler's queue before the holder is bound. A `Hold` names the
holder, a node, the GPUs on it and the units held on each; filter counts it as taken for every other pod
it applies to:

- PREEMPTION (memory freed by evicting victims for a preemptor): pods of the SAME OR LOWER priority, as
  kube-scheduler counts a nominated pod against every pod of no higher priority (addGENominatedPods,
  pkg/scheduler/framework/runtime/framework.go: nominated pods of priority >= the pod's are added), so
  two preemptors of one priority do not take each other's freed GPU.
- RESERVATION (memory set aside for a pod that has waited too long) and CONSOLIDATION (the GPUs a
  consolidation plan gives to the waiting pod and to the pods it moves): pods of the SAME OR LOWER
  priority, so a waiting pod is not passed by its peers either.

The holder never sees its own hold as taken; nor does a pod of `owner_uid` (the controller that
recreates a pod consolidation moved: the replacement has a new name and UID, only its owner is known).

Holds live on the API server, in the annotation `gpushare.io/holds` of the pod they were made for (the
anchor): a JSON list, so a restarted extender (or the other replica after a fail-over) rebuilds them;
each carries its own expiry, so a hold can never outlive its bound time whatever happens to the writer.
Everything here is pure: the extender's `share_scheduler.holds.HoldBook` and share-sim use it alike.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime
from typing import Any

from share_core.contract import ANN_HOLDS

Pod = Mapping[str, Any]

DEFAULT_PRIORITY = 0  # a pod without spec.priority (no PriorityClass, admission off): corev1helpers.PodPriority
PREEMPT_NEVER = "Never"  # spec.preemptionPolicy that forbids preempting for the pod
PREEMPT_LOWER = "PreemptLowerPriority"  # the default (k8s.io/api core/v1 PreemptionPolicy)
MAX_HOLDS_PER_POD = 64  # an annotation naming more is refused, not half-read


class HoldKind(enum.StrEnum):
    PREEMPTION = "preemption"
    RESERVATION = "reservation"
    CONSOLIDATION = "consolidation"


class InvalidHolds(ValueError):
    """An annotation that does not describe holds; the message names the pod and the problem."""


@dataclass(frozen=True, slots=True)
class Hold:
    """`per_gpu` units on each GPU of `gpus` (indices on `node`) kept for `holder_uid` until `expires`."""

    kind: HoldKind
    node: str
    gpus: tuple[int, ...]
    per_gpu: int
    priority: int
    expires: float  # seconds since the epoch
    holder_uid: str
    holder: str = ""  # namespace/name, for people (events, inspect, logs)
    owner_uid: str = ""  # a controller whose (re)created pods may use it too (consolidation)
    # A reservation's node when it was (re)made: its GPUs short of the pod's demand and the units still to
    # drain on them (share_placement.starvation.shortfall). It is renewed only while the node drains below
    # that; None (an older extender's hold) is never renewed.
    shortfall: tuple[int, int] | None = None

    def applies_to(self, priority: int, uid: str, owner_uid: str = "") -> bool:
        """Whether a pod of `priority` (its `uid`, its controller's `owner_uid`) must see this as taken."""
        if uid and uid == self.holder_uid:
            return False
        if owner_uid and owner_uid == self.owner_uid:
            return False
        return priority <= self.priority

    def expired(self, now: float) -> bool:
        return now >= self.expires

    def describe(self, unit: str = "") -> str:
        gpus = ",".join(str(g) for g in self.gpus)
        amount = f"{self.per_gpu}{' ' + unit if unit else ''}"
        return f"{self.kind} hold of {amount} on GPU {gpus} of node {self.node} for {self.holder or self.holder_uid}"


# -- what a pod says about itself ----------------------------------------------------------------------


def pod_priority(pod: Pod) -> int:
    """spec.priority, set by the Priority admission plugin from the PriorityClass; absent reads as 0, as
    kube-scheduler's corev1helpers.PodPriority does."""
    value = (pod.get("spec") or {}).get("priority")
    if isinstance(value, bool) or not isinstance(value, int):
        return DEFAULT_PRIORITY
    return value


def may_preempt(pod: Pod) -> bool:
    """False for `preemptionPolicy: Never` (DefaultPreemption's PodEligibleToPreemptOthers)."""
    return (pod.get("spec") or {}).get("preemptionPolicy") != PREEMPT_NEVER


def pod_controller_uid(pod: Pod) -> str:
    """The UID of the owner reference marked `controller: true` (the one that recreates the pod), or ""."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("uid") or "")
    return ""


def pod_is_terminating(pod: Pod) -> bool:
    """Deleted but still running its grace period: its memory is not free until it is gone."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


# -- the annotation ---------------------------------------------------------------------------------


def rfc3339(ts: float) -> str:
    """Seconds since the epoch as RFC 3339, UTC, whole seconds (the annotations' times)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any, where: str) -> float:
    if not isinstance(text, str):
        raise InvalidHolds(f"{where}: 'expires' must be an RFC 3339 time, got {text!r}")
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidHolds(f"{where}: 'expires' is not an RFC 3339 time: {text!r}") from None
    if stamp.tzinfo is None:
        raise InvalidHolds(f"{where}: 'expires' needs a time zone (e.g. a trailing Z): {text!r}")
    return stamp.timestamp()


def encode_holds(holds: Iterable[Hold]) -> str:
    """The annotation value: a JSON list, one object per hold, expiry rounded up to the second."""
    out = []
    for h in holds:
        entry: dict[str, Any] = {
            "kind": str(h.kind),
            "node": h.node,
            "gpus": list(h.gpus),
            "perGpu": h.per_gpu,
            "priority": h.priority,
            "expires": rfc3339(math.ceil(h.expires)),
            "holderUID": h.holder_uid,
        }
        if h.holder:
            entry["holder"] = h.holder
        if h.owner_uid:
            entry["ownerUID"] = h.owner_uid
        if h.shortfall is not None:
            entry["shortfall"] = list(h.shortfall)
        out.append(entry)
    return json.dumps(out, separators=(",", ":"))


def _whole(entry: Mapping[str, Any], key: str, where: str, minimum: int | None = 0) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidHolds(f"{where}: {key!r} must be a whole number, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidHolds(f"{where}: {key!r} must be at least {minimum}, got {value}")
    return value


def parse_holds(text: str, where: str = ANN_HOLDS) -> list[Hold]:
    """The holds an annotation value describes; InvalidHolds naming the problem for anything else
    (nothing is half-read: one bad entry refuses the whole annotation)."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidHolds(f"{where}: not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise InvalidHolds(f"{where}: expected a JSON list of holds, got {type(doc).__name__}")
    if len(doc) > MAX_HOLDS_PER_POD:
        raise InvalidHolds(f"{where}: {len(doc)} holds, at most {MAX_HOLDS_PER_POD} allowed")
    holds = []
    for i, entry in enumerate(doc):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise InvalidHolds(f"{at}: expected an object, got {type(entry).__name__}")
        try:
            kind = HoldKind(entry.get("kind"))
        except ValueError:
            choices = ", ".join(k.value for k in HoldKind)
            raise InvalidHolds(f"{at}: 'kind' must be one of {choices}, got {entry.get('kind')!r}") from None
        node = entry.get("node")
        if not isinstance(node, str) or not node:
            raise InvalidHolds(f"{at}: 'node' must name a node, got {node!r}")
        gpus = entry.get("gpus")
        if not isinstance(gpus, list) or not gpus:
            raise InvalidHolds(f"{at}: 'gpus' must be a non-empty list of GPU indices, got {gpus!r}")
        indices = tuple(_whole({"gpus": g}, "gpus", at) for g in gpus)
        if len(set(indices)) != len(indices):
            raise InvalidHolds(f"{at}: 'gpus' names a GPU twice: {gpus!r}")
        holder_uid = entry.get("holderUID")
        if not isinstance(holder_uid, str) or not holder_uid:
            raise InvalidHolds(f"{at}: 'holderUID' must be the UID of the pod it is held for, got {holder_uid!r}")
        holds.append(
            Hold(
                kind=kind,
                node=node,
                gpus=indices,
                per_gpu=_whole(entry, "perGpu", at, minimum=1),
                priority=_whole(entry, "priority", at, minimum=None),
                expires=_parse_time(entry.get("expires"), at),
                holder_uid=holder_uid,
                holder=str(entry.get("holder") or ""),
                owner_uid=str(entry.get("ownerUID") or ""),
                shortfall=_shortfall(entry.get("shortfall"), at),
            )
        )
    return holds


def _shortfall(value: Any, where: str) -> tuple[int, int] | None:
    """`[GPUs short, units to drain]` or absent."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise InvalidHolds(f"{where}: 'shortfall' must be [GPUs short, units to drain], got {value!r}")
    short, drain = (_whole({"shortfall": v}, "shortfall", where) for v in value)
    return short, drain


def pod_holds(pod: Pod) -> list[Hold]:
    """The holds a pod's annotation records ([] without one); InvalidHolds for a garbled one."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANN_HOLDS)
    if not text:
        return []
    meta = pod.get("metadata") or {}
    return parse_holds(text, f"pod {meta.get('namespace', 'default')}/{meta.get('name', '')}: {ANN_HOLDS}")


# -- what holds take from whom ----------------------------------------------------------------------


def reservations_yield(
    gpu_count: int, min_gpus: int, waited_s: float, yield_after_s: float | None, found_no_room: bool = True
) -> bool:
    """Whether RESERVATION holds yield to a pod: it asks fewer than `min_gpus` GPUs (the pods reservations
    are not made for), kube-scheduler already found no room for it, and it has waited strictly longer than
    `yield_after_s` (None: reservations never yield).

    Why: at critical load the reserved GPUs are the room a small pod would take when nothing else is free,
    so a hold that never yields makes small pods wait as long as it stands (docs/simulator.md measures
    it). Until its first try a pod always sees the holds: they redirect it to the rest of the cluster, which
    is what keeps small pods off a draining node while anything else fits; only a pod that found nothing
    else and has waited past the bound takes the held room."""
    return yield_after_s is not None and gpu_count < min_gpus and found_no_room and waited_s > yield_after_s


def held_units(
    holds: Iterable[Hold],
    priority: int,
    uid: str,
    owner_uid: str = "",
    now: float | None = None,
    yielded: bool = False,
) -> dict[str, dict[int, int]]:
    """node -> GPU index -> units a pod (its priority, UID, controller) must see as taken by holds that
    are not its own; expired holds (when `now` is given) take nothing, nor do reservations when they
    yield to the pod (`yielded`: `reservations_yield`)."""
    out: dict[str, dict[int, int]] = {}
    for h in holds:
        if (now is not None and h.expired(now)) or not h.applies_to(priority, uid, owner_uid):
            continue
        if yielded and h.kind is HoldKind.RESERVATION:
            continue
        per_node = out.setdefault(h.node, {})
        for g in h.gpus:
            per_node[g] = per_node.get(g, 0) + h.per_gpu
    return out


def after_bind(holds: Iterable[Hold], uid: str) -> list[Hold]:
    """The holds left once the pod `uid` (their anchor) is bound: its own go wherever they were (it has
    its GPUs now, or chose elsewhere); those it carries for the pods a consolidation moves stay."""
    return [h for h in holds if h.holder_uid != uid]


def after_replacement_bound(holds: Iterable[Hold], uid: str, owner_uid: str, node: str) -> list[Hold]:
    """The holds left once a pod (`uid`, of controller `owner_uid`) is newly bound to `node`: one hold kept
    there for that controller's pods (a consolidation's moved pod, recreated and placed again) is used
    up. Never one made for this very pod: that is the moved pod itself, still bound while its eviction
    goes through, and its hold is for the replacement to come."""
    if not owner_uid:
        return list(holds)
    left: list[Hold] = []
    used = False
    for h in holds:
        if not used and h.owner_uid == owner_uid and h.node == node and h.holder_uid != uid:
            used = True
            continue
        left.append(h)
    return left
