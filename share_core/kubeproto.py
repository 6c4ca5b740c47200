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

from collections.abc import Mapping

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
