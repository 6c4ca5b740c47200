"""The Kubernetes protobuf wire form of the one object gpushare writes often: a pods/binding.

The API server decodes a protobuf Binding with less CPU than the JSON one (issue 11: ~0.3 ms per pod
of kube-apiserver CPU at 1,000 pods/s), and kube-scheduler itself binds in protobuf. A Binding is
small and flat, so it is encoded here by hand, field numbers as in the upstream .proto files
(k8s.io/api core/v1/generated.proto, k8s.io/apimachinery pkg/apis/meta/v1 and pkg/runtime
generated.proto): nothing generated, nothing to keep in step but these few numbers.

The body the API server reads (k8s.io/apimachinery pkg/runtime/serializer/protobuf) is the 4 magic
bytes ``k8s\\x00`` then a runtime.Unknown message whose `raw` is the versioned object's message.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import UTC
from datetime import datetime
from functools import lru_cache
from typing import Any

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# Field numbers, from the upstream generated.proto files (proto2; every field here is length-delimited).
UNKNOWN_TYPE_META, UNKNOWN_RAW, UNKNOWN_CONTENT_ENCODING, UNKNOWN_CONTENT_TYPE = 1, 2, 3, 4  # runtime.Unknown
TYPE_META_API_VERSION, TYPE_META_KIND = 1, 2  # runtime.TypeMeta
BINDING_METADATA, BINDING_TARGET = 1, 2  # core/v1 Binding
META_NAME, META_NAMESPACE, META_UID, META_ANNOTATIONS = 1, 3, 5, 12  # meta/v1 ObjectMeta
REF_KIND, REF_NAME, REF_API_VERSION = 1, 3, 5  # core/v1 ObjectReference
MAP_KEY, MAP_VALUE = 1, 2  # a map<string, string> entry


_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


def varint(n: int) -> bytes:
    """Base-128, least significant group first (protobuf's varint; lengths are never negative)."""
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2): a string, bytes, a nested message or a map entry."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def text(number: int, value: str) -> bytes:
    """A string field; an empty one is left out (proto2 optional: absent reads as "")."""
    return field(number, value.encode()) if value else b""


def string_map(number: int, entries: Mapping[str, str]) -> bytes:
    """A map<string, string> field: one entry message per key, keys sorted (as Go's marshaller does)."""
    tag, out = varint(number << 3 | 2), []
    for k in sorted(entries):
        key, value = k.encode(), entries[k].encode()
        entry = _KEY_TAG + varint(len(key)) + key + _VALUE_TAG + varint(len(value)) + value
        out += (tag, varint(len(entry)), entry)
    return b"".join(out)


_KEY_TAG, _VALUE_TAG = varint(MAP_KEY << 3 | 2), varint(MAP_VALUE << 3 | 2)


_TARGET_KIND = text(REF_KIND, "Node")
_TARGET_API_VERSION = text(REF_API_VERSION, "v1")


def binding_message(namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None) -> bytes:
    """A core/v1 Binding message: metadata{name, namespace, uid, annotations}, target{kind Node, name, v1}."""
    meta = text(META_NAME, name) + text(META_NAMESPACE, namespace) + text(META_UID, uid)
    if annotations:
        meta += string_map(META_ANNOTATIONS, annotations)
    target = _TARGET_KIND + text(REF_NAME, node) + _TARGET_API_VERSION
    return field(BINDING_METADATA, meta) + field(BINDING_TARGET, target)


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    """The body the API server's protobuf serializer reads: magic, then runtime.Unknown{typeMeta, raw}.

    contentEncoding and contentType are sent empty, as Go's encoder sends them (raw is protobuf)."""
    type_meta = text(TYPE_META_API_VERSION, api_version) + text(TYPE_META_KIND, kind)
    return MAGIC + field(UNKNOWN_TYPE_META, type_meta) + field(UNKNOWN_RAW, raw) + _EMPTY_ENCODING_AND_TYPE


_EMPTY_ENCODING_AND_TYPE = field(UNKNOWN_CONTENT_ENCODING, b"") + field(UNKNOWN_CONTENT_TYPE, b"")
_BINDING_PREFIX = MAGIC + field(UNKNOWN_TYPE_META, text(TYPE_META_API_VERSION, "v1") + text(TYPE_META_KIND, "Binding"))


def binding_body(namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None) -> bytes:
    """The whole protobuf request body of POST .../pods/{name}/binding (`envelope` of a Binding)."""
    raw = binding_message(namespace, name, uid, node, annotations)
    return _BINDING_PREFIX + field(UNKNOWN_RAW, raw) + _EMPTY_ENCODING_AND_TYPE


# -- the pod watch, read in protobuf ------------------------------------------------------------------
#
# kube-scheduler watches pods in protobuf; the API server's watch cache encodes each event once per
# encoding, so a JSON watcher beside it costs a second (JSON) encoding of every pod event. A protobuf
# watch stream (`;stream=watch`) is frames of a 4-byte big-endian length and a meta/v1 WatchEvent
# {type = 1, object = 2: RawExtension{raw = 1}}, raw being the envelope above around the object.
#
# Only what gpushare's cache reads of a pod is decoded (share_scheduler/cache.py: pod_record,
# pod_request and share_core.podresources' CPU and memory), by the protobuf runtime (upb, in C)
# against a schema trimmed to those fields, built here at import from the upstream field numbers
# (fields it lacks are skipped by the parser). The result is a pod dict in the API's JSON shape
# holding only those fields: a "slim" pod.

WATCH_CONTENT_TYPE = "application/vnd.kubernetes.protobuf;stream=watch"


# A field of a schema built at run time: (name, number, kind, message type name); the kind is a scalar
# type (string, bytes, int32), "message", "repeated" (messages) or "map" (map<string, V>: V a message or,
# without a type name, a string).
Field = tuple[str, int, str, str]


def scalar(name: str, number: int, typ: str = "string") -> Field:
    return (name, number, typ, "")


def one(name: str, number: int, type_name: str) -> Field:
    return (name, number, "message", type_name)


def many(name: str, number: int, type_name: str) -> Field:
    return (name, number, "repeated", type_name)


def map_field(name: str, number: int, value_type_name: str = "") -> Field:
    return (name, number, "map", value_type_name)


def build_messages(
    file_name: str, pkg: str, messages: Mapping[str, Sequence[Field]], names: Sequence[str]
) -> dict[str, Any]:
    """The message classes `names` of a proto2 file built at run time: `messages` maps each message's
    name to its fields. Fields the schema lacks are skipped by the parser."""
    from google.protobuf import descriptor_pb2
    from google.protobuf import descriptor_pool
    from google.protobuf import message_factory

    F = descriptor_pb2.FieldDescriptorProto
    scalars = {
        "string": F.TYPE_STRING,
        "bytes": F.TYPE_BYTES,
        "int32": F.TYPE_INT32,
        "int64": F.TYPE_INT64,
        "bool": F.TYPE_BOOL,
    }
    fd = descriptor_pb2.FileDescriptorProto(name=file_name, package=pkg, syntax="proto2")
    for name, fields in messages.items():
        msg = fd.message_type.add(name=name)
        for fname, number, kind, type_name in fields:
            label = F.LABEL_REPEATED if kind in ("repeated", "map") else F.LABEL_OPTIONAL
            if kind == "map":  # a repeated nested entry {key = 1, value = 2}, named as protoc names it
                entry = f"{fname[0].upper()}{fname[1:]}Entry"
                e = msg.nested_type.add(name=entry)
                e.options.map_entry = True
                e.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
                vtype = F.TYPE_MESSAGE if type_name else F.TYPE_STRING
                v = e.field.add(name="value", number=2, type=vtype, label=F.LABEL_OPTIONAL)
                if type_name:
                    v.type_name = f".{pkg}.{type_name}"
                type_name = f"{name}.{entry}"
            f = msg.field.add(name=fname, number=number, type=scalars.get(kind, F.TYPE_MESSAGE), label=label)
            if type_name:
                f.type_name = f".{pkg}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.{n}")) for n in names}


# WatchEvent, Unknown, Pod and Status, with only the fields read here (upstream numbers).
WATCH_SCHEMA: dict[str, tuple[Field, ...]] = {
    # meta/v1 WatchEvent; runtime RawExtension, Unknown, TypeMeta; meta/v1 Status
    "WatchEvent": (scalar("type", 1), one("object", 2, "RawExtension")),
    "RawExtension": (scalar("raw", 1, "bytes"),),
    "Unknown": (one("typeMeta", UNKNOWN_TYPE_META, "TypeMeta"), scalar("raw", UNKNOWN_RAW, "bytes")),
    "TypeMeta": (scalar("apiVersion", TYPE_META_API_VERSION), scalar("kind", TYPE_META_KIND)),
    "Status": (scalar("message", 3), scalar("reason", 4), scalar("code", 6, "int32")),
    # core/v1 Pod, PodSpec, Container, ResourceRequirements, PodStatus; meta/v1 ObjectMeta; resource Quantity
    "Pod": (one("metadata", 1, "ObjectMeta"), one("spec", 2, "PodSpec"), one("status", 3, "PodStatus")),
    "ObjectMeta": (
        scalar("name", META_NAME),
        scalar("namespace", META_NAMESPACE),
        scalar("uid", META_UID),
        scalar("resourceVersion", 6),
        one("creationTimestamp", 8, "Time"),
        one("deletionTimestamp", 9, "Time"),
        map_field("labels", 11),
        map_field("annotations", META_ANNOTATIONS),
        many("ownerReferences", 13, "OwnerReference"),
    ),
    # meta/v1 Time and OwnerReference: whether a pod is terminating, how long it has waited, and who
    # recreates it (preemption, reservations and consolidation, share_core.holds)
    "Time": (scalar("seconds", 1, "int64"), scalar("nanos", 2, "int32")),
    "OwnerReference": (scalar("kind", 1), scalar("name", 3), scalar("uid", 4), scalar("controller", 6, "bool")),
    "PodSpec": (
        many("containers", 2, "Container"),
        scalar("nodeName", 10),
        scalar("schedulerName", 19),
        scalar("priority", 25, "int32"),
        scalar("preemptionPolicy", 31),
        many("initContainers", 20, "Container"),
        map_field("overhead", 32, "Quantity"),
        many("schedulingGates", 38, "PodSchedulingGate"),
        many("resourceClaims", 39, "PodResourceClaim"),
        one("resources", 40, "Resources"),
    ),
    "PodSchedulingGate": (scalar("name", 1),),  # a gated pod is not waiting for room (reservations)
    "PodResourceClaim": (scalar("name", 1), scalar("resourceClaimName", 3), scalar("resourceClaimTemplateName", 4)),
    "Container": (scalar("name", 1), one("resources", 8, "Resources"), scalar("restartPolicy", 24)),
    "Resources": (map_field("limits", 1, "Quantity"), map_field("requests", 2, "Quantity")),
    "Quantity": (scalar("string", 1),),
    # What in-place resize changes (share_core.podresources mirrors how kube-scheduler reads it).
    "PodStatus": (
        scalar("phase", 1),
        many("conditions", 2, "PodCondition"),
        one("startTime", 7, "Time"),
        many("containerStatuses", 8, "ContainerStatus"),
        many("initContainerStatuses", 10, "ContainerStatus"),
        map_field("allocatedResources", 19, "Quantity"),
        one("resources", 20, "Resources"),
    ),
    # status too: a pod kube-scheduler found no room for has PodScheduled False, reason Unschedulable
    # (share_scheduler.waiting.found_unschedulable, which room for what waits follows)
    "PodCondition": (scalar("type", 1), scalar("status", 2), scalar("reason", 5)),
    "ContainerStatus": (
        scalar("name", 1),
        map_field("allocatedResources", 10, "Quantity"),
        one("resources", 11, "Resources"),
    ),
}


def _watch_messages() -> dict[str, Any]:
    """Parsers of WatchEvent, Unknown, Pod and Status."""
    names = ("WatchEvent", "Unknown", "Pod", "Status")
    classes = build_messages("gpushare/kubewire.proto", "gpushare.kubewire", WATCH_SCHEMA, names)
    return {n: c.FromString for n, c in classes.items()}


_WATCH: dict[str, Any] = {}


def _parsers() -> dict[str, Any]:
    if not _WATCH:
        _WATCH.update(_watch_messages())
    return _WATCH


def prepare() -> None:
    """Build the watch decoders (imports protobuf's runtime, ~0.1 s): call before events arrive."""
    _parsers()


def _resources(r: Any) -> dict[str, Any]:
    """A ResourceRequirements; an empty map is left out, as Go's protobuf decoding leaves it nil."""
    out: dict[str, Any] = {}
    if r.limits:
        out["limits"] = {k: q.string for k, q in r.limits.items()}
    if r.requests:
        out["requests"] = {k: q.string for k, q in r.requests.items()}
    return out


def _container(c: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.name, "resources": _resources(c.resources)}
    if c.restartPolicy:
        out["restartPolicy"] = c.restartPolicy
    return out


def _resource_claim(c: Any) -> dict[str, str]:
    out = {"name": c.name}
    for field in ("resourceClaimName", "resourceClaimTemplateName"):
        if getattr(c, field):
            out[field] = getattr(c, field)
    return out


_CONTAINER_KEYS = frozenset(("containers", "initContainers", "overhead", "resources"))


class SlimSpec(dict[str, Any]):
    """A slim pod's spec: nodeName and schedulerName at once, the containers decoded the first time
    anything asks for them (the cache reads them only when a learning policy first sees a pod). `get` and
    `[]` decode for the container keys only; whatever reads every key (`in`, iteration, len, keys, items,
    values, ==, repr) decodes first (those methods are set below the class)."""

    __slots__ = ("_message",)

    def __init__(self, message: Any) -> None:
        super().__init__(nodeName=message.nodeName, schedulerName=message.schedulerName)
        if message.HasField("priority"):
            dict.__setitem__(self, "priority", message.priority)
        if message.preemptionPolicy:
            dict.__setitem__(self, "preemptionPolicy", message.preemptionPolicy)
        if message.schedulingGates:
            dict.__setitem__(self, "schedulingGates", [{"name": g.name} for g in message.schedulingGates])
        if message.resourceClaims:  # a DRA pod: its GPUs are in its claims (the extender learns them at filter)
            dict.__setitem__(self, "resourceClaims", [_resource_claim(c) for c in message.resourceClaims])
        self._message = message

    def _fill(self) -> None:
        message, self._message = self._message, None
        if message is not None:
            dict.__setitem__(self, "containers", [_container(c) for c in message.containers])
            dict.__setitem__(self, "initContainers", [_container(c) for c in message.initContainers])
            if message.overhead:
                dict.__setitem__(self, "overhead", {k: q.string for k, q in message.overhead.items()})
            if message.HasField("resources"):
                dict.__setitem__(self, "resources", _resources(message.resources))

    def get(self, key: str, default: Any = None) -> Any:
        if key in _CONTAINER_KEYS:
            self._fill()
        return dict.get(self, key, default)

    def __getitem__(self, key: str) -> Any:
        if key in _CONTAINER_KEYS:
            self._fill()
        return dict.__getitem__(self, key)

    def __bool__(self) -> bool:  # `pod.get("spec") or {}` must not decode the containers
        return True

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:  # a copy or pickle is a plain dict, whole
        self._fill()
        return (dict, (dict(dict.items(self)),))


def _filled_first(name: str) -> Callable[..., Any]:
    """dict's method `name`, called once the containers are decoded (it sees every key)."""
    plain = getattr(dict, name)

    def method(self: SlimSpec, *args: Any) -> Any:
        self._fill()
        return plain(self, *args)

    method.__name__, method.__qualname__ = name, f"SlimSpec.{name}"
    return method


for _name in ("__contains__", "__iter__", "__len__", "keys", "items", "values", "__eq__", "__repr__"):
    setattr(SlimSpec, _name, _filled_first(_name))


def slim_pod(message: Any) -> dict[str, Any]:
    """The pod dict (JSON shape) holding only what the cache reads."""
    m = message.metadata
    meta = {"name": m.name, "namespace": m.namespace, "uid": m.uid, "resourceVersion": m.resourceVersion}
    if m.annotations:
        meta["annotations"] = dict(m.annotations)
    if m.labels:  # which PodDisruptionBudgets select the pod (preemption)
        meta["labels"] = dict(m.labels)
    if m.HasField("creationTimestamp"):
        meta["creationTimestamp"] = _rfc3339(m.creationTimestamp.seconds)
    if m.HasField("deletionTimestamp"):
        meta["deletionTimestamp"] = _rfc3339(m.deletionTimestamp.seconds)
    if m.ownerReferences:
        meta["ownerReferences"] = [_owner_reference(r) for r in m.ownerReferences]
    pod = {"metadata": meta, "spec": SlimSpec(message.spec)}
    st = message.status
    status: dict[str, Any] = {"phase": st.phase} if st.phase else {}
    if st.conditions:
        status["conditions"] = [{"type": c.type, "status": c.status, "reason": c.reason} for c in st.conditions]
    if st.HasField("startTime"):  # preemption's tie-break among equal victims
        status["startTime"] = _rfc3339(st.startTime.seconds)
    for field in ("containerStatuses", "initContainerStatuses"):
        statuses = getattr(st, field)
        if statuses:
            status[field] = [_container_status(cs) for cs in statuses]
    if st.allocatedResources:
        status["allocatedResources"] = {k: q.string for k, q in st.allocatedResources.items()}
    if st.HasField("resources"):
        status["resources"] = _resources(st.resources)
    if status:
        pod["status"] = status
    return pod


@lru_cache(maxsize=4096)
def _rfc3339(seconds: int) -> str:
    """A meta/v1 Time as the JSON API writes it (whole seconds, UTC). Memoised: a burst's pods share a few
    seconds, and formatting was a tenth of decoding an event."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner_reference(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": r.kind, "name": r.name, "uid": r.uid}
    if r.HasField("controller"):
        out["controller"] = r.controller
    return out


def _container_status(cs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": cs.name}
    if cs.allocatedResources:
        out["allocatedResources"] = {k: q.string for k, q in cs.allocatedResources.items()}
    if cs.HasField("resources"):
        out["resources"] = _resources(cs.resources)
    return out


def decode_watch_event(frame: bytes) -> tuple[str, dict[str, Any]]:
    """(type, object) of one frame of a protobuf pod watch: a slim pod, or for ERROR a Status dict
    ({"kind": "Status", "code", "reason", "message"}). Raises ValueError for what is not a frame."""
    p = _parsers()
    try:
        event = p["WatchEvent"](frame)
        raw = event.object.raw
        if raw[:4] != MAGIC:
            raise ValueError("a watch event's object without the protobuf envelope")
        unknown = p["Unknown"](raw[4:])
        if event.type == "ERROR" or unknown.typeMeta.kind == "Status":
            st = p["Status"](unknown.raw)
            return event.type, {"kind": "Status", "code": st.code, "reason": st.reason, "message": st.message}
        return event.type, slim_pod(p["Pod"](unknown.raw))
    except Exception as exc:  # google.protobuf.message.DecodeError and the like
        if isinstance(exc, ValueError) and "envelope" in str(exc):
            raise
        raise ValueError(f"not a protobuf watch event: {exc}") from exc


def split_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """The whole length-prefixed frames at the start of `data`, and the rest (a frame still coming)."""
    frames, i, n = [], 0, len(data)
    while n - i >= 4:
        size = int.from_bytes(data[i : i + 4], "big")
        if n - i - 4 < size:
            break
        frames.append(data[i + 4 : i + 4 + size])
        i += 4 + size
    return frames, data[i:]
