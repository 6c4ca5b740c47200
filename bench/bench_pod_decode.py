"""Python CPU to decode one pod watch event: orjson of the JSON stream against two protobuf decoders.

Issue 11's gate for a protobuf pod watch in the extender: it is only worth it if reading what the
cache needs (share_scheduler/cache.py: name, namespace, uid, resourceVersion, annotations, nodeName,
schedulerName, containers' and init containers' name, restartPolicy and resources, phase) from the
protobuf event costs no more Python CPU than orjson.loads of the JSON event.

Real events from a real kube-apiserver: two watches, JSON and protobuf (`;stream=watch`: 4-byte
length, a meta/v1 WatchEvent whose object is a RawExtension holding the `k8s\\x00` envelope), while
N pods are created, bound (with the extender's annotations) and deleted. Decoders timed per event:
  orjson     orjson.loads of the line (the whole pod, every field: what the extender does today)
  hand       pure Python: walks the wire format, skips every field it does not need
  upb        google.protobuf (upb, C) with a trimmed schema built at run time (only the needed fields,
             field numbers from the upstream .proto), then the same fields into a dict
  upb-rec    upb, only what pod_record reads of every event (no containers: those are read once per
             pod, when a learning policy first sees it)
All are checked to agree on every needed field before timing.

  python bench/bench_pod_decode.py            # 20 pods: 60 events
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from google.protobuf.internal import api_implementation  # noqa: E402

from share_core import kubeproto  # noqa: E402
from share_core.assignment import Assignment  # noqa: E402
from share_core.contract import RESOURCE_MEM  # noqa: E402
from share_core.kube import ApiServerClient  # noqa: E402
from share_core.kubeproto import build_messages  # noqa: E402
from share_core.kubeproto import many  # noqa: E402
from share_core.kubeproto import map_field  # noqa: E402
from share_core.kubeproto import one  # noqa: E402
from share_core.kubeproto import scalar  # noqa: E402
from share_core.request import InvalidRequest  # noqa: E402
from share_core.request import pod_request  # noqa: E402
from share_scheduler.nodes import pod_record  # noqa: E402
from tests.controlplane.barenodes import gpu_pod  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402

NAMESPACE = "bench-decode"
Pod = dict[str, Any]

# --------------------------------------------------------------------------- hand decoder (pure Python)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return result, i
        shift += 7


def _walk(buf: bytes, i: int, end: int, wanted: frozenset[int]) -> dict[int, list[tuple[int, int]]]:
    """Spans of the length-delimited fields numbered in `wanted`; every other field is skipped."""
    out: dict[int, list[tuple[int, int]]] = {}
    while i < end:
        key = buf[i]
        if key < 0x80:  # one byte: field numbers up to 15
            i += 1
        else:
            key, i = _varint(buf, i)
        wire = key & 7
        if wire == 2:
            n = buf[i]
            if n < 0x80:
                i += 1
            else:
                n, i = _varint(buf, i)
            if key >> 3 in wanted:
                out.setdefault(key >> 3, []).append((i, i + n))
            i += n
        elif wire == 0:
            while buf[i] >= 0x80:
                i += 1
            i += 1
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
    return out


def _text(buf: bytes, f: dict[int, list[tuple[int, int]]], num: int) -> str:
    spans = f.get(num)
    return buf[spans[-1][0] : spans[-1][1]].decode() if spans else ""


def _hand_map(buf: bytes, spans: list[tuple[int, int]] | None, quantity: bool) -> dict[str, str]:
    out = {}
    for a, b in spans or ():
        entry = _walk(buf, a, b, frozenset((1, 2)))
        value = entry.get(2)
        if quantity and value:  # map<string, Quantity{string = 1}>
            out[_text(buf, entry, 1)] = _text(buf, _walk(buf, value[-1][0], value[-1][1], frozenset((1,))), 1)
        else:
            out[_text(buf, entry, 1)] = _text(buf, entry, 2)
    return out


def _hand_container(buf: bytes, a: int, b: int) -> dict[str, Any]:
    f = _walk(buf, a, b, frozenset((1, 8, 24)))  # name, resources, restartPolicy
    c: dict[str, Any] = {"name": _text(buf, f, 1)}
    r = f.get(8)
    if r:
        rf = _walk(buf, r[-1][0], r[-1][1], frozenset((1, 2)))
        c["resources"] = {"limits": _hand_map(buf, rf.get(1), True), "requests": _hand_map(buf, rf.get(2), True)}
    if 24 in f:
        c["restartPolicy"] = _text(buf, f, 24)
    return c


def hand_event(frame: bytes) -> tuple[str, Pod]:
    f = _walk(frame, 0, len(frame), frozenset((1, 2)))  # WatchEvent{type, object}
    a, b = _walk(frame, *f[2][-1], frozenset((1,)))[1][-1]  # RawExtension.raw: the envelope
    a, b = _walk(frame, a + 4, b, frozenset((2,)))[2][-1]  # Unknown.raw: the Pod
    p = _walk(frame, a, b, frozenset((1, 2, 3)))
    m = _walk(frame, *p[1][-1], frozenset((1, 3, 5, 6, 12)))
    s = _walk(frame, *p[2][-1], frozenset((2, 10, 19, 20)))
    st = _walk(frame, *p[3][-1], frozenset((1,))) if 3 in p else {}
    meta = {"name": _text(frame, m, 1), "namespace": _text(frame, m, 3), "uid": _text(frame, m, 5)}
    meta["resourceVersion"] = _text(frame, m, 6)
    meta["annotations"] = _hand_map(frame, m.get(12), False)
    spec = {"nodeName": _text(frame, s, 10), "schedulerName": _text(frame, s, 19)}
    spec["containers"] = [_hand_container(frame, a, b) for a, b in s.get(2, ())]
    spec["initContainers"] = [_hand_container(frame, a, b) for a, b in s.get(20, ())]
    return _text(frame, f, 1), {"metadata": meta, "spec": spec, "status": {"phase": _text(frame, st, 1)}}


# --------------------------------------------------------------------------- upb with a trimmed schema

_PKG = "gpushare.bench.kubewire"


def _trimmed_messages() -> dict[str, Any]:
    """WatchEvent, Unknown and Pod with only the fields the cache reads (numbers from upstream)."""
    schema = {
        "WatchEvent": (scalar("type", 1), one("object", 2, "RawExtension")),
        "RawExtension": (scalar("raw", 1, "bytes"),),
        "Unknown": (scalar("raw", 2, "bytes"),),
        "Pod": (one("metadata", 1, "ObjectMeta"), one("spec", 2, "PodSpec"), one("status", 3, "PodStatus")),
        "ObjectMeta": (
            scalar("name", 1),
            scalar("namespace", 3),
            scalar("uid", 5),
            scalar("resourceVersion", 6),
            map_field("annotations", 12),
        ),
        "PodSpec": (
            many("containers", 2, "Container"),
            scalar("nodeName", 10),
            scalar("schedulerName", 19),
            many("initContainers", 20, "Container"),
        ),
        "Container": (scalar("name", 1), one("resources", 8, "Resources"), scalar("restartPolicy", 24)),
        "Resources": (map_field("limits", 1, "Quantity"), map_field("requests", 2, "Quantity")),
        "Quantity": (scalar("string", 1),),
        "PodStatus": (scalar("phase", 1),),
    }
    return build_messages("gpushare/bench-kubewire.proto", _PKG, schema, ("WatchEvent", "Unknown", "Pod"))


_MSG = _trimmed_messages()
_WATCH_EVENT, _UNKNOWN, _POD = (_MSG[n].FromString for n in ("WatchEvent", "Unknown", "Pod"))


def _upb_container(c: Any) -> dict[str, Any]:
    r = c.resources
    limits, requests = r.limits, r.requests
    out: dict[str, Any] = {
        "name": c.name,
        "resources": {  # only our resource: all the cache reads of them
            "limits": {RESOURCE_MEM: limits[RESOURCE_MEM].string} if RESOURCE_MEM in limits else {},
            "requests": {RESOURCE_MEM: requests[RESOURCE_MEM].string} if RESOURCE_MEM in requests else {},
        },
    }
    if c.restartPolicy:
        out["restartPolicy"] = c.restartPolicy
    return out


def upb_event(frame: bytes) -> tuple[str, Pod]:
    ev = _WATCH_EVENT(frame)
    p = _POD(_UNKNOWN(ev.object.raw[4:]).raw)
    m, s = p.metadata, p.spec
    meta = {"name": m.name, "namespace": m.namespace, "uid": m.uid, "resourceVersion": m.resourceVersion}
    meta["annotations"] = dict(m.annotations)
    spec = {"nodeName": s.nodeName, "schedulerName": s.schedulerName}
    spec["containers"] = [_upb_container(c) for c in s.containers]
    spec["initContainers"] = [_upb_container(c) for c in s.initContainers]
    return ev.type, {"metadata": meta, "spec": spec, "status": {"phase": p.status.phase}}


def upb_event_record(frame: bytes) -> tuple[str, Pod]:
    """upb, without the containers: what the cache reads of every event (pod_record); the containers
    (pod_request) are read only the first time a learning policy sees a pod."""
    ev = _WATCH_EVENT(frame)
    p = _POD(_UNKNOWN(ev.object.raw[4:]).raw)
    m = p.metadata
    meta = {"name": m.name, "namespace": m.namespace, "uid": m.uid, "resourceVersion": m.resourceVersion}
    meta["annotations"] = dict(m.annotations)
    return ev.type, {"metadata": meta, "spec": {"nodeName": p.spec.nodeName}, "status": {"phase": p.status.phase}}


# --------------------------------------------------------------------------- capture and compare


def needed(kind: str, pod: Pod) -> tuple[Any, ...]:
    """What the cache reads, in one comparable value (resources: only our resource)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}

    def containers(key: str) -> list[tuple[Any, ...]]:
        out = []
        for c in spec.get(key) or []:
            r = c.get("resources") or {}
            lim, req = r.get("limits") or {}, r.get("requests") or {}
            out.append((c.get("name"), c.get("restartPolicy"), lim.get(RESOURCE_MEM), req.get(RESOURCE_MEM)))
        return out

    return (
        kind,
        *(meta.get(k, "") for k in ("name", "namespace", "uid", "resourceVersion")),
        meta.get("annotations") or {},
        spec.get("nodeName", ""),
        spec.get("schedulerName", ""),
        containers("containers"),
        containers("initContainers"),
        (pod.get("status") or {}).get("phase", ""),
    )


def capture(pods: int) -> tuple[list[bytes], list[bytes]]:
    """(JSON lines, protobuf frames) of the same events: create, bind, delete of `pods` pods."""
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as work, ControlPlane(work, k8s_bin_dir()) as cp:
        admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component="bench-decode")
        admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        rv = admin.request("GET", "/api/v1/pods", query={"limit": 1})["metadata"]["resourceVersion"]
        streams: dict[str, bytes] = {}

        def watch(accept: str) -> None:
            headers = admin._headers()
            headers["Accept"] = accept
            url = f"{admin.host}/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds={5 + pods // 10}"
            streams[accept] = admin._pool.request("GET", url, headers=headers, preload_content=False).read()

        accepts = ("application/json", "application/vnd.kubernetes.protobuf;stream=watch")
        threads = [threading.Thread(target=watch, args=(a,)) for a in accepts]
        for t in threads:
            t.start()
        time.sleep(1.0)
        for i in range(pods):
            name = f"p{i:04d}"
            body = gpu_pod(NAMESPACE, name, "gpushare-scheduler", 1 + i % 8)
            if i % 5 == 4:  # a few with an init container and a sidecar, as some real pods have
                body["spec"]["initContainers"] = [
                    {"name": "init", "image": "none", "resources": {"limits": {RESOURCE_MEM: "2"}}},
                    {"name": "side", "image": "none", "restartPolicy": "Always"},
                ]
            pod = admin.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)
            ann = Assignment((i % 8,), (f"GPU-node-1-{i % 8}",), 1 + i % 8, time.time_ns()).to_annotations()
            admin.bind_pod(NAMESPACE, name, pod["metadata"]["uid"], "node-1", ann)
            admin.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        for t in threads:
            t.join()
    lines = [line for line in streams[accepts[0]].split(b"\n") if line.strip()]
    data, frames, i = streams[accepts[1]], [], 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        frames.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return lines, frames


def pod_request_or_none(pod: Pod) -> Any:
    try:
        return pod_request(pod)
    except InvalidRequest:
        return None


def per_event_us(fn: Callable[[bytes], Any], items: list[bytes], seconds: float = 1.0) -> float:
    number = max(1, int(seconds / max(1e-9, timeit.timeit(lambda: [fn(x) for x in items], number=1))))
    best = min(timeit.repeat(lambda: [fn(x) for x in items], number=number, repeat=5))
    return best / number / len(items) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=20)
    args = ap.parse_args()
    lines, frames = capture(args.pods)
    assert len(lines) == len(frames) >= 3 * args.pods, (len(lines), len(frames))
    for line, frame in zip(lines, frames, strict=True):
        ev = orjson.loads(line)
        want = needed(ev["type"], ev["object"])
        assert needed(*hand_event(frame)) == want, (needed(*hand_event(frame)), want)
        assert needed(*upb_event(frame)) == want, (needed(*upb_event(frame)), want)
        record = needed(*upb_event_record(frame))
        assert record[:7] == want[:7] and record[-1] == want[-1]  # up to nodeName, and phase
    print(f"{len(lines)} events of {args.pods} pods (created, bound, deleted); protobuf: {api_implementation.Type()}")
    mean_json, mean_proto = sum(map(len, lines)) / len(lines), sum(map(len, frames)) / len(frames)
    print(f"mean size: JSON {mean_json:.0f} B, protobuf {mean_proto:.0f} B")
    base = per_event_us(orjson.loads, lines)
    print(f"{'decoder':8s} {'us/event':>9s} {'vs orjson':>10s}")
    print(f"{'orjson':8s} {base:9.2f} {1:10.2f}")
    for name, fn in (("hand", hand_event), ("upb", upb_event), ("upb-rec", upb_event_record)):
        us = per_event_us(fn, frames)
        print(f"{name:8s} {us:9.2f} {us / base:10.2f}")
    # What the extender does per event (decode, then the cache's pod_record), and once per pod for a
    # learning policy (pod_request too): JSON today against share_core.kubeproto's slim pods.
    json_rec = per_event_us(lambda line: pod_record(orjson.loads(line)["object"]), lines)
    slim_rec = per_event_us(lambda f: pod_record(kubeproto.decode_watch_event(f)[1]), frames)
    json_req = per_event_us(lambda line: pod_request_or_none(orjson.loads(line)["object"]), lines)
    slim_req = per_event_us(lambda f: pod_request_or_none(kubeproto.decode_watch_event(f)[1]), frames)
    print(f"decode + pod_record:  orjson {json_rec:.2f} us, slim {slim_rec:.2f} us ({slim_rec / json_rec:.2f})")
    print(f"decode + pod_request: orjson {json_req:.2f} us, slim {slim_req:.2f} us ({slim_req / json_req:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
