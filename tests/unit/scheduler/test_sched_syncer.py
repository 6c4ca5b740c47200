"""The syncer's first lists run without automatic garbage collection, and only those."""

from __future__ import annotations

import gc
import threading

import pytest

from share_core.fake import FakeKube
from share_core.kube import Unavailable
from share_scheduler.cache import ClusterCache
from share_scheduler.syncer import Syncer
from share_scheduler.syncer import collection_paused
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod


@pytest.fixture(autouse=True)
def gc_restored():
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_pause_nests_across_threads_and_ends_on_errors():
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with collection_paused():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=other)
    t.start()
    entered.wait(5)
    with pytest.raises(RuntimeError), collection_paused():
        assert not gc.isenabled()
        raise RuntimeError("a list that failed")
    assert not gc.isenabled(), "the other thread's list is still being parsed"
    release.set()
    t.join(5)
    assert gc.isenabled()


def test_first_sync_pauses_then_settles_later_lists_do_not_pause():
    kube = FakeKube()
    kube.add_node(make_node("n0", [16]))
    kube.add_pod(make_pod("p", 4))
    seen: list[bool] = []
    cache = ClusterCache()
    original = cache.replace_pods

    def replace_pods(pods):  # what the collector's state is while the pod list is applied
        seen.append(gc.isenabled())
        original(pods)

    cache.replace_pods = replace_pods  # type: ignore[method-assign]
    syncer = Syncer(kube, cache)
    syncer.sync_once("nodes")
    syncer.sync_once("pods")
    assert seen == [False] and cache.synced
    assert gc.isenabled() and gc.get_threshold()[0] >= 10_000, "settled: collection back on, rarer"
    syncer.sync_once("pods")
    assert seen == [False, True]


def test_a_failed_first_list_turns_collection_back_on():
    kube = FakeKube()
    kube.fail("list_nodes", Unavailable("API server down"))
    syncer = Syncer(kube, ClusterCache())
    with pytest.raises(Unavailable):
        syncer.sync_once("nodes")
    assert gc.isenabled()


def test_cache_tells_the_largest_gpu_only_when_it_changes() -> None:
    cache = ClusterCache()
    told: list[int] = []
    cache.set_largest_gpu_observer(told.append)
    cache.replace_nodes([make_node("t4", [16, 16]), make_node("a100", [80, 40])])
    cache.upsert_node(make_node("l4", [24]))  # smaller than the largest: nothing to tell
    cache.upsert_node(make_node("a100", [40, 40]))  # the node's 80 GiB GPU is gone
    cache.replace_nodes([make_node("l4", [24])])  # a relist without the others
    cache.delete_node("l4")
    assert told == [0, 80, 40, 24, 0]
    assert cache.largest_gpu == 0
