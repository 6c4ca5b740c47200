"""ObservedClasses: the learned table is rebuilt once the counts have grown by TABLE_REFRESH, or when the
policy calls it stale, and only once however many readers race for it."""

from __future__ import annotations

import threading

from share_placement.workload import TABLE_REFRESH
from share_placement.workload import ClassKey
from share_placement.workload import ObservedClasses

SHARE: ClassKey = (4, 1, (), 2)
WHOLE: ClassKey = (16, 2, ("h100",), 8)


def test_counts_per_class_and_stale_after_the_refresh_fraction() -> None:
    seen = ObservedClasses()
    seen.add(SHARE)
    assert not seen.stale, "one pod is no workload yet (frag marks a new class group stale itself)"
    seen.add(SHARE)
    assert seen.stale and seen.counts == {SHARE: 2.0}
    rebuilt: list[dict[ClassKey, float]] = []
    seen.refresh(threading.Lock(), lambda counts: rebuilt.append(dict(counts)))
    assert rebuilt == [{SHARE: 2.0}] and not seen.stale and seen.at_rebuild == 2
    for _ in range(98):
        seen.add(SHARE)
    seen.refresh(threading.Lock(), lambda counts: rebuilt.append(dict(counts)))
    assert len(rebuilt) == 2 and seen.at_rebuild == 100
    added = 0
    while not seen.stale:
        seen.add(WHOLE)
        added += 1
    # Stale once the counts grew by about TABLE_REFRESH (2 % of 100: the second or third pod), not before.
    assert 100 * TABLE_REFRESH <= added <= 100 * TABLE_REFRESH + 1
    assert seen.counts == {SHARE: 100.0, WHOLE: float(added)}


def test_a_fresh_table_is_not_rebuilt_and_a_stale_one_once() -> None:
    seen = ObservedClasses()
    calls: list[int] = []
    seen.refresh(threading.Lock(), lambda counts: calls.append(len(counts)))
    assert calls == [], "nothing observed, nothing stale"
    seen.add(SHARE)
    seen.stale = True  # as frag marks it for a new class group or a new GPU size
    lock = threading.Lock()
    readers = [threading.Thread(target=seen.refresh, args=(lock, lambda c: calls.append(len(c)))) for _ in range(8)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    assert calls == [1]
