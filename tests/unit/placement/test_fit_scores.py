"""binpack's and spread's batch scores (`FitPolicy.scores`) equal `evaluate`'s, state for state."""

from __future__ import annotations

import random

import pytest

from share_placement import Demand
from share_placement import make_policy
from share_placement.model import NEG_INF
from share_placement.model import ViewPolicy
from tests.unit.placement.test_frag_pricing import MODELS
from tests.unit.placement.test_frag_pricing import random_gpus


@pytest.mark.parametrize("name", ["binpack", "spread"])
def test_fit_batch_scores_equal_evaluate(name):
    rng = random.Random(11)
    policy = make_policy(name)
    fits = 0
    for _ in range(200):
        views = [
            (random_gpus(rng, 80), rng.choice((None, 0, 500, 4000)), rng.choice((None, 0, 1000, 10**9)))
            for _ in range(30)
        ]
        count = rng.choice((0, 1, 1, 2))
        models = (rng.choice(MODELS).lower(),) if rng.random() < 0.2 else ()
        per = rng.choice((1, 8, 40, 80)) if count else 0
        d = Demand(per, count, models, rng.choice((0, 500, 2000)), rng.choice((0, 500)))
        got = policy.scores(views, d)
        assert got == ViewPolicy.scores(policy, views, d), d
        fits += sum(s != NEG_INF for s in got)
    assert fits > 2000
