"""The webhook's own certificate: made once for all replicas, renewed before it ends, CA rotation kept
trusted, races lost gracefully (share_webhook.certs, keeper.CertKeeper over a fake API)."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from typing import Any

import pytest
from cryptography import x509

from share_core.kube import Conflict
from share_webhook import certs
from share_webhook.keeper import CertKeeper
from share_webhook.keeper import ClusterView

NAMES = certs.service_names("gpushare-webhook", "gpushare-system")


class FakeApi:
    def __init__(self) -> None:
        self.secret: dict[str, Any] | None = None
        self.version = 0
        self.bundles: dict[tuple[str, str], str] = {("mutating", "m"): "", ("validating", "v"): ""}
        self.race: dict[str, str] | None = None  # another replica's data, written just before our write
        self.nodes: list[dict[str, Any]] = []
        self.uids = {("mutating", "m"): "uid-1", ("validating", "v"): "uid-v"}

    def _store(self, data: dict[str, str], owners: list[dict[str, Any]] | None = None) -> None:
        self.version += 1
        meta: dict[str, Any] = {"resourceVersion": str(self.version)}
        if owners:
            meta["ownerReferences"] = owners
        self.secret = {"metadata": meta, "data": data}

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.secret

    def create_secret(self, namespace: str, name: str, data: dict[str, str], owners: list[dict[str, Any]]) -> None:
        if self.race is not None:
            self._store(self.race, owners)  # the other replica names the same owner
            self.race = None
        if self.secret is not None:
            raise Conflict("exists", 409)
        self._store(data, owners)

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, str], owners: list[dict[str, Any]], resource_version: str
    ) -> None:
        if self.race is not None:
            self._store(self.race, owners)  # the other replica names the same owner
            self.race = None
        if self.secret is None or self.secret["metadata"]["resourceVersion"] != resource_version:
            raise Conflict("changed", 409)
        self._store(data, owners)

    def config_uid(self, kind: str, name: str) -> str | None:
        return self.uids.get((kind, name))

    def set_ca_bundle(self, kind: str, name: str, ca_bundle: str) -> bool:
        if (kind, name) not in self.bundles:
            return False
        self.bundles[(kind, name)] = ca_bundle
        return True

    def gpu_nodes(self) -> list[dict[str, Any]]:
        return self.nodes


def keeper(api: FakeApi, served: list[certs.Bundle]) -> CertKeeper:
    return CertKeeper(api, "gpushare-system", "tls", NAMES, [("mutating", "m"), ("validating", "v")], served.append)


def test_first_replica_makes_the_certificate_and_the_configs_trust_it(tmp_path: Any) -> None:
    api, served = FakeApi(), []
    bundle = keeper(api, served).sync()
    assert served == [bundle] and api.version == 1
    assert api.bundles[("mutating", "m")] == api.bundles[("validating", "v")] == bundle.ca
    assert certs.covers(bundle.cert, NAMES) and certs.signed_by(bundle.cert, bundle.ca)
    # a TLS client trusting the caBundle accepts the serving certificate for the Service's name
    (tmp_path / "c.pem").write_text(bundle.cert)
    (tmp_path / "k.pem").write_text(bundle.key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    # a second replica, and the same one later: nothing is rewritten
    other: list[certs.Bundle] = []
    assert keeper(api, other).sync() == bundle and other == [bundle] and api.version == 1


def test_a_lost_race_serves_the_winners_certificate() -> None:
    api, served = FakeApi(), []
    winner = certs.next_bundle(None, NAMES)
    assert winner is not None
    api.race = certs.to_secret_data(winner)
    assert keeper(api, served).sync() == winner and api.version == 1


def test_renewal_before_the_end_keeps_the_ca() -> None:
    api, served = FakeApi(), []
    old = keeper(api, served).sync()
    late = dt.datetime.now(dt.UTC) + dt.timedelta(days=300)  # past 2/3 of a 365-day certificate
    renewed = certs.next_bundle(old, NAMES, late)
    assert renewed is not None and renewed.ca == old.ca and renewed.cert != old.cert
    assert certs.next_bundle(old, NAMES) is None
    assert certs.next_bundle(old, [*NAMES, "gpushare-webhook.other"]) is not None, "a new Service name"


def test_ca_rotation_trusts_both_until_the_old_one_ends() -> None:
    old = certs.next_bundle(None, NAMES)
    assert old is not None
    late = dt.datetime.now(dt.UTC) + dt.timedelta(days=2500)  # past 2/3 of the CA's ten years
    rotated = certs.next_bundle(old, NAMES, late)
    assert rotated is not None and rotated.ca != old.ca and rotated.previous_ca == old.ca
    assert rotated.ca_bundle() == rotated.ca + old.ca
    assert certs.signed_by(rotated.cert, rotated.ca)
    data = certs.to_secret_data(rotated)
    assert certs.from_secret_data(data) == rotated
    assert set(data) == {"ca.crt", "tls.crt", "tls.key", "ca.key", "ca-previous.crt"}
    cert = x509.load_pem_x509_certificate(rotated.cert.encode())
    assert cert.not_valid_after_utc <= x509.load_pem_x509_certificate(rotated.ca.encode()).not_valid_after_utc


def test_garbage_in_the_secret_is_replaced() -> None:
    api, served = FakeApi(), []
    api._store({"tls.crt": base64.b64encode(b"not a cert").decode(), "ca.crt": "%%%"})
    bundle = keeper(api, served).sync()
    assert api.version == 2 and certs.signed_by(bundle.cert, bundle.ca)


def test_the_secret_is_owned_by_the_mutating_configuration() -> None:
    """helm never makes the Secret: owned by the MutatingWebhookConfiguration, the garbage collector
    deletes it (and its private keys) with the release; helm upgrade keeps the configuration's UID."""
    api, served = FakeApi(), []
    bundle = keeper(api, served).sync()
    assert api.secret is not None
    assert api.secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration", "name": "m",
         "uid": "uid-1"}
    ]  # fmt: skip
    assert keeper(api, served).sync() == bundle and api.version == 1, "owned already: nothing rewritten"
    # a Secret made before the configuration existed, or a configuration made again: owned, same certificate
    api.uids[("mutating", "m")] = "uid-2"
    assert keeper(api, served).sync() == bundle and api.version == 2
    assert [o["uid"] for o in api.secret["metadata"]["ownerReferences"]] == ["uid-2"]
    # no mutating configuration at all (a bare share-webhook): made without an owner
    bare = FakeApi()
    CertKeeper(bare, "ns", "tls", NAMES, [("validating", "v")], served.append).sync()
    assert bare.secret is not None and "ownerReferences" not in bare.secret["metadata"]


def test_a_missing_configuration_is_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    api, served = FakeApi(), []
    CertKeeper(api, "ns", "tls", NAMES, [("mutating", "gone")], served.append).sync()
    assert "not found" in caplog.text


def test_cluster_view_skips_garbage_nodes() -> None:
    api = FakeApi()
    good = {
        "metadata": {
            "name": "a",
            "annotations": {"gpushare.io/gpus": '[{"index":0,"uuid":"U","model":"T4","memory":16}]'},
        }
    }
    bad = {"metadata": {"name": "b", "annotations": {"gpushare.io/gpus": "[{"}}}
    api.nodes = [good, bad]
    view = ClusterView(api)
    assert view.gpus is None
    view.refresh()
    assert view.gpus is not None and [g.memory for n in view.gpus.nodes for g in n] == [16]
