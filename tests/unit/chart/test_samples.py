"""samples/: every spec is a valid gpushare request, and the limits helper computes the right fraction."""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.request import pod_request
from share_webhook import review

REPO_ROOT = Path(__file__).resolve().parents[3]
SAMPLES = REPO_ROOT / "samples"
PROGRAMS = SAMPLES / "programs"


def _load_limits() -> Any:
    spec = importlib.util.spec_from_file_location("gpushare_limits", PROGRAMS / "gpushare_limits.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpushare_limits"] = mod
    spec.loader.exec_module(mod)
    return mod


limits = _load_limits()

EXPECTED = {
    # file: (pod total in GiB, gpu count, models)
    "pod.yaml": (4, 1, ()),
    "deployment.yaml": (2, 1, ()),
    "multi-container.yaml": (5, 1, ()),
    "two-gpu.yaml": (16, 2, ()),
    "gpu-model.yaml": (4, 1, ("t4",)),
}


def _pod_of(doc: dict[str, Any]) -> dict[str, Any]:
    """A Pod, or the pod a workload's template makes."""
    if doc["kind"] == "Pod":
        return doc
    tmpl = doc["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": tmpl.get("metadata", {}), "spec": tmpl["spec"]}


def assert_webhook_gives_scheduler(pod: dict[str, Any]) -> None:
    """Samples leave schedulerName out (README: the two lines a user writes): the chart's webhook hands
    them to gpushare-scheduler, and its validation lets them through without a warning."""
    assert "schedulerName" not in pod["spec"]
    request = {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod}
    raw = orjson.dumps({"apiVersion": review.API_VERSION, "kind": "AdmissionReview", "request": request})
    mutated = review.mutate(review.parse_review(raw), opted_in=False)["response"]
    assert orjson.loads(base64.b64decode(mutated["patch"])) == [
        {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME}
    ]
    assert "warnings" not in mutated
    stored = {**pod, "spec": {**pod["spec"], "schedulerName": SCHEDULER_NAME}}  # validation sees the mutated pod
    request = {**request, "object": stored}
    raw = orjson.dumps({"apiVersion": review.API_VERSION, "kind": "AdmissionReview", "request": request})
    checked = review.validate(review.parse_review(raw), None)["response"]
    assert checked == {"uid": "u", "allowed": True}


def test_every_sample_is_listed() -> None:
    assert sorted(p.name for p in SAMPLES.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_is_a_gpushare_request(name: str) -> None:
    docs = [d for d in yaml.safe_load_all((SAMPLES / name).read_text()) if d]
    assert len(docs) == 1
    pod = _pod_of(docs[0])
    assert_webhook_gives_scheduler(pod)
    assert "namespace" not in docs[0]["metadata"], "samples go to the namespace kubectl is told"
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        assert RESOURCE_MEM in c["resources"]["limits"], c["name"]
    req = pod_request(pod)
    assert req is not None
    total, count, models = EXPECTED[name]
    assert (req.total, req.gpu_count, tuple(req.models)) == (total, count, models)


def test_sample_annotations() -> None:
    two = yaml.safe_load((SAMPLES / "two-gpu.yaml").read_text())
    assert two["metadata"]["annotations"][ANN_GPU_COUNT] == "2"
    model = yaml.safe_load((SAMPLES / "gpu-model.yaml").read_text())
    assert model["metadata"]["annotations"][ANN_GPU_MODEL] == "T4"
    dep = yaml.safe_load((SAMPLES / "deployment.yaml").read_text())
    assert dep["spec"]["replicas"] > 1


def test_programs_job_is_valid_yaml() -> None:
    job = yaml.safe_load((PROGRAMS / "pytorch-job.yaml").read_text())
    assert_webhook_gives_scheduler(_pod_of(job))


def test_overlimit_job_asks_less_than_its_program_takes() -> None:
    job = yaml.safe_load((PROGRAMS / "overlimit-job.yaml").read_text())
    pod = _pod_of(job)
    req = pod_request(pod)
    assert req is not None and req.total == 4
    assert_webhook_gives_scheduler(pod)
    c = pod["spec"]["containers"][0]
    assert c["command"][-1] == "/programs/pytorch_overlimit.py"
    assert int(next(e["value"] for e in c["env"] if e["name"] == "OVERSHOOT_MIB")) > 0
    assert (PROGRAMS / "pytorch_overlimit.py").exists()


# ------------------------------------------------------------------------------ gpushare_limits


@pytest.mark.parametrize(
    ("limit", "total", "reserve", "expected"),
    [
        (4096, 16384, 0, 0.25),
        (8192, 81920, 0, 0.1),
        (16384, 16384, 0, 1.0),
        (4096, 16384, 512, 0.2187),  # 3584 / 16384 = 0.21875, rounded down
        (1024, 15360, 0, 0.0666),  # never rounded up past the limit
    ],
)
def test_fraction(limit: int, total: int, reserve: int, expected: float) -> None:
    f = limits.fraction(limit, total, reserve)
    assert f == expected
    assert f * total <= limit - reserve


@pytest.mark.parametrize(
    ("limit", "total", "reserve", "message"),
    [
        (0, 16384, 0, "positive"),
        (4096, 0, 0, "positive"),
        (20000, 16384, 0, "more than"),
        (4096, 16384, 4096, "leaves nothing"),
        (4096, 16384, -1, "negative"),
    ],
)
def test_fraction_rejects(limit: int, total: int, reserve: int, message: str) -> None:
    with pytest.raises(limits.LimitError, match=message):
        limits.fraction(limit, total, reserve)


def test_from_env_one_gpu() -> None:
    env = {
        "GPUSHARE_MEM_LIMIT_MIB": "4096",
        "GPUSHARE_MEM_TOTAL_MIB": "16384",
        "GPUSHARE_GPU_INDEX": "1",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa",
    }
    share = limits.from_env(env)
    assert share.fractions == (0.25,) and share.fraction == 0.25 and share.gpu_count == 1
    text = share.describe()
    assert "GPU 1: 4096 of 16384 MiB" in text and "GPU-aaaa" in text and "must honour" in text


def test_from_env_two_gpus_of_different_sizes_and_mps() -> None:
    env = {
        "GPUSHARE_MEM_LIMIT_MIB": "8192",
        "GPUSHARE_MEM_TOTAL_MIB": "81920,16384",
        "GPUSHARE_GPU_INDEX": "0,2",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-a=8192M,GPU-b=8192M",
        "GPUSHARE_CONTEXT_RESERVE_MIB": "0",
    }
    share = limits.from_env(env)
    assert share.fractions == (0.1, 0.5)
    assert share.fraction == 0.1, "one fraction for all devices: the safe one"
    assert "hard limit by MPS: GPU-a=8192M" in share.describe()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "GPUSHARE_MEM_LIMIT_MIB and GPUSHARE_MEM_TOTAL_MIB not set"),
        ({"GPUSHARE_MEM_LIMIT_MIB": "4096"}, "GPUSHARE_MEM_TOTAL_MIB not set: .*schedulerName"),
        ({"GPUSHARE_MEM_LIMIT_MIB": "4 GiB", "GPUSHARE_MEM_TOTAL_MIB": "16384"}, "not a whole number"),
        ({"GPUSHARE_MEM_LIMIT_MIB": "-1", "GPUSHARE_MEM_TOTAL_MIB": "16384"}, "positive"),
        (
            {"GPUSHARE_MEM_LIMIT_MIB": "4096", "GPUSHARE_MEM_TOTAL_MIB": "16384,16384", "GPUSHARE_GPU_INDEX": "0"},
            "names 1 GPUs",
        ),
        ({"GPUSHARE_MEM_LIMIT_MIB": "4096", "GPUSHARE_MEM_TOTAL_MIB": "2048"}, "more than"),
    ],
)
def test_from_env_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(limits.LimitError, match=message):
        limits.from_env(env)


@pytest.mark.parametrize("program", ["pytorch_limit.py", "jax_limit.py", "tensorflow_limit.py", "gpushare_limits.py"])
def test_programs_fail_clearly_without_env(program: str) -> None:
    """Without the env every program stops before importing its framework, with a message and exit 2."""
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, str(PROGRAMS / program)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "GPUSHARE_MEM_LIMIT_MIB" in result.stderr and "nvidia.com/gpu-mem" in result.stderr
    assert "Traceback" not in result.stderr


def test_helper_prints_the_share() -> None:
    env = {"PATH": "/usr/bin:/bin", "GPUSHARE_MEM_LIMIT_MIB": "4096", "GPUSHARE_MEM_TOTAL_MIB": "16384"}
    result = subprocess.run(
        [sys.executable, str(PROGRAMS / "gpushare_limits.py")], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "4096 of 16384 MiB (25.00%)" in result.stdout and "0.25" in result.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_commands_are_strings(name: str) -> None:
    """A plain YAML scalar with ': ' inside reads as a mapping: every command and arg must be a string."""
    pod = _pod_of(yaml.safe_load((SAMPLES / name).read_text()))
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        for field in ("command", "args"):
            assert all(isinstance(a, str) for a in c.get(field, [])), f"{name}: {c['name']}.{field}: {c.get(field)}"
