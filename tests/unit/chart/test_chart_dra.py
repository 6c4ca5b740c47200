"""charts/gpushare in DRA mode, rendered by the real helm: which parts each mode installs, the DeviceClass,
the share-dra DaemonSet, its RBAC and node-scoped slice policy, per-node coexistence with the device
plugin, and the clear refusals on clusters that cannot run DRA sharing."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from share_core.contract import DEFAULT_DRA_PLUGIN_DIR
from share_core.contract import DEFAULT_PLUGINS_REGISTRY_DIR
from share_core.contract import DRA_DEVICE_CLASS
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import DRA_REGISTRATION_SOCKET_NAME
from share_core.contract import DRA_SOCKET_NAME
from tests.unit.chart import helm as h
from tests.unit.chart.helm import ALL_OPTIONS
from tests.unit.chart.helm import HelmError
from tests.unit.chart.helm import Obj
from tests.unit.chart.test_chart_render import _flatten

MODE_LABEL = "gpushare.io/mode"

KUBE = "v1.36.3"
DRA_KINDS = {"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def render(mode: str, kube: str = KUBE, values: Iterable[Any] = (), **more: Any) -> list[Obj]:
    return h.render_chart(values, {"mode": mode, **more}, kube_version=kube)


def by_component(docs: Iterable[Obj], kind: str, comp: str) -> Obj:
    return h.component(h.objects(docs, kind), kind, comp)


def spec_of(ds: Obj) -> Obj:
    return ds["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def dra_docs(helm: Any) -> list[Obj]:
    return render("dra")


@pytest.fixture(scope="module")
def both_docs(helm: Any) -> list[Obj]:
    return render("both")


@pytest.fixture(scope="module")
def both_all_docs(helm: Any) -> list[Obj]:
    return render("both", values=[ALL_OPTIONS])


# ----------------------------------------------------------------------------------- what each mode has


def test_default_mode_is_the_device_plugin_with_nothing_of_dra(helm: Any) -> None:
    docs = h.render_chart(kube_version=KUBE)
    assert not {d["kind"] for d in docs} & DRA_KINDS
    assert [d["metadata"]["name"] for d in h.objects(docs, "DaemonSet")] == ["gpushare-device-plugin"]
    assert h.objects(docs, "Deployment"), "the extender's scheduler"


def test_dra_mode_with_kube_schedulers_placement_installs_the_driver_and_no_extender(helm: Any) -> None:
    docs = render("dra", **{"dra.placement": "kube-scheduler"})
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
    ), kinds
    assert h.one(docs, "DaemonSet")["metadata"]["name"] == "gpushare-dra-plugin"
    # no scheduler, no extender configuration, no uninstall hook for the device plugin's annotations
    assert not {"Deployment", "Service", "Job", "Role"} & set(kinds)
    config = yaml.safe_load(h.one(docs, "ConfigMap")["data"]["config.yaml"])
    assert set(config) == {"apiVersion", "kind", "dra"} and "policy" not in config["dra"]
    plugin_role = next(r for r in h.objects(docs, "ClusterRole") if r["metadata"]["name"] == "gpushare-dra-plugin")
    assert {"resources": ["resourceclaims"], "verbs": ["get"]} in [
        {k: v for k, v in rule.items() if k != "apiGroups"} for rule in plugin_role["rules"]
    ]


def test_dra_mode_places_claims_by_the_policy_through_a_filter_only_extender(dra_docs: list[Obj]) -> None:
    deployments = [d["metadata"]["name"] for d in h.objects(dra_docs, "Deployment")]
    assert deployments == ["gpushare-scheduler", "gpushare-webhook"]
    configs = {c["metadata"]["name"]: c for c in h.objects(dra_docs, "ConfigMap")}
    program = yaml.safe_load(configs["gpushare-config"]["data"]["config.yaml"])
    assert program["scheduler"]["dra"] is True
    assert program["dra"]["policy"] == program["scheduler"]["policy"] == "frag"  # one policy value, both parts
    sched = yaml.safe_load(configs["gpushare-scheduler-config"]["data"]["scheduler-config.yaml"])
    (extender,) = sched["extenders"]
    assert extender["filterVerb"] == "filter" and "bindVerb" not in extender  # kube-scheduler binds DRA pods
    assert "preemptVerb" not in extender  # kube-scheduler's DRA plugin weighs a claim's devices itself
    assert "managedResources" not in extender
    roles = {r["metadata"]["name"]: r["rules"] for r in h.objects(dra_docs, "ClusterRole")}
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "resourceclaims"],
            "verbs": ["get", "list", "watch"]} in roles["gpushare-extender"]  # fmt: skip
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
            "verbs": ["get", "list", "watch"]} in roles["gpushare-dra-plugin"]  # fmt: skip


def test_the_webhook_sends_pods_with_our_claims_to_the_scheduler_without_blocking_others(
    dra_docs: list[Obj],
) -> None:
    (mutating,) = h.objects(dra_docs, "MutatingWebhookConfiguration")
    hooks = {w["name"]: w for w in mutating["webhooks"]}
    claims = hooks["claims-scheduler.gpushare.io"]
    assert claims["failurePolicy"] == "Ignore"  # pods with other drivers' claims never wait on us
    conditions = {c["name"]: c["expression"] for c in claims["matchConditions"]}
    assert conditions["names-claims"].startswith("has(object.spec.resourceClaims) && !(")
    assert hooks["scheduler.gpushare.io"]["failurePolicy"] == "Fail"
    configs = {c["metadata"]["name"]: c for c in h.objects(dra_docs, "ConfigMap")}
    assert yaml.safe_load(configs["gpushare-config"]["data"]["config.yaml"])["webhook"]["dra"] is True
    roles = {r["metadata"]["name"]: r["rules"] for r in h.objects(dra_docs, "ClusterRole")}
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"],
            "verbs": ["get"]} in roles["gpushare-webhook"]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "value", "want"), [("dra", None, 0), ("both", None, 100), ("deviceplugin", None, 100), ("dra", 40, 40)]
)
def test_how_many_nodes_the_policy_chooses_among(helm: Any, mode: str, value: int | None, want: int) -> None:
    """Mode dra: kube-scheduler's adaptive sample (its DRA Filter allocates on every node it looks at)."""
    more = {} if value is None else {"scheduler.percentageOfNodesToScore": value}
    docs = render(mode, **more) if mode != "deviceplugin" else h.render_chart([], more, kube_version=KUBE)
    assert h.scheduler_config(docs)["percentageOfNodesToScore"] == want


def test_both_modes_bind_through_the_extender_and_place_claims_too(both_docs: list[Obj]) -> None:
    configs = {c["metadata"]["name"]: c for c in h.objects(both_docs, "ConfigMap")}
    sched = yaml.safe_load(configs["gpushare-scheduler-config"]["data"]["scheduler-config.yaml"])
    assert sched["extenders"][0]["bindVerb"] == "bind"  # device-plugin pods get their GPU annotations
    assert yaml.safe_load(configs["gpushare-config"]["data"]["config.yaml"])["scheduler"]["dra"] is True


def test_dra_mode_ignores_the_device_plugin_and_scheduler_switches(helm: Any) -> None:
    docs = render("dra", **{"devicePlugin.enabled": True, "scheduler.enabled": True})
    assert [d["metadata"]["name"] for d in h.objects(docs, "DaemonSet")] == ["gpushare-dra-plugin"]


def test_both_mode_has_every_part(both_docs: list[Obj]) -> None:
    names = sorted(d["metadata"]["name"] for d in h.objects(both_docs, "DaemonSet"))
    assert names == ["gpushare-device-plugin", "gpushare-dra-plugin"]
    assert h.objects(both_docs, "Deployment") and h.one(both_docs, "DeviceClass")


def test_device_class_selects_the_driver(dra_docs: list[Obj]) -> None:
    dc = h.one(dra_docs, "DeviceClass")
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["metadata"]["name"] == DRA_DEVICE_CLASS and "namespace" not in dc["metadata"]
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRA_DRIVER_NAME}"'}}]


def test_device_class_can_be_left_to_another_release(helm: Any) -> None:
    docs = render("dra", **{"dra.deviceClass.create": False})
    assert not h.objects(docs, "DeviceClass") and h.objects(docs, "DaemonSet")


# ------------------------------------------------------------------------------------- versions


@pytest.mark.parametrize("cluster", ["v1.33.0", "v1.33.5-eks-1a2b3c4"])
@pytest.mark.parametrize("mode", ["dra", "both"])
def test_dra_refused_before_1_34_saying_why(helm: Any, cluster: str, mode: str) -> None:
    with pytest.raises(HelmError) as err:
        render(mode, cluster)
    message = str(err.value)
    assert f"mode={mode} needs Kubernetes 1.34 or newer" in message, message
    assert "mode=deviceplugin" in message
    assert h.render_chart(kube_version=cluster), "the device plugin mode still installs there"


@pytest.mark.parametrize("cluster", ["v1.34.1-gke.1200", "v1.35.4+k3s1"])
def test_dra_on_1_34_and_1_35_needs_the_consumable_capacity_gate(helm: Any, cluster: str) -> None:
    with pytest.raises(HelmError) as err:
        render("dra", cluster)
    assert "DRAConsumableCapacity" in str(err.value) and "dra.consumableCapacityGate=true" in str(err.value)
    docs = render("dra", cluster, **{"dra.consumableCapacityGate": True})
    assert h.one(docs, "DeviceClass")


@pytest.mark.parametrize("cluster", ["v1.36.0", "v1.37.2"])
def test_dra_installs_on_1_36_and_later_without_the_gate_flag(helm: Any, cluster: str) -> None:
    assert h.one(render("dra", cluster), "DeviceClass")


# ------------------------------------------------------------------------------------- the DaemonSet


def test_dra_daemonset_mounts_sockets_and_cdi(dra_docs: list[Obj]) -> None:
    ds = h.one(dra_docs, "DaemonSet")
    spec = spec_of(ds)
    assert spec["serviceAccountName"] == "gpushare-dra-plugin"
    assert spec["nodeSelector"] == {"gpushare": "true"} and "affinity" not in spec
    assert spec["priorityClassName"] == "system-node-critical"
    c = h.container(ds, "dra-plugin")
    assert c["command"] == ["share-dra"] and c["image"] == "ghcr.io/gpushare/gpushare:0.1.0"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert mounts["plugins-registry"] == host["plugins-registry"] == DEFAULT_PLUGINS_REGISTRY_DIR
    assert mounts["plugins"] == host["plugins"] == "/var/lib/kubelet/plugins"
    assert mounts["cdi"] == host["cdi"] == "/var/run/cdi"
    assert mounts["nvidia-cdi-0"] == host["nvidia-cdi-0"] == "/etc/cdi", "NVIDIA's spec, read only"
    assert "nvidia-cdi-1" not in mounts, "/var/run/cdi is mounted already (read-write)"
    args = share_dra_args(dra_docs, ds)
    assert args.plugin_dir == DEFAULT_DRA_PLUGIN_DIR and args.plugins_registry_dir == DEFAULT_PLUGINS_REGISTRY_DIR
    assert args.cdi_dir == "/var/run/cdi" and args.cdi_spec_dirs == "/etc/cdi,/var/run/cdi"
    assert (args.backend, args.memory_unit, args.device_id_strategy) == ("nvml", "GiB", "uuid")
    assert args.health_check is True and args.unhealthy == "withdraw" and args.log_level == "INFO"
    assert (
        args.sim_gpus != "2xA100:80GiB"
        and "simGpus" not in h.one(dra_docs, "ConfigMap", "gpushare-config")["data"]["config.yaml"]
    )
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    probe = c["livenessProbe"]["exec"]["command"]
    assert f"{DEFAULT_DRA_PLUGIN_DIR}/{DRA_SOCKET_NAME}" in probe
    assert f"{DEFAULT_PLUGINS_REGISTRY_DIR}/{DRA_REGISTRATION_SOCKET_NAME}" in probe
    # --hard-limit auto (the default): the host's cgroup tree at its own path, and SYS_ADMIN for NVML's limit calls
    assert (args.hard_limit, args.cgroup_root) == ("auto", "/sys/fs/cgroup")
    assert mounts["cgroup"] == host["cgroup"] == "/sys/fs/cgroup"
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]} and sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False


def test_dra_hard_limit_off_adds_no_capability(helm: Any) -> None:
    docs = h.render_chart(set_values={"mode": "dra", "dra.hardLimit": "off"}, kube_version="v1.36.3")
    ds = h.one(docs, "DaemonSet")
    c = h.container(ds, "dra-plugin")
    assert share_dra_args(docs, ds).hard_limit == "off"
    assert "cgroup" not in {m["name"] for m in c["volumeMounts"]}
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def share_dra_args(docs: list[Obj], ds: Obj) -> Any:
    """The chart's settings (its ConfigMap and args) as share-dra itself reads them: a field or flag it
    does not know fails here."""
    from share_dra.cli import build_parser

    return h.program_args(docs, ds, "dra-plugin", build_parser())


def test_dra_daemonset_all_options(both_all_docs: list[Obj]) -> None:
    ds = by_component(both_all_docs, "DaemonSet", "dra-plugin")
    spec = spec_of(ds)
    c = h.container(ds, "dra-plugin")
    assert c["image"] == "registry.example.com/gpushare/gpushare:0.1.0-test" and c["imagePullPolicy"] == "Always"
    assert c["args"][-1] == "--some-flag=1"
    without_extra = copy.deepcopy(ds)  # the flag is not share-dra's: parse the rest
    h.container(without_extra, "dra-plugin")["args"] = c["args"][:-1]
    args = share_dra_args(both_all_docs, without_extra)
    assert (args.backend, args.sim_gpus) == ("sim", "2xA100:80GiB")
    assert args.plugins_registry_dir == "/var/lib/k0s/kubelet/plugins_registry"
    assert args.plugin_dir == "/var/lib/k0s/kubelet/plugins/gpushare.io"
    assert args.cdi_dir == "/etc/cdi" and args.cdi_spec_dirs == "/etc/cdi,/opt/nvidia/cdi"
    assert (args.memory_unit, args.device_id_strategy, args.health_check, args.unhealthy) == (
        "MiB",
        "index",
        False,
        "taint",
    )
    assert args.log_level == "DEBUG"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert "nvidia-cdi-0" not in mounts, "/etc/cdi is the CDI dir here: mounted once, read-write"
    assert mounts["nvidia-cdi-1"]["mountPath"] == "/opt/nvidia/cdi" and mounts["nvidia-cdi-1"]["readOnly"] is True
    assert spec["runtimeClassName"] == "nvidia" and spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert c["resources"]["limits"]["memory"] == "128Mi"
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 2
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/dra"] == "yes" and set(annotations) == {"example.com/dra", "checksum/config"}
    assert ds["spec"]["template"]["metadata"]["labels"]["tier"] == "gpu-dra"
    assert ds["metadata"]["labels"]["team"] == "ml-platform"


def test_unhealthy_taint_needs_1_36(helm: Any) -> None:
    with pytest.raises(HelmError, match=r"dra\.unhealthy=taint needs device taints"):
        render("dra", "v1.35.4", **{"dra.consumableCapacityGate": True, "dra.unhealthy": "taint"})
    assert render("dra", "v1.36.0", **{"dra.unhealthy": "taint"})


def test_dra_sim_backend_needs_gpus(helm: Any) -> None:
    with pytest.raises(HelmError, match=r"dra\.simGpus"):
        render("dra", **{"dra.backend": "sim"})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "hybrid"}, "mode"),
        ({"dra.backend": "rocm"}, "backend"),
        ({"dra.cdiDir": "var/run/cdi"}, "cdiDir"),
        ({"dra.consumableCapacityGate": "yes"}, "consumableCapacityGate"),
        ({"dra.bogus": 1}, "bogus"),
        ({"dra.unhealthy": "evict"}, "unhealthy"),
        ({"dra.nvidiaCdiSpecDirs": ["etc/cdi"]}, "nvidiaCdiSpecDirs"),
    ],
)
def test_schema_rejects_bad_dra_values(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        h.render_chart(set_values=values, kube_version=KUBE)


# ------------------------------------------------------------------------------------- coexistence


def _required_terms(ds: Obj) -> list[Obj]:
    return spec_of(ds)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


def _runs_on(ds: Obj, labels: dict[str, str]) -> bool:
    """Would the DaemonSet's pod go to a node with these labels? nodeSelector AND (any term: all expressions)."""
    spec = spec_of(ds)
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    if "affinity" not in spec:
        return True

    def holds(e: Obj) -> bool:
        if e["operator"] == "In":
            return labels.get(e["key"]) in e["values"]
        if e["operator"] == "NotIn":
            return labels.get(e["key"]) not in e["values"]
        raise AssertionError(e)

    return any(all(holds(e) for e in t.get("matchExpressions", [])) for t in _required_terms(ds))


@pytest.mark.parametrize("fixture", ["both_docs", "both_all_docs"])
def test_both_mode_gives_each_node_exactly_one_plugin(request: pytest.FixtureRequest, fixture: str) -> None:
    docs = request.getfixturevalue(fixture)
    dp = by_component(docs, "DaemonSet", "device-plugin")
    dra = by_component(docs, "DaemonSet", "dra-plugin")
    base = {"gpushare": "true", "nvidia.com/gpu.present": "true", "kubernetes.io/arch": "amd64"}
    for extra, expected in [
        ({}, "device-plugin"),
        ({MODE_LABEL: "deviceplugin"}, "device-plugin"),
        ({MODE_LABEL: "dra"}, "dra"),
    ]:
        labels = {**base, **extra}
        got = [name for name, ds in (("device-plugin", dp), ("dra", dra)) if _runs_on(ds, labels)]
        assert got == [expected], (extra, got)
    assert not _runs_on(dra, {MODE_LABEL: "dra"}), "gpushare=true still turns a node on"


def test_both_mode_keeps_the_users_affinity_terms(both_all_docs: list[Obj]) -> None:
    dra = by_component(both_all_docs, "DaemonSet", "dra-plugin")
    terms = _required_terms(dra)
    assert len(terms) == 2, "the user's two ORed terms stay two"
    for t, arch in zip(terms, ("amd64", "arm64"), strict=True):
        assert {"key": "kubernetes.io/arch", "operator": "In", "values": [arch]} in t["matchExpressions"]
        assert {"key": MODE_LABEL, "operator": "In", "values": ["dra"]} in t["matchExpressions"]
    assert not _runs_on(dra, {"gpushare": "true", "nvidia.com/gpu.present": "true", "kubernetes.io/arch": "s390x"})


def test_device_plugin_affinity_unchanged_outside_both_mode(helm: Any) -> None:
    docs = h.render_chart(kube_version=KUBE)
    assert "affinity" not in spec_of(h.one(docs, "DaemonSet"))


# ------------------------------------------------------------------------------------------- RBAC


def test_dra_rbac_is_exactly_what_the_plugin_calls(dra_docs: list[Obj]) -> None:
    rules = _flatten(h.cluster_role_rules(dra_docs, "dra-plugin"))
    # exactly share_dra/kubeapi.py's calls (tests/integration/test_dra.py runs the plugin with these rules),
    # and share_dra/order.py's claim watch (the device order of dra.placement policy, the default)
    slices = {("resource.k8s.io", "resourceslices", v, ()) for v in ("list", "create", "update", "delete")}
    claims = {("resource.k8s.io", "resourceclaims", v, ()) for v in ("get", "list", "watch")}
    assert rules == slices | claims
    binding = h.component(h.objects(dra_docs, "ClusterRoleBinding"), "ClusterRoleBinding", "dra-plugin")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpushare-dra-plugin", "namespace": h.DEFAULT_NAMESPACE}
    ]


def test_slice_writes_are_node_scoped_by_policy(dra_docs: list[Obj]) -> None:
    vap = h.one(dra_docs, "ValidatingAdmissionPolicy")
    spec = vap["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    (cond,) = spec["matchConditions"]
    assert f'"system:serviceaccount:{h.DEFAULT_NAMESPACE}:gpushare-dra-plugin"' in cond["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["tokenNode"]
    assert "oldObject" in variables["sliceNode"] and "nodeName" in variables["sliceNode"]
    assert [v["expression"] for v in spec["validations"]] == [
        "variables.tokenNode != ''",
        "variables.tokenNode == variables.sliceNode",
    ]
    binding = h.one(dra_docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}


def test_no_rbac_no_policy(helm: Any) -> None:
    docs = render("dra", **{"rbac.create": False, "serviceAccount.create": False})
    scheduler = {"Deployment", "Service", "PodDisruptionBudget"}  # the extender of dra.placement policy
    webhook = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}  # and the webhook
    assert {d["kind"] for d in docs} == {"DaemonSet", "DeviceClass", "ConfigMap", *scheduler, *webhook}


@pytest.mark.parametrize("mode", ["dra", "both"])
def test_lint_dra_modes(helm: Any, mode: str) -> None:
    """helm lint --strict (it renders for its own default cluster version, which has DRA on)."""
    h.lint([ALL_OPTIONS], {"mode": mode})
