"""kubectl inspect gpushare shows what the node's plugin measured beside what is allocated."""

from __future__ import annotations

import copy
import json

from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.gpuusage import UsageSummary
from share_inspect.render import render_details
from share_inspect.render import render_json
from share_inspect.render import render_summary
from share_inspect.report import build_report
from share_inspect.report import report_to_dict
from tests.unit.inspect.inspect_cluster import NODES
from tests.unit.inspect.inspect_cluster import PODS


def measured_nodes() -> list[dict]:
    nodes = copy.deepcopy(NODES)
    a = next(n for n in nodes if n["metadata"]["name"] == "gpu-a")
    summary = UsageSummary({0: 30 * 1024 + 512, 1: 0}, {"default/train-a": {0: 30 * 1024}})
    a["metadata"].setdefault("annotations", {})[ANN_NODE_GPU_USAGE] = summary.to_json("2026-11-22T20:00:00Z")
    return nodes


def test_used_per_gpu_and_pod_in_the_model_and_json() -> None:
    report = build_report(measured_nodes(), PODS)
    a = next(n for n in report.nodes if n.name == "gpu-a")
    assert [g.used_mib for g in a.gpus] == [30 * 1024 + 512, 0]
    train = next(p for p in a.pods if p.name == "train-a")
    assert train.used_mib == {0: 30 * 1024} and train.used_total_mib == 30 * 1024
    data = json.loads(render_json(report))
    node = next(n for n in data["nodes"] if n["name"] == "gpu-a")
    assert node["usedMiB"] == 30 * 1024 + 512 and node["usageTime"] == "2026-11-22T20:00:00Z"
    assert [g["usedMiB"] for g in node["gpus"]] == [30 * 1024 + 512, 0]
    pod = next(p for p in node["pods"] if p["name"] == "train-a")
    assert pod["usedMiB"] == 30 * 1024 and pod["gpus"][0]["usedMiB"] == 30 * 1024
    other = next(p for p in node["pods"] if p["name"] != "train-a")
    assert other["usedMiB"] == 0  # measured node, pod with no process on a GPU
    b = next(n for n in data["nodes"] if n["name"] == "gpu-b")
    assert "usedMiB" not in b and all("usedMiB" not in g for g in b["gpus"])  # its plugin reports nothing


def test_used_column_in_summary_and_details() -> None:
    report = build_report(measured_nodes(), PODS)
    summary = render_summary(report)
    header, row_a = summary.splitlines()[0], next(line for line in summary.splitlines() if line.startswith("gpu-a"))
    assert header.rstrip().endswith("Used(GiB)") and row_a.rstrip().endswith("30.5")
    row_b = next(line for line in summary.splitlines() if line.startswith("gpu-b"))
    assert row_b.rstrip().endswith("-")
    details = render_details(report)
    assert "used 30.5 GiB" in details
    train = next(line for line in details.splitlines() if line.startswith("train-a"))
    assert train.split()[-1] == "30.0"
    assert "Node GPU Memory Used(GiB):  30.5 (measured 2026-11-22T20:00:00Z)" in details
    used_row = next(line for line in details.splitlines() if line.startswith("Used:"))
    assert used_row.split()[1:3] == ["30.5", "0.0"]


def test_garbage_usage_is_a_problem_not_a_crash() -> None:
    nodes = copy.deepcopy(NODES)
    nodes[0]["metadata"].setdefault("annotations", {})[ANN_NODE_GPU_USAGE] = "{not json"
    report = build_report(nodes, PODS)
    assert any(ANN_NODE_GPU_USAGE in p for p in report.problems)
    assert not report.measured and "usedMiB" not in json.dumps(report_to_dict(report))
