"""The extender's per-GPU gauges: rendered per changed node, always equal to the cache's view."""

from __future__ import annotations

import json
import random

from prometheus_client.parser import text_string_to_metric_families

from share_core.contract import ANN_NODE_GPUS
from share_scheduler.cache import ClusterCache
from share_scheduler.metrics import GpuGauges
from share_scheduler.nodes import Contribution
from tests.unit.scheduler.conftest import make_node


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def expected(cache: ClusterCache) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What the gauges must say: the /inspect view of every GPU (the cache's own accounting)."""
    out = {}
    for node in cache.snapshot()["nodes"]:
        for g in node["gpus"]:
            labels = (("gpu", str(g["index"])), ("node", node["name"]), ("uuid", g["uuid"]))
            out[("gpushare_gpu_memory_allocated", labels)] = float(g["allocated"])
            out[("gpushare_gpu_memory_total", labels)] = float(g["total"] if g["healthy"] else 0)
    return out


def test_gauges_follow_every_change_of_the_cache() -> None:
    rng = random.Random(5)
    cache = ClusterCache()
    nodes = {f"node-{i}": make_node(f"node-{i}", [16, 16, (24, True)]) for i in range(8)}
    cache.replace_nodes(nodes.values())
    cache.replace_pods([])
    gauges = GpuGauges(cache)
    assert samples(gauges.text()) == expected(cache)
    live: list[str] = []
    for step in range(300):
        action = rng.random()
        name = rng.choice(sorted(nodes))
        if action < 0.5:
            key = f"default/p{step}"
            cache.assume(key, f"uid-{step}", Contribution(name, (rng.randrange(3),), rng.choice((1, 2, 4))))
            live.append(key)
        elif action < 0.75 and live:
            cache.forget(live.pop(rng.randrange(len(live))))
        elif action < 0.85:
            healthy = rng.random() < 0.5
            nodes[name] = make_node(name, [16, (16, healthy), (24, True)])
            cache.upsert_node(nodes[name])
        elif action < 0.92 and len(nodes) > 2:
            del nodes[name]
            cache.delete_node(name)
        else:
            new = f"node-{100 + step}"
            nodes[new] = make_node(new, [40])
            cache.upsert_node(nodes[new])
        if rng.random() < 0.3:  # scrapes come between some changes, not after each
            assert samples(gauges.text()) == expected(cache), f"step {step}"
    assert samples(gauges.text()) == expected(cache)


def test_label_values_are_escaped() -> None:
    cache = ClusterCache()
    node = make_node("node-a", [16])
    odd = 'GPU-"odd"\\uuid'  # a quote and a backslash
    gpus = [{"index": 0, "uuid": odd, "model": "NVIDIA A100", "memory": 16, "healthy": True}]
    node["metadata"]["annotations"][ANN_NODE_GPUS] = json.dumps(gpus)
    cache.replace_nodes([node])
    cache.replace_pods([])
    text = GpuGauges(cache).text()
    assert samples(text) == expected(cache)
    assert 'uuid="GPU-\\"odd\\"\\\\uuid"' in text
