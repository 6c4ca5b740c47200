"""The live timeline's figures, computed as share-sim computes its own: share-sim's Timeline told what
happened live (tests/integration/livetimeline.py records it) instead of deciding it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from share_scheduler.sim.timeline import Arrival
from share_scheduler.sim.timeline import Timeline
from share_scheduler.sim.timeline import TimelineResult
from share_scheduler.sim.workload import Workload


@dataclass
class PodRecord:
    """One arrival, live, in simulated seconds: created (the create request went out), bound (the watch
    showed it bound), deleted (the watch showed it gone: until then it held its room); None where that
    never happened. `node` and `gpus`: where it went. `waited`: kube-scheduler's first try found no room (the pod
    got PodScheduled=False, reason Unschedulable), so it waited in the queue; a pod bound at its first
    try did not wait, however long that try took."""

    created: float | None = None
    bound: float | None = None
    deleted: float | None = None
    node: str = ""
    gpus: tuple[int, ...] = ()
    waited: bool = False  # kube-scheduler marked it Unschedulable before it was bound


class RecordedTimeline(Timeline):
    """share-sim's Timeline told what happened live instead of deciding it: the live run's arrivals, the
    pods that went to the queue, their bindings and deletions, applied in time order to share-sim's own
    cluster state, queue counts and clock, so `result()` computes the live figures exactly as it computes
    the simulated ones (time-averaged allocation, per class waits, the warm-up cut, pods waiting at the
    end). Every pod runs from its binding to its deletion. A pod bound at kube-scheduler's first try did
    not wait: it arrives (for share-sim's figures) when it was bound, its scheduling latency is no queue
    wait; one marked Unschedulable first waits from its creation to its binding. Replaying a placement
    that would take more than a GPU, a node's CPU or its memory holds raises."""

    def __init__(
        self,
        workload: Workload,
        arrivals: Sequence[Arrival],
        records: Sequence[PodRecord],
        warmup_s: float,
        end_s: float,
        policy: Any,
        seed: int = 0,
    ) -> None:
        created = [i for i, r in enumerate(records) if r.created is not None]
        if created != list(range(len(created))):
            raise ValueError("the live arrivals were not created in order")

        def arrived(r: PodRecord) -> float:
            assert r.created is not None
            return r.bound if r.bound is not None and not r.waited else r.created

        # share-sim's Timeline numbers arrivals in time order: the live ones, so sorted, and the records with
        # them; a pod bound at its first try only after the end arrived after it.
        order = sorted((i for i in created if arrived(records[i]) <= end_s), key=lambda i: (arrived(records[i]), i))
        live = [Arrival(arrived(records[i]), arrivals[i].pod, arrivals[i].duration) for i in order]
        super().__init__(workload, policy, live, warmup_s, end_s, seed)
        # What the watch showed after the end (the run goes on while it stops) did not happen by the end.
        self.records = [
            replace(
                records[i],
                bound=records[i].bound if (records[i].bound or 0.0) <= end_s else None,
                deleted=records[i].deleted if (records[i].deleted or 0.0) <= end_s else None,
            )
            for i in order
        ]
        self.node_index = {n.name: k for k, n in enumerate(workload.nodes)}

    def replay(self) -> None:
        events: list[tuple[float, int, int, str]] = []  # (time, order at one instant, arrival, what)
        for seq, r in enumerate(self.records):
            if r.waited or r.bound is None:
                events.append((self.arrivals[seq].time, 2, seq, "wait"))
                if r.bound is not None:
                    events.append((r.bound, 1, seq, "bound"))
            else:
                events.append((r.bound, 1, seq, "place"))
            if r.deleted is not None and r.bound is not None:
                # A departure first at one instant (its room is there for others), but never before its own start.
                events.append((r.deleted, 0 if r.deleted > r.bound else 3, seq, "leave"))
        events.sort()
        for t, _, seq, what in events:
            if t > self.end_s:
                break
            self._advance(t)
            if what == "wait":
                self._enqueue(seq)
            elif what == "leave":
                self.release(seq)
            else:
                if what == "bound":
                    self.unqueue(seq)
                self._place_recorded(seq)
        self._advance(self.end_s)
        self.arrived = len(self.records)

    def _place_recorded(self, seq: int) -> None:
        r = self.records[seq]
        node = self.node_index[r.node]
        self.place(seq, node, r.gpus)
        gpus, cpu_free, memory_free = self.cluster.view(node)
        short = [f"GPU {p} ({free})" for p, (_, free) in enumerate(gpus) if free < 0]
        if cpu_free is not None and cpu_free < 0:
            short.append(f"CPU ({cpu_free}m)")
        if memory_free is not None and memory_free < 0:
            short.append(f"memory ({memory_free} MiB)")
        if short:
            raise ValueError(f"live arrival {seq} bound to {r.node} {r.gpus} overfills it: {', '.join(short)}")


def live_figures(
    workload: Workload,
    arrivals: Sequence[Arrival],
    records: Sequence[PodRecord],
    warmup_s: float,
    end_s: float,
    policy: Any,
    seed: int = 0,
) -> TimelineResult:
    """The live run's figures, computed by share-sim's Timeline.result (see RecordedTimeline); `policy` and
    `seed` only label them (nothing is decided)."""
    timeline = RecordedTimeline(workload, arrivals, records, warmup_s, end_s, policy, seed)
    timeline.replay()
    return timeline.result()
