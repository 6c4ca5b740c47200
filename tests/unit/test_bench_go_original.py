"""bench_throughput's side-by-side with the Go original: the configuration and pods it renders."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from share_core.contract import RESOURCE_MEM

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_throughput", ROOT / "bench" / "bench_throughput.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()
URL = "http://127.0.0.1:9/gpushare-scheduler"


@pytest.mark.parametrize("keeps", ["best", "fitting"])
def test_go_config_is_ours_with_its_resource_and_verbs(keeps: str) -> None:
    ours = bench.print_config(ROOT, URL, keeps)
    go = bench.go_extender_config(ours)
    assert go["profiles"] == ours["profiles"]
    assert go["percentageOfNodesToScore"] == ours["percentageOfNodesToScore"]
    (ext,) = go["extenders"]
    assert ext["urlPrefix"] == URL and ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind"
    assert ext["nodeCacheCapable"] is True  # its filter reads args.NodeNames only
    assert ext["managedResources"] == [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]
    assert "prioritizeVerb" not in ext  # it serves no prioritize route
    assert ours["extenders"][0]["managedResources"][0]["name"] == RESOURCE_MEM  # ours left as it was


def test_go_config_refuses_verbs_it_does_not_serve() -> None:
    ours = bench.print_config(ROOT, URL, "best")
    ours["extenders"][0]["filterVerb"] = "predicates"
    with pytest.raises(ValueError, match="filter and bind only"):
        bench.go_extender_config(ours)


def test_running_pod_for_both_extenders_carries_both_records() -> None:
    both = (RESOURCE_MEM, bench.GO_RESOURCE_MEM)
    pod = bench.pod_body("r1", "gpushare-scheduler", 4, "node-00001", 3, both, 80)
    assert pod["spec"]["nodeName"] == "node-00001"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {RESOURCE_MEM: "4", "aliyun.com/gpu-mem": "4"}
    ann = pod["metadata"]["annotations"]
    assert ann["ALIYUN_COM_GPU_MEM_IDX"] == "3" and ann["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert ann["ALIYUN_COM_GPU_MEM_DEV"] == "80" and ann["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
    assert any(v == "3" for k, v in ann.items() if not k.startswith("ALIYUN_"))  # our GPU index too


def test_pending_go_pod_asks_its_resource_only() -> None:
    pod = bench.pod_body("p1", "gpushare-scheduler", 2, resources=(bench.GO_RESOURCE_MEM,))
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"aliyun.com/gpu-mem": "2"}
    assert "nodeName" not in pod["spec"] and "annotations" not in pod["metadata"]
