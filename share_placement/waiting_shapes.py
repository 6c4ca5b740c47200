"""Which shapes `share_placement.room.RoomForWaiting` is told, by one rule for share-sim's timeline
and the extender (issue 40, room for what waits)."""

from __future__ import annotations

from collections.abc import Iterable

from share_placement.model import Demand
from share_placement.room import shape_of

LINGER_S = 3600.0  # a shape is left room for this long after a pod of it last waited


class WaitingShapes:
    """Which shapes `RoomForWaiting` is told: those of the multi-GPU pods waiting now, and those that
    waited within the last `linger_s` seconds (a shape that just got its room is likely to wait again).
    One rule for share-sim's timeline (told after every event) and the extender (told when its waiting
    pods change, and when a shape is due to expire: `expires`)."""

    def __init__(self, linger_s: float = LINGER_S) -> None:
        if not linger_s >= 0:
            raise ValueError(f"the linger of waiting shapes must be >= 0 seconds, got {linger_s}")
        self.linger_s = linger_s
        self.last: dict[Demand, float] = {}  # shape -> when a pod of it last waited

    def update(self, waiting: Iterable[Demand], now: float) -> dict[Demand, float]:
        """`waiting`: the demands of the pods that wait at `now` (those asking 2+ GPUs count). The shapes
        to leave room for now (shape -> when it last waited; RoomForWaiting.set_waiting takes the keys)."""
        last = self.last
        for d in waiting:
            if d.count >= 2:
                last[shape_of(d)] = now
        linger = self.linger_s
        for s in [s for s, t in last.items() if now - t > linger]:
            del last[s]
        return last

    def expires(self) -> float:
        """When the first shape no pod waits for any more drops out (inf: none will)."""
        return min(self.last.values(), default=float("inf")) + self.linger_s
