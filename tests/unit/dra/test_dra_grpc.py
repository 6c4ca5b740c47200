"""The kubelet-facing gRPC services over real unix sockets (share_dra/server.py), as kubelet calls them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from share_core.contract import MemoryUnit
from share_dra.api import dra_v1_pb2 as pb
from share_dra.api import dra_v1_pb2_grpc as pbgrpc
from share_dra.api import pluginregistration_v1_pb2 as regpb
from share_dra.api import pluginregistration_v1_pb2_grpc as reggrpc
from share_dra.driver import CHECKPOINT_NAME
from share_dra.driver import Checkpoint
from share_dra.driver import Driver
from share_dra.server import PluginServers
from share_dra.server import Sockets
from share_node.backend import Gpu
from tests.unit.dra.fakeapi import FakeDraApi
from tests.unit.dra.fakeapi import allocated_claim

GPUS = [Gpu(0, "GPU-aaaa", "Tesla T4", 16 * 1024**3, 0)]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[PluginServers, FakeDraApi, Path]]:
    api = FakeDraApi()
    api.add_claim(allocated_claim("ns", "c1", "uid-1", [("n1", "gpu-0", "2Gi")]))
    driver = Driver("n1", lambda: GPUS, api, str(tmp_path / "cdi"), Checkpoint(tmp_path / "p" / CHECKPOINT_NAME))
    assert driver.unit is MemoryUnit.GiB
    s = PluginServers(driver, Sockets(str(tmp_path / "registry"), str(tmp_path / "p")))
    s.start()
    yield s, api, tmp_path
    s.stop()


def test_registration_answers_what_kubelets_plugin_watcher_needs(servers) -> None:  # type: ignore[no-untyped-def]
    s, _, tmp = servers
    with grpc.insecure_channel(f"unix://{tmp / 'registry' / 'gpushare.io-reg.sock'}") as ch:
        stub = reggrpc.RegistrationStub(ch)
        info = stub.GetInfo(regpb.InfoRequest(), timeout=5)
        assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
            "DRAPlugin", "gpushare.io", str(tmp / "p" / "dra.sock"), ["v1.DRAPlugin"]
        )  # fmt: skip
        kicked: list[bool] = []
        s.registration.on_registered = lambda: kicked.append(True)
        stub.NotifyRegistrationStatus(regpb.RegistrationStatus(plugin_registered=True), timeout=5)
        assert s.registration.registered.is_set() and kicked == [True]
        stub.NotifyRegistrationStatus(regpb.RegistrationStatus(plugin_registered=False, error="no"), timeout=5)
        assert not s.registration.registered.is_set() and s.registration.last_error == "no"


def test_prepare_and_unprepare_over_the_socket(servers) -> None:  # type: ignore[no-untyped-def]
    _, _, tmp = servers
    claim = pb.Claim(namespace="ns", uid="uid-1", name="c1")
    with grpc.insecure_channel(f"unix://{tmp / 'p' / 'dra.sock'}") as ch:
        stub = pbgrpc.DRAPluginStub(ch)
        resp = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[claim, pb.Claim(namespace="ns", uid="u-x", name="nope")]), timeout=5
        )
        assert set(resp.claims) == {"uid-1", "u-x"}  # kubelet wants an entry for every claim
        (dev,) = resp.claims["uid-1"].devices
        assert (list(dev.request_names), dev.pool_name, dev.device_name, list(dev.cdi_device_ids), dev.share_id) == (
            ["gpu"], "n1", "gpu-0", ["gpushare.io/gpu=uid-1-gpu-0"], "share-0"
        )  # fmt: skip
        assert "ns/nope" in resp.claims["u-x"].error and not resp.claims["u-x"].devices
        spec = json.loads((tmp / "cdi" / "gpushare.io-claim_uid-1.json").read_text())
        assert "GPUSHARE_MEM_LIMIT_MIB=2048" in spec["devices"][0]["containerEdits"]["env"]
        un = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=5)
        assert un.claims["uid-1"].error == ""
        assert not (tmp / "cdi" / "gpushare.io-claim_uid-1.json").exists()


def test_stop_removes_both_sockets(servers) -> None:  # type: ignore[no-untyped-def]
    s, _, tmp = servers
    s.stop()
    assert not (tmp / "p" / "dra.sock").exists()
    assert not (tmp / "registry" / "gpushare.io-reg.sock").exists()
