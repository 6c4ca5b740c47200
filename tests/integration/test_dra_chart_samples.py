"""DRA mode against the real control plane: the chart's DRA objects are accepted (or refused, below 1.34,
naming why), its ValidatingAdmissionPolicy really keeps each plugin to its own node's ResourceSlices,
every sample in samples/dra/ is valid, and the real kube-scheduler allocates the samples' claims (and those
of the device-plugin samples rewritten by gpushare-dra-convert) from
gpushare.io ResourceSlices built by share-dra's own code (share_dra.slices over simulated GPUs; the
nodes have no kubelet), which `kubectl inspect gpushare` then shows.

Version-dependent on purpose, and visibly so: Kubernetes 1.33 has no resource.k8s.io/v1, so there each
test asserts that (and the chart's refusal) instead; consumable capacity, the sharing itself, is on by
default from 1.36, and on 1.34/1.35 the tests assert the API server drops it, which is why the chart
refuses those versions unless the gate is declared on.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.contract import DRA_DRIVER_NAME as DRIVER
from share_core.contract import MemoryUnit
from share_core.dra_convert import convert_all
from share_core.kube import ApiServerClient
from share_core.kube import KubeError
from share_dra.slices import resource_slice
from share_dra.slices import slice_spec
from share_inspect.cli import main as inspect_main
from share_node.backend.sim import SimBackend
from tests.controlplane import ControlPlane
from tests.controlplane.barenodes import create_node
from tests.unit.chart.helm import CHART_DIR
from tests.unit.chart.helm import HelmError
from tests.unit.chart.helm import Obj
from tests.unit.chart.helm import render_chart
from tests.unit.chart.helm import run_helm

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "dra"
NAMESPACE = "gpushare-dra-test"
RELEASE = "dracheck"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def _docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _list(items: list[Obj]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    control_plane.kubectl("create", "namespace", NAMESPACE, check=False)
    return control_plane


@pytest.fixture(scope="module")
def version(cluster: ControlPlane) -> tuple[str, int]:
    v = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    return v["gitVersion"], int(v["minor"].rstrip("+"))


def _serves_dra(cluster: ControlPlane) -> bool:
    return "resource.k8s.io/v1" in cluster.kubectl("api-versions").stdout.split()


def _dra_values(minor: int) -> dict[str, Any]:
    """mode both, and on 1.34/1.35 the declaration that the gate is on (the chart refuses otherwise)."""
    return {"mode": "both", **({"dra.consumableCapacityGate": True} if minor < 36 else {})}


# ------------------------------------------------------------------------------------------ the chart


def test_chart_dra_objects_accepted_or_refused_by_version(cluster: ControlPlane, version: tuple[str, int]) -> None:
    git_version, minor = version
    if minor < 34:
        assert not _serves_dra(cluster), "1.33 serves no resource.k8s.io/v1"
        with pytest.raises(HelmError, match=r"needs Kubernetes 1\.34 or newer"):
            render_chart(set_values={"mode": "dra"}, namespace=NAMESPACE, kube_version=git_version)
        return
    assert _serves_dra(cluster)
    docs = render_chart(set_values=_dra_values(minor), namespace=NAMESPACE, kube_version=git_version)
    kinds = {d["kind"] for d in docs}
    assert {"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DaemonSet"} <= kinds
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=_list(docs), check=False)
    assert result.returncode == 0, f"the API server rejected the chart:\n{result.stdout}{result.stderr}"
    lines = [x for x in result.stdout.splitlines() if x.strip()]
    assert len(lines) == len(docs) and all("(server dry run)" in x for x in lines), result.stdout


@pytest.fixture(scope="module")
def dra_rbac(cluster: ControlPlane, version: tuple[str, int]) -> Iterator[str]:
    """The chart's DRA service account, ClusterRole, binding and slice policy, created for real."""
    git_version, minor = version
    if minor < 34:
        yield ""
        return
    docs = render_chart(set_values=_dra_values(minor), release=RELEASE, namespace=NAMESPACE, kube_version=git_version)
    wanted = {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    objs = [
        d
        for d in docs
        if d["kind"] in wanted
        and (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "dra-plugin"
    ]
    assert {d["kind"] for d in objs} == wanted
    cluster.kubectl("apply", "-f", "-", input=_list(objs))
    sa = next(d for d in objs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    yield f"system:serviceaccount:{NAMESPACE}:{sa}"
    cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=_list(objs), check=False)


def _slice(name: str, node: str | None) -> Obj:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": node or "cluster", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}],
    }
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def _as_plugin(cluster: ControlPlane, user: str, node: str | None) -> Path:
    """kubectl arguments to act as the plugin's service account on `node` (what its pod-bound token
    says), by impersonation from the admin's kubeconfig; kubectl before 1.35 has no --as-user-extra
    flag, but every kubeconfig may carry `as-user-extra`."""
    config = yaml.safe_load(cluster.admin_kubeconfig.read_text())
    for u in config["users"]:
        u["user"]["as"] = user
        u["user"]["as-groups"] = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]
        if node:
            u["user"]["as-user-extra"] = {NODE_NAME_EXTRA: [node]}
    path = cluster.admin_kubeconfig.with_name(f"dra-plugin-as-{node or 'nonode'}.kubeconfig")
    path.write_text(yaml.safe_dump(config))
    return path


def test_plugin_writes_only_its_own_nodes_slices(
    cluster: ControlPlane, version: tuple[str, int], dra_rbac: str
) -> None:
    if version[1] < 34:
        assert not _serves_dra(cluster)
        return
    user = dra_rbac
    # The policy takes effect once the API server's admission has loaded it: retry the forbidden write.
    other = _slice("vap-other", "node-b")
    deadline = time.monotonic() + 60
    while True:
        denied = cluster.kubectl(
            "create", "-f", "-", kubeconfig=_as_plugin(cluster, user, "node-a"), input=json.dumps(other), check=False
        )
        if denied.returncode != 0:
            break
        cluster.kubectl("delete", "resourceslice", "vap-other", "--wait=false")
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
        time.sleep(0.5)
    assert "may only write its own node's" in denied.stderr and "node-b" in denied.stderr, denied.stderr

    own_slice = json.dumps(_slice("vap-own", "node-a"))
    own = cluster.kubectl(
        "create", "-f", "-", kubeconfig=_as_plugin(cluster, user, "node-a"), input=own_slice, check=False
    )
    assert own.returncode == 0, own.stderr
    try:
        no_node = cluster.kubectl(
            "create",
            "-f",
            "-",
            kubeconfig=_as_plugin(cluster, user, "node-a"),
            input=json.dumps(_slice("vap-all", None)),
            check=False,
        )
        assert no_node.returncode != 0 and "a slice without a node" in no_node.stderr, no_node.stderr
        stolen = cluster.kubectl(
            "delete", "resourceslice", "vap-own", kubeconfig=_as_plugin(cluster, user, None), check=False
        )
        assert stolen.returncode != 0 and "names no node" in stolen.stderr, stolen.stderr
        other_node = cluster.kubectl(
            "delete", "resourceslice", "vap-own", kubeconfig=_as_plugin(cluster, user, "node-b"), check=False
        )
        assert other_node.returncode != 0 and "node-a" in other_node.stderr, other_node.stderr
        # RBAC: nothing beyond what the plugin calls
        denied_rbac = cluster.kubectl(
            "get", "secrets", "-n", "kube-system", kubeconfig=_as_plugin(cluster, user, "node-a"), check=False
        )
        assert denied_rbac.returncode != 0 and "forbidden" in denied_rbac.stderr.lower()
    finally:
        gone = cluster.kubectl(
            "delete", "resourceslice", "vap-own", kubeconfig=_as_plugin(cluster, user, "node-a"), check=False
        )
    assert gone.returncode == 0, f"the plugin may delete its own node's slice: {gone.stderr}"


def test_helm_install_in_dra_mode(cluster: ControlPlane, version: tuple[str, int]) -> None:
    """helm itself installs mode dra into the API server (objects created, NOTES for DRA), and uninstalls it."""
    minor = version[1]
    release, ns = "dra-install", "gpushare-dra-install"
    args = ["install", release, str(CHART_DIR), "--namespace", ns, "--create-namespace", "--set", "mode=dra"]
    args += ["--kubeconfig", str(cluster.admin_kubeconfig)]
    if minor < 34:
        with pytest.raises(HelmError, match=r"mode=dra needs Kubernetes 1\.34 or newer"):
            run_helm(*args)
        return
    if minor < 36:
        args += ["--set", "dra.consumableCapacityGate=true"]
    owned = cluster.kubectl("get", "deviceclass", DRIVER, "--ignore-not-found", "-o", "name").stdout.strip() == ""
    if not owned:  # another test's DeviceClass: a second release must not create it (values.yaml says so)
        args += ["--set", "dra.deviceClass.create=false"]
    try:
        out = run_helm(*args).stdout
        notes = out.split("NOTES:", 1)[1]
        assert "DRA (mode dra)" in notes and "resourceslices --field-selector spec.driver=gpushare.io" in notes
        assert "the admission webhook sets that schedulerName on pods whose" in notes  # dra.placement policy
        ds = json.loads(
            cluster.kubectl("get", "daemonset", "-n", ns, f"{release}-gpushare-dra-plugin", "-o", "json").stdout
        )
        assert ds["spec"]["template"]["spec"]["containers"][0]["command"] == ["share-dra"]
        got = cluster.kubectl("get", "validatingadmissionpolicy", f"{release}-gpushare-dra-plugin-node-slices")
        assert got.returncode == 0
        if owned:
            dc = json.loads(cluster.kubectl("get", "deviceclass", DRIVER, "-o", "json").stdout)
            assert dc["metadata"]["annotations"]["meta.helm.sh/release-name"] == release
        deployments = json.loads(cluster.kubectl("get", "deployments", "-n", ns, "-o", "json").stdout)["items"]
        names = sorted(d["metadata"]["name"] for d in deployments)
        assert names == [f"{release}-gpushare-scheduler", f"{release}-gpushare-webhook"]  # filter-only extender
        sched_config = cluster.kubectl(
            "get", "configmap", "-n", ns, f"{release}-gpushare-scheduler-config", "-o", "jsonpath={.data.*}"
        ).stdout
        assert "bindVerb" not in sched_config and "filterVerb: filter" in sched_config
    finally:
        run_helm("uninstall", release, "--namespace", ns, "--kubeconfig", str(cluster.admin_kubeconfig), "--wait")
    gone = cluster.kubectl("get", "daemonset", "-n", ns, f"{release}-gpushare-dra-plugin", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


# ------------------------------------------------------------------------------------------ samples


SAMPLE_FILES = sorted(p.name for p in SAMPLES.glob("*.yaml"))
CONVERTED = ["pod.yaml", "multi-container.yaml", "two-gpu.yaml", "gpu-model.yaml"]  # device-plugin samples


def test_every_sample_is_valid_for_the_api_server(cluster: ControlPlane, version: tuple[str, int]) -> None:
    minor = version[1]
    assert SAMPLE_FILES == ["gpu-model.yaml", "shared-claim.yaml", "template-4gi.yaml", "two-gpus.yaml"]
    if minor < 34:
        assert not _serves_dra(cluster)
        return
    ns = "dra-samples-valid"
    cluster.kubectl("create", "namespace", ns, check=False)
    for name in SAMPLE_FILES:
        docs = _docs(SAMPLES / name)
        assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "Pod"], name
        template, pod = docs
        # the template for real (CEL selectors compile, capacity and constraints validate), the pod as a dry run
        created = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(template), check=False)
        # the gate off: 1.35 drops distinctAttribute, which leaves a constraint with no kind (refused); 1.34
        # keeps the constraint but, as for every sample, drops the memory request (checked below)
        if minor < 36 and template["spec"]["spec"]["devices"].get("constraints") and created.returncode != 0:
            assert "matchAttribute: Required value" in created.stderr, created.stderr
            continue
        assert created.returncode == 0, f"{name}: {created.stderr}"
        dry = cluster.kubectl("create", "-n", ns, "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        assert dry.returncode == 0, f"{name}: {dry.stderr}"
        stored = json.loads(
            cluster.kubectl("get", "resourceclaimtemplate", "-n", ns, template["metadata"]["name"], "-o", "json").stdout
        )
        sent = template["spec"]["spec"]["devices"]
        kept = stored["spec"]["spec"]["devices"]
        sent_caps = [r["exactly"].get("capacity") for r in sent["requests"]]
        kept_caps = [r["exactly"].get("capacity") for r in kept["requests"]]
        if minor >= 36:
            # consumable capacity on by default: the request for memory (and distinctAttribute) is kept
            assert kept_caps == sent_caps, name
            assert kept.get("constraints") == sent.get("constraints"), name
        else:
            # 1.34/1.35 with the gate off (its default): the API server silently drops the memory request, a claim
            # would take a whole GPU. This is what the chart's refusal on these versions is about.
            assert all(c is None for c in kept_caps) and all(c for c in sent_caps), name
    cluster.kubectl("delete", "resourceclaimtemplates", "--all", "-n", ns, check=False)


# ------------------------------------------------------------------------------ allocation and inspect


def _gpu_slice(node: str, sim_gpus: str) -> Obj:
    """The node's slice exactly as share-dra publishes it (share_dra.slices over the sim backend's GPUs)."""
    return resource_slice(slice_spec(node, SimBackend(sim_gpus, node).gpus(), MemoryUnit.GiB, 1))


def _bare_node(admin: ApiServerClient, name: str) -> None:
    """A Node without a kubelet or any gpushare annotation: its GPUs exist only as a ResourceSlice."""
    create_node(
        admin,
        name,
        {"cpu": "64", "memory": "256Gi", "pods": "110"},
        {"gpushare": "true"},
        addresses=[{"type": "InternalIP", "address": "127.0.0.1"}],
    )


DEFAULT_PROFILE = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"


def _claims(admin: ApiServerClient, ns: str) -> list[Obj]:
    return admin.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims").get("items") or []


def _claim_of(claims: list[Obj], pod: str) -> Obj:
    found = [c for c in claims if any(r.get("name") == pod for r in (c.get("status") or {}).get("reservedFor") or [])]
    assert len(found) == 1, (pod, [c["metadata"]["name"] for c in claims])
    return found[0]


def test_real_scheduler_allocates_the_samples_and_inspect_shows_them(
    cluster: ControlPlane, version: tuple[str, int]
) -> None:
    git_version, minor = version
    if minor < 36:
        # Sharing needs consumable capacity, default from 1.36 (earlier: the test above shows it dropped).
        assert minor < 34 or not _dra_capacity_kept(cluster)
        return
    admin = ApiServerClient.from_kubeconfig(str(cluster.admin_kubeconfig), component="gpushare-tests")
    ns = "dra-samples-run"
    nodes = {"dra-a100": ("2xA100:80GiB", 80, 2), "dra-t4": ("2xT4:16GiB", 16, 2)}
    docs = render_chart(set_values={"mode": "dra"}, namespace=NAMESPACE, kube_version=git_version)
    device_class = next(d for d in docs if d["kind"] == "DeviceClass")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(device_class))
    cluster.kubectl("create", "namespace", ns, check=False)
    assert cluster.controller_manager is None, "another test left kube-controller-manager running"
    scheduler = None
    try:
        for node, (sim, _, _) in nodes.items():
            _bare_node(admin, node)
            cluster.kubectl("apply", "-f", "-", input=json.dumps(_gpu_slice(node, sim)))

        # The T4-only samples go first and are bound before the rest arrive: kube-scheduler spreads the
        # unrestricted pods over both nodes (LeastAllocated), and in whatever order it takes them they
        # could fill the two T4s before the pods that can use nothing else.
        def converted(names: list[str]) -> list[Obj]:
            # the device-plugin samples, rewritten by gpushare-dra-convert (the migration path)
            return convert_all([d for n in names for d in _docs(SAMPLES.parent / n)], MemoryUnit.GiB)[0]

        model_only = _docs(SAMPLES / "gpu-model.yaml") + converted(["gpu-model.yaml"])
        others = [d for name in SAMPLE_FILES if name != "gpu-model.yaml" for d in _docs(SAMPLES / name)]
        others += converted([n for n in CONVERTED if n != "gpu-model.yaml"])
        # the ResourceClaim controller makes each pod's claim from its template; kube-scheduler allocates it
        cluster.start_controller_manager(controllers=("resourceclaim-controller",))
        scheduler = cluster.launch_scheduler(DEFAULT_PROFILE, "dra-default-scheduler")
        got: dict[str, Obj] = {}
        for batch in (model_only, others):
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=_list(batch))
            pods = [d["metadata"]["name"] for d in batch if d["kind"] == "Pod"]
            deadline = time.monotonic() + 120
            while True:
                now = {p: admin.get_pod(ns, p) for p in pods}
                if all(g["spec"].get("nodeName") for g in now.values()):
                    got.update(now)
                    break
                assert time.monotonic() < deadline, {p: g.get("status") for p, g in now.items()}
                time.sleep(0.5)
        claims = _claims(admin, ns)
        placed = {p: g["spec"]["nodeName"] for p, g in got.items()}

        def results(pod: str) -> list[Obj]:
            return _claim_of(claims, pod)["status"]["allocation"]["devices"]["results"]

        r4 = results("gpushare-dra-4gi")
        assert [(r["driver"], r["consumedCapacity"]["memory"]) for r in r4] == [(DRIVER, "4Gi")]
        assert r4[0]["pool"] == placed["gpushare-dra-4gi"] and r4[0].get("shareID")
        shared = results("gpushare-dra-shared")
        assert [r["consumedCapacity"]["memory"] for r in shared] == ["6Gi"], "one claim, consumed once"
        two = results("gpushare-dra-two-gpus")
        assert sorted(r["request"] for r in two) == ["gpu-a", "gpu-b"]
        assert len({r["device"] for r in two}) == 2, "distinctAttribute: two different GPUs"
        assert all(r["consumedCapacity"]["memory"] == "8Gi" for r in two)
        assert placed["gpushare-dra-t4"] == "dra-t4", "the CEL model selector picks a T4"
        # the converted device-plugin samples: each claim consumed what its container's limit asked
        by_pod: dict[str, list[Obj]] = {}
        for c in claims:
            for ref in c["status"].get("reservedFor") or []:
                by_pod.setdefault(ref["name"], []).append(c)

        def consumed(pod: str) -> list[list[str]]:
            return sorted(
                [r["consumedCapacity"]["memory"] for r in c["status"]["allocation"]["devices"]["results"]]
                for c in by_pod[pod]
            )

        assert consumed("gpushare-pod") == [["4Gi"]]
        assert consumed("gpushare-multi-container") == [["2Gi"], ["3Gi"]], "one claim per container"
        (two_claim,) = by_pod["gpushare-two-gpu"]
        results = two_claim["status"]["allocation"]["devices"]["results"]
        assert [r["consumedCapacity"]["memory"] for r in results] == ["8Gi", "8Gi"]
        assert len({r["device"] for r in results}) == 2, "gpu-count 2: two different GPUs"
        assert placed["gpushare-gpu-model"] == "dra-t4", "gpu-model T4 became a CEL selector"

        # kubectl inspect gpushare: the same figures, per GPU, from the API
        out, err = io.StringIO(), io.StringIO()
        code = inspect_main(
            ["--kubeconfig", str(cluster.admin_kubeconfig), "-o", "json", *nodes], stdout=out, stderr=err
        )
        assert code == 0, err.getvalue()
        shown = {n["name"]: n for n in json.loads(out.getvalue())["nodes"]}
        assert set(shown) == set(nodes) and all(n["mode"] == "dra" for n in shown.values())
        expected: dict[tuple[str, str], int] = {}
        for c in claims:
            for r in c["status"]["allocation"]["devices"]["results"]:
                key = (r["pool"], r["device"])
                expected[key] = expected.get(key, 0) + int(r["consumedCapacity"]["memory"].removesuffix("Gi"))
        for name, n in shown.items():
            assert n["total"] == nodes[name][2] * nodes[name][1]
            for g in n["gpus"]:
                assert g["allocated"] == expected.get((name, f"gpu-{g['index']}"), 0), (name, g)
        assert sum(n["allocated"] for n in shown.values()) == (4 + 6 + 8 + 8 + 4) + (4 + 3 + 2 + 8 + 8 + 4)
        rows = {p["name"]: p for n in shown.values() for p in n["pods"]}
        assert rows["gpushare-dra-shared"]["allocated"] == 6 and rows["gpushare-dra-shared"]["claim"]
        assert rows["gpushare-dra-4gi"]["state"] == "allocating", "bound, not running: no kubelet here"
    finally:
        if scheduler is not None:
            scheduler.process.stop()
        cluster.stop_controller_manager()
        _cleanup(cluster, admin, ns, list(nodes))


def _dra_capacity_kept(cluster: ControlPlane) -> bool:
    """Does this API server keep a device's shared capacity (consumable capacity on)?"""
    probe = _gpu_slice("capacity-probe", "1xT4:16GiB")
    out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe))
    return "allowMultipleAllocations" in json.loads(out.stdout)["spec"]["devices"][0]


def _cleanup(cluster: ControlPlane, admin: ApiServerClient, ns: str, nodes: list[str]) -> None:
    for pod in admin.list_pods(field_selector=None).items:
        if pod["metadata"]["namespace"] == ns:
            admin.request(
                "DELETE", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}", query={"gracePeriodSeconds": 0}
            )
    for c in _claims(admin, ns):
        path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{c['metadata']['name']}"
        try:  # nobody runs the controller that lifts its finalizer now
            admin.request(
                "PATCH", path, body={"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
            )
            admin.request("DELETE", path)
        except KubeError:
            pass
    cluster.kubectl("delete", "resourceclaimtemplates", "--all", "-n", ns, check=False)
    for node in nodes:
        cluster.kubectl("delete", "resourceslice", f"{node}-{DRIVER}", "--ignore-not-found", check=False)
        cluster.kubectl("delete", "node", node, "--ignore-not-found", check=False)
    cluster.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found", check=False)
