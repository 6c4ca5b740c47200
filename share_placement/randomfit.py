"""A uniformly random fit: the baseline every other policy should beat."""

from __future__ import annotations

import random
import threading

from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import NodeView
from share_placement.model import ViewPolicy
from share_placement.model import eligible_positions


class RandomPolicy(ViewPolicy):
    """Random fit: a uniformly random score for every node that fits, random GPUs on it (a baseline)."""

    name = "random"
    cacheable = False
    # Every fitting node gets an independent uniform score, so the best node is a uniform pick among the
    # nodes that fit: a caller placing many pods may draw that pick directly (share-sim's timeline does).
    uniform_scores = True

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        with self._lock:
            chosen = tuple(sorted(self._rng.sample(elig, demand.count)))
            return self._rng.random(), chosen
