"""The Event queue: record() never waits on the API server; a full queue drops and counts."""

from __future__ import annotations

import threading
import time

from share_core.events import EventQueue
from share_core.fake import FakeKube
from share_core.kube import Unavailable

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}


def test_events_are_posted_in_order():
    kube = FakeKube()
    q = EventQueue(kube)
    for i in range(5):
        assert q.record(POD, "Reason", f"message {i}")
    assert q.flush(5)
    assert [e["message"] for e in kube.events] == [f"message {i}" for i in range(5)]
    assert (q.sent, q.dropped, q.failed) == (5, 0, 0)


def test_a_slow_api_server_never_blocks_record_and_overflow_is_counted():
    kube = FakeKube()
    release = threading.Event()
    kube.create_event = lambda *a, **k: release.wait(5)  # type: ignore[method-assign]
    drops = []
    q = EventQueue(kube, capacity=3, on_drop=lambda: drops.append(1))
    start = time.monotonic()
    accepted = [q.record(POD, "Reason", str(i)) for i in range(10)]
    assert time.monotonic() - start < 0.5
    # One is being posted, three wait in the queue, the rest are dropped.
    assert accepted.count(True) in (3, 4) and q.dropped == len(drops) == accepted.count(False)
    release.set()
    assert q.flush(5)


def test_api_errors_are_counted_and_the_poster_lives_on():
    kube = FakeKube()
    kube.fail("create_event", Unavailable("HTTP 503", 503))
    errors = []
    q = EventQueue(kube, on_error=lambda: errors.append(1))
    q.record(POD, "First", "lost")
    q.record(POD, "Second", "kept")
    assert q.flush(5)
    assert q.failed == len(errors) == 1 and q.sent == 1
    assert [e["reason"] for e in kube.events] == ["Second"]
