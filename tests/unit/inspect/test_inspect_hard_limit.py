"""kubectl inspect gpushare shows each node's hard-limit verdict (`gpushare.io/hard-limit`), as the agent wrote it."""

from __future__ import annotations

import copy
import json

from share_core.contract import ANN_NODE_HARD_LIMIT
from share_inspect.render import render_details
from share_inspect.render import render_json
from share_inspect.report import build_report
from share_node.hardlimit import Facts
from share_node.hardlimit import GpuFacts
from share_node.hardlimit import decide_support
from tests.unit.inspect.inspect_cluster import NODES
from tests.unit.inspect.inspect_cluster import PODS


def annotated() -> list[dict]:
    nodes = copy.deepcopy(NODES)
    a, b = (next(n for n in nodes if n["metadata"]["name"] == x) for x in ("gpu-a", "gpu-b"))
    gpus = (GpuFacts("GPU-a0", False),)
    old = decide_support(Facts("auto", True, "580.159.04", "/sys/fs/cgroup", True, gpus), None)
    new = decide_support(Facts("auto", True, "615.20.01", "/sys/fs/cgroup", True, gpus), None)
    a["metadata"].setdefault("annotations", {})[ANN_NODE_HARD_LIMIT] = old.annotation("share-plugin", "t")
    b["metadata"].setdefault("annotations", {})[ANN_NODE_HARD_LIMIT] = new.annotation("share-plugin", "t")
    return nodes


def test_hard_limit_shown_per_node_in_details_and_json() -> None:
    report = build_report(annotated(), PODS)
    details = render_details(report)
    assert "Hard GPU Memory Limit:  not enforced (--hard-limit auto): unsupported driver 580.159.04" in details
    assert "Hard GPU Memory Limit:  enforced (--hard-limit auto): driver 615.20.01, on the pod cgroups" in details
    data = {n["name"]: n for n in json.loads(render_json(report))["nodes"]}
    assert data["gpu-a"]["hardLimit"]["enforced"] is False and data["gpu-a"]["hardLimit"]["driver"] == "580.159.04"
    assert data["gpu-b"]["hardLimit"]["enforced"] is True
    others = [n for n in data.values() if n["name"] not in ("gpu-a", "gpu-b")]
    assert all("hardLimit" not in n for n in others)  # a node whose agent said nothing


def test_hard_limit_garbage_annotation_is_a_problem() -> None:
    nodes = copy.deepcopy(NODES)
    nodes[0]["metadata"].setdefault("annotations", {})[ANN_NODE_HARD_LIMIT] = "{nope"
    report = build_report(nodes, PODS)
    assert any(ANN_NODE_HARD_LIMIT in p for p in report.problems)
