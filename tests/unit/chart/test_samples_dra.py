"""samples/dra/: each file is a ResourceClaimTemplate of DeviceClass gpushare.io and a pod that uses it
consistently (the API server's checks are in tests/integration/test_dra_chart_samples.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.contract import DRA_DEVICE_CLASS
from share_core.contract import SCHEDULER_NAME
from share_core.request import parse_quantity

SAMPLES = Path(__file__).resolve().parents[3] / "samples" / "dra"
GIB = 1024**3

# file: the memory of each request in GiB, and the containers using each (claim, request)
EXPECTED: dict[str, dict[str, Any]] = {
    "template-4gi.yaml": {"requests": {"gpu": 4}, "uses": {"cuda": [("gpu", None)]}},
    "shared-claim.yaml": {"requests": {"gpu": 6}, "uses": {"trainer": [("gpu", None)], "evaluator": [("gpu", None)]}},
    "two-gpus.yaml": {
        "requests": {"gpu-a": 8, "gpu-b": 8},
        "uses": {"worker-a": [("gpus", "gpu-a")], "worker-b": [("gpus", "gpu-b")]},
    },
    "gpu-model.yaml": {"requests": {"gpu": 4}, "uses": {"inference": [("gpu", None)]}},
}


def _load(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    template, pod = [d for d in yaml.safe_load_all((SAMPLES / name).read_text()) if d]
    return template, pod


def test_every_dra_sample_is_listed() -> None:
    assert sorted(p.name for p in SAMPLES.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_asks_memory_of_the_gpushare_class(name: str) -> None:
    template, _ = _load(name)
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    assert "namespace" not in template["metadata"]
    got = {}
    for r in template["spec"]["spec"]["devices"]["requests"]:
        assert r["exactly"]["deviceClassName"] == DRA_DEVICE_CLASS
        mem = parse_quantity(r["exactly"]["capacity"]["requests"]["memory"])
        assert mem % GIB == 0, "whole GiB: the devices' validRange step is 1Gi"
        got[r["name"]] = int(mem // GIB)
    assert got == EXPECTED[name]["requests"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_pod_uses_its_template_and_no_extender(name: str) -> None:
    template, pod = _load(name)
    spec = pod["spec"]
    assert spec.get("schedulerName", "default-scheduler") != SCHEDULER_NAME, "DRA pods need no extender"
    assert "namespace" not in pod["metadata"]
    claims = {c["name"]: c for c in spec["resourceClaims"]}
    assert all(c["resourceClaimTemplateName"] == template["metadata"]["name"] for c in claims.values())
    requests = {r["name"] for r in template["spec"]["spec"]["devices"]["requests"]}
    uses = {}
    for c in spec["containers"]:
        assert "nvidia.com/gpu-mem" not in (c["resources"].get("limits") or {})
        refs = [(ref["name"], ref.get("request")) for ref in c["resources"]["claims"]]
        assert all(claim in claims and (req is None or req in requests) for claim, req in refs), refs
        assert all(isinstance(a, str) for a in c.get("command", [])), c["name"]
        uses[c["name"]] = refs
    assert uses == EXPECTED[name]["uses"]


def test_two_gpus_are_kept_apart_and_the_model_is_selected_in_cel() -> None:
    two, _ = _load("two-gpus.yaml")
    assert two["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu-a", "gpu-b"], "distinctAttribute": "gpushare.io/uuid"}
    ]
    model, _ = _load("gpu-model.yaml")
    (sel,) = model["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert sel["cel"]["expression"] == 'device.attributes["gpushare.io"].model.lowerAscii().contains("t4")'
