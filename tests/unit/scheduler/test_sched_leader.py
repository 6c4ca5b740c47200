"""Leadership: the extender acts unasked only while the kube-scheduler of its own pod holds the Lease."""

from __future__ import annotations

import pytest

from share_core.kube import KubeError
from share_scheduler.leader import Leadership
from share_scheduler.leader import holds_lease
from share_scheduler.leader import parse_lease_ref

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def lease(holder: str, renewed: str = "2027-01-15T07:59:55.000000Z", duration: int = 15) -> dict:
    return {"spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": duration}}


class LeaseServer:
    """Answers kube.get_path for one Lease, or fails as told."""

    def __init__(self, obj: dict | None) -> None:
        self.obj = obj
        self.paths: list[str] = []

    def get_path(self, path: str) -> dict:
        self.paths.append(path)
        if self.obj is None:
            raise KubeError("connection refused", None)
        return self.obj


def test_holds_lease_matches_kube_schedulers_hostname_uuid_identity():
    assert holds_lease(lease("sched-7f9c-abcde_3f2a"), "sched-7f9c-abcde", NOW)
    assert not holds_lease(lease("sched-7f9c-abcde2_3f2a"), "sched-7f9c-abcde", NOW)  # another pod's prefix
    assert not holds_lease(lease("sched-7f9c-abcde_3f2a", duration=4), "sched-7f9c-abcde", NOW)  # lapsed
    assert not holds_lease({"spec": {"holderIdentity": "h_1"}}, "h", NOW)  # never renewed: not held
    assert not holds_lease({}, "h", NOW)


def test_parse_lease_ref_names_the_problem():
    assert parse_lease_ref("gpushare-system/gpushare-scheduler") == ("gpushare-system", "gpushare-scheduler")
    for bad in ("gpushare-scheduler", "/x", "ns/", "a/b/c"):
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            parse_lease_ref(bad)


def test_without_a_lease_the_only_replica_leads():
    assert Leadership(None, None).is_leader()


def test_follows_the_lease_and_drops_out_when_reads_fail_past_its_duration():
    server = LeaseServer(lease("pod-a_1"))
    clock = [NOW]
    changes: list[bool] = []
    me = Leadership(server, "ns/sched", identity="pod-a", clock=lambda: clock[0])
    me.on_change(changes.append)
    assert not me.is_leader()  # nothing read yet: do not act
    assert me.refresh() and me.is_leader()
    assert server.paths == ["/apis/coordination.k8s.io/v1/namespaces/ns/leases/sched"]
    server.obj = None  # the API server goes away: the last answer stands until the Lease would lapse
    clock[0] = NOW + 5
    assert me.refresh()
    clock[0] = NOW + 11
    assert not me.refresh() and not me.is_leader()
    server.obj = lease("pod-b_2", renewed="2027-01-15T08:00:10Z")  # the other replica took over
    assert not me.refresh()
    assert changes == [True, False]
