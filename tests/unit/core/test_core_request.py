"""share_core.request: Kubernetes semantics of a pod's nvidia.com/gpu-mem request."""

from __future__ import annotations

from decimal import Decimal

import pytest

from share_core.request import InvalidRequest
from share_core.request import parse_quantity
from share_core.request import parse_units
from share_core.request import pod_request

R = "nvidia.com/gpu-mem"


def ctr(name: str, limit=None, request=None, **extra):
    res = {}
    if limit is not None:
        res["limits"] = {R: limit}
    if request is not None:
        res["requests"] = {R: request}
    return {"name": name, "resources": res, **extra}


def pod(containers, init=None, annotations=None):
    spec = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "p", "annotations": annotations or {}}, "spec": spec}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("8", 8), (8, 8), ("1k", 1000), ("2Ki", 2048), ("500m", Decimal("0.5")), ("1e3", 1000), (" 4 ", 4), (2.0, 2)],
)
def test_parse_quantity(value, expected):
    assert parse_quantity(value) == expected


@pytest.mark.parametrize("value", ["", "abc", "8GB", "1..2", None, True, [], {}])
def test_parse_quantity_garbage(value):
    with pytest.raises(InvalidRequest):
        parse_quantity(value, "x")


def test_parse_units_rejects_negative_and_fractional():
    with pytest.raises(InvalidRequest, match="negative"):
        parse_units("-1", "c")
    with pytest.raises(InvalidRequest, match="fractional"):
        parse_units("1.5", "c")
    with pytest.raises(InvalidRequest, match="fractional"):
        parse_units("500m", "c")
    assert parse_units("0", "c") == 0


def test_no_request_is_none():
    assert pod_request(pod([ctr("a")])) is None
    assert pod_request(pod([{"name": "a"}])) is None
    assert pod_request(pod([ctr("a", "0")])) is None


def test_limits_and_requests_rules():
    assert pod_request(pod([ctr("a", "4", "4")])).total == 4
    with pytest.raises(InvalidRequest, match="differs from limits"):
        pod_request(pod([ctr("a", "4", "2")]))
    with pytest.raises(InvalidRequest, match="not in limits"):
        pod_request(pod([ctr("a", None, "2")]))
    with pytest.raises(InvalidRequest, match=r"'a'.*negative"):
        pod_request(pod([ctr("a", "-2")]))
    with pytest.raises(InvalidRequest, match="fractional"):
        pod_request(pod([ctr("a", "0.5")]))
    with pytest.raises(InvalidRequest, match="not a valid quantity"):
        pod_request(pod([ctr("a", "lots")]))


def test_sum_of_app_containers():
    req = pod_request(pod([ctr("a", "2"), ctr("b", "3"), ctr("c")]))
    assert req.total == 5 and req.gpu_count == 1 and req.per_gpu == 5
    assert [(c.name, c.units, c.init) for c in req.containers] == [("a", 2, False), ("b", 3, False), ("c", 0, False)]


def test_init_containers_count_as_max_of_init_and_app():
    assert pod_request(pod([ctr("a", "2")], init=[ctr("i", "6")])).total == 6
    assert pod_request(pod([ctr("a", "2"), ctr("b", "3")], init=[ctr("i", "4")])).total == 5
    req = pod_request(pod([ctr("a", "1")], init=[ctr("i", "3"), ctr("j", "2")]))
    assert req.total == 3 and [c.name for c in req.containers] == ["i", "j", "a"]  # init first


def test_sidecars_run_beside_app_containers():
    # sidecar (restartPolicy Always) counts with the app containers and with later init containers
    init = [ctr("side", "2", restartPolicy="Always"), ctr("i", "3")]
    req = pod_request(pod([ctr("a", "1")], init=init))
    assert req.total == 5  # max(2 + 3 during init, 2 + 1 while running)
    assert [c.sidecar for c in req.containers] == [True, False, False]
    # an init container before the sidecar does not overlap it
    init = [ctr("i", "3"), ctr("side", "2", restartPolicy="Always")]
    assert pod_request(pod([ctr("a", "1")], init=init)).total == 3


def test_gpu_count_divisibility_and_garbage():
    req = pod_request(pod([ctr("a", "8")], annotations={"gpushare.io/gpu-count": "2"}))
    assert (req.total, req.gpu_count, req.per_gpu) == (8, 2, 4)
    with pytest.raises(InvalidRequest, match="divide evenly"):
        pod_request(pod([ctr("a", "7")], annotations={"gpushare.io/gpu-count": "2"}))
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(InvalidRequest, match="gpu-count"):
            pod_request(pod([ctr("a", "8")], annotations={"gpushare.io/gpu-count": bad}))
    assert pod_request(pod([ctr("a", "8")], annotations={"gpushare.io/gpu-count": ""})).gpu_count == 1


def test_models():
    req = pod_request(pod([ctr("a", "1")], annotations={"gpushare.io/gpu-model": " A100 , h100,"}))
    assert req.models == ("a100", "h100")
    assert req.model_allowed("NVIDIA A100-SXM4-80GB") and not req.model_allowed("Tesla T4")
    assert pod_request(pod([ctr("a", "1")])).model_allowed("anything")


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": "nope"},
        {"containers": ["nope"]},
        {"containers": [{"name": "a", "resources": "x"}]},
        {"containers": [{"name": "a", "resources": {"limits": ["x"]}}]},
        "spec",
    ],
)
def test_malformed_specs_are_clear_errors(spec):
    with pytest.raises(InvalidRequest):
        pod_request({"metadata": {}, "spec": spec})
