"""gpushare-dra-convert: device-plugin requests (`limits: nvidia.com/gpu-mem`) become DRA claims that ask
the same memory, per container, per GPU, of the same models (the API server and the real kube-scheduler
check the output in tests/integration/test_dra_chart_samples.py)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_core.dra_convert import convert_all
from share_core.dra_convert import convert_manifest
from share_core.dra_convert import main
from share_core.dra_convert import model_selector
from share_core.request import InvalidRequest
from share_core.request import parse_quantity
from share_core.request import pod_request

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
GIB = 1024**3


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((SAMPLES / name).read_text()) if d]


def _pod(containers: list[dict[str, Any]], annotations: dict[str, str] | None = None, init: list | None = None) -> dict:
    spec: dict[str, Any] = {"schedulerName": SCHEDULER_NAME, "containers": containers}
    if init:
        spec["initContainers"] = init
    meta: dict[str, Any] = {"name": "p"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _c(name: str, mem: int | None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "x", **extra}
    if mem is not None:
        c["resources"] = {"limits": {RESOURCE_MEM: str(mem), "cpu": "1"}}
    return c


def _asked(templates: list[dict], unit_bytes: int = GIB) -> dict[str, list[int]]:
    """Template name -> memory of each request, in units."""
    return {
        t["metadata"]["name"]: [
            int(parse_quantity(r["exactly"]["capacity"]["requests"]["memory"]) // unit_bytes)
            for r in t["spec"]["spec"]["devices"]["requests"]
        ]
        for t in templates
    }


@pytest.mark.parametrize(
    "name", ["pod.yaml", "multi-container.yaml", "two-gpu.yaml", "gpu-model.yaml", "deployment.yaml"]
)
def test_every_device_plugin_sample_converts_to_the_same_memory(name: str) -> None:
    (doc,) = _docs(name)
    pod = doc if doc["kind"] == "Pod" else {"metadata": doc["spec"]["template"]["metadata"], **doc["spec"]["template"]}
    req = pod_request(pod)
    assert req is not None
    c = convert_manifest(doc)
    asked = _asked(c.templates)
    long_lived = sum(x.units for x in req.containers if not x.init or x.sidecar)
    assert sum(sum(v) for v in asked.values()) == long_lived, "the same memory, init containers reuse"
    assert all(len(v) == req.gpu_count for v in asked.values())
    out = c.manifest
    spec = out["spec"] if out["kind"] == "Pod" else out["spec"]["template"]["spec"]
    assert "schedulerName" not in spec
    for cont in spec.get("initContainers", []) + spec["containers"]:
        res = cont.get("resources") or {}
        assert RESOURCE_MEM not in (res.get("limits") or {}) and RESOURCE_MEM not in (res.get("requests") or {})
    entries = {e["name"]: e["resourceClaimTemplateName"] for e in spec["resourceClaims"]}
    assert sorted(entries.values()) == sorted(asked)
    ann = (out["metadata"] if out["kind"] == "Pod" else out["spec"]["template"]["metadata"]).get("annotations") or {}
    assert ANN_GPU_COUNT not in ann and ANN_GPU_MODEL not in ann


def test_one_claim_per_container_and_the_init_container_reuses_one() -> None:
    (doc,) = _docs("multi-container.yaml")
    c = convert_manifest(doc)
    assert _asked(c.templates) == {
        "gpushare-multi-container-trainer-gpu-mem": [3],
        "gpushare-multi-container-evaluator-gpu-mem": [2],
    }
    spec = c.manifest["spec"]
    uses = {x["name"]: x["resources"]["claims"] for x in spec["initContainers"] + spec["containers"]}
    assert uses == {
        "warmup": [{"name": "gpu-mem-evaluator"}],  # 1 GiB: the smallest app claim that is big enough
        "trainer": [{"name": "gpu-mem-trainer"}],
        "evaluator": [{"name": "gpu-mem-evaluator"}],
    }
    assert any("may get different GPUs" in n for n in c.notes)


def test_an_init_container_bigger_than_every_app_container_gets_its_own_claim() -> None:
    pod = _pod([_c("app", 2)], init=[_c("load", 6)])
    c = convert_manifest(pod)
    assert _asked(c.templates) == {"p-app-gpu-mem": [2], "p-load-gpu-mem": [6]}
    assert any("init container 'load'" in n and "6Gi more" in n for n in c.notes)


def test_sidecars_are_long_lived() -> None:
    pod = _pod([_c("app", 2)], init=[_c("proxy", 1, restartPolicy="Always")])
    assert _asked(convert_manifest(pod).templates) == {"p-proxy-gpu-mem": [1], "p-app-gpu-mem": [2]}


def test_gpu_count_makes_distinct_requests() -> None:
    (doc,) = _docs("two-gpu.yaml")
    (t,) = convert_manifest(doc).templates
    devices = t["spec"]["spec"]["devices"]
    assert [r["name"] for r in devices["requests"]] == ["gpu0", "gpu1"]
    assert devices["constraints"] == [{"requests": ["gpu0", "gpu1"], "distinctAttribute": "gpushare.io/uuid"}]


def test_models_become_one_cel_selector() -> None:
    pod = _pod([_c("app", 4)], {ANN_GPU_MODEL: 'A100, h100,Tesla "T4"'})
    (t,) = convert_manifest(pod).templates
    (sel,) = t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert sel["cel"]["expression"] == model_selector(("a100", "h100", 'tesla "t4"'))
    assert sel["cel"]["expression"].count(" || ") == 2 and '\\"t4\\"' in sel["cel"]["expression"]


def test_mib_unit_and_other_resources_kept() -> None:
    pod = _pod([_c("app", 1536)])
    c = convert_manifest(pod, MemoryUnit.MiB)
    assert c.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {
        "memory": "1536Mi"
    }
    assert c.manifest["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}


def test_namespace_and_pass_through() -> None:
    pod = _pod([_c("app", 4)])
    pod["metadata"]["namespace"] = "ml"
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    plain = _pod([_c("app", None)])
    out, notes = convert_all([svc, pod, plain], MemoryUnit.GiB)
    assert [d["kind"] for d in out] == ["Service", "ResourceClaimTemplate", "Pod", "Pod"]
    assert out[1]["metadata"]["namespace"] == "ml"
    assert out[0] == svc and out[3] == plain and not notes


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (_pod([_c("app", 3)], {ANN_GPU_COUNT: "2"}), "divide evenly by the GPU count"),
        (_pod([_c("a", 3), _c("b", 1)], {ANN_GPU_COUNT: "2"}), "container 'a' asks 3"),
        (_pod([_c("app", -1)]), "negative"),
        (_pod([_c("app", 4)], {ANN_GPU_COUNT: "two"}), "not a whole number"),
        ({"kind": "Pod", "metadata": {}, "spec": {"containers": [_c("app", 4)]}}, "without metadata.name"),
    ],
)
def test_what_cannot_be_translated_is_named(pod: dict, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        convert_manifest(pod)


def test_a_claim_name_already_taken_is_an_error() -> None:
    pod = _pod([_c("app", 4)])
    pod["spec"]["resourceClaims"] = [{"name": "gpu-mem-app", "resourceClaimName": "x"}]
    with pytest.raises(InvalidRequest, match="already has a resource claim named 'gpu-mem-app'"):
        convert_manifest(pod)


def test_command_line(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main([str(SAMPLES / "pod.yaml"), str(SAMPLES / "deployment.yaml")], stdout=out, stderr=err) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(out.getvalue())]
    assert kinds == ["ResourceClaimTemplate", "Pod", "ResourceClaimTemplate", "Deployment"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_pod([_c("app", 3)], {ANN_GPU_COUNT: "2"})))
    out, err = io.StringIO(), io.StringIO()
    assert main([str(bad)], stdout=out, stderr=err) == 2
    assert err.getvalue().startswith("error: Pod p: pod asks 3 nvidia.com/gpu-mem over 2 GPUs") and out.getvalue() == ""
    out, err = io.StringIO(), io.StringIO()
    assert main([], stdin=io.StringIO("a: [unclosed"), stdout=out, stderr=err) == 1
    assert "cannot read the manifests" in err.getvalue()
    assert main([], stdin=io.StringIO("- 1\n"), stdout=io.StringIO(), stderr=(err := io.StringIO())) == 1
    assert "must be an object" in err.getvalue()
