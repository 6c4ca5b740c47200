"""ApiServerClient's watch stream: events split across reads at any byte, many per read, and the
API server's ERROR event, against a loopback server that writes the stream in the chunks we choose."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from share_core.kube import Gone
from tests.unit.core.streamserver import StreamServer
from tests.unit.core.streamserver import serving
from tests.unit.core.streamserver import watcher


def pod_event(kind: str, i: int) -> bytes:
    pod = {"metadata": {"name": f"p{i}", "namespace": "default", "annotations": {"note": "x" * (i * 37 % 300)}}}
    return json.dumps({"type": kind, "object": pod}).encode() + b"\n"


@pytest.fixture
def stream_server() -> Iterator[StreamServer]:
    with serving("application/json") as server:
        yield server


@pytest.mark.parametrize("cut", [1, 7, 64, 333, 4096, 1 << 20])
def test_events_arrive_whole_whatever_the_reads(stream_server, cut):
    stream = b"".join(pod_event("ADDED" if i % 3 else "MODIFIED", i) for i in range(60))
    stream = stream.replace(b"\n", b"\n\n", 5)  # blank lines between events are skipped
    stream_server.pieces = [stream[i : i + cut] for i in range(0, len(stream), cut)]
    events = list(watcher(stream_server).watch_pods("1", timeout_seconds=5))
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("ADDED" if i % 3 else "MODIFIED", f"p{i}") for i in range(60)
    ]
    assert all(len(e.object["metadata"]["annotations"]["note"]) == i * 37 % 300 for i, e in enumerate(events))


def test_error_event_raises_after_the_events_before_it(stream_server):
    gone = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}).encode()
    stream_server.pieces = [
        pod_event("ADDED", 0) + pod_event("ADDED", 1)[:10],
        pod_event("ADDED", 1)[10:] + gone + b"\n",
    ]
    seen = []
    with pytest.raises(Gone):
        for ev in watcher(stream_server).watch_pods("1", timeout_seconds=5):
            seen.append(ev.object["metadata"]["name"])
    assert seen == ["p0", "p1"]
