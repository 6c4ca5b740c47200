"""charts/gpushare rendered by the real helm: lint, schema, and the facts each object must keep.

One piece: every test reads the module's few helm renderings (module-scoped fixtures; each render costs
seconds of helm).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_plugin.node import PluginNode
from tests.unit.chart import helm as h
from tests.unit.chart.helm import ALL_OPTIONS
from tests.unit.chart.helm import DEFAULT_NAMESPACE
from tests.unit.chart.helm import MONITORING_API
from tests.unit.chart.helm import HelmError
from tests.unit.chart.helm import Obj

KUBE_VERSION = "v1.36.3"


@pytest.fixture(scope="module")
def default_docs(helm: Any) -> list[Obj]:
    return h.render_chart(kube_version=KUBE_VERSION)


@pytest.fixture(scope="module")
def all_docs(helm: Any) -> list[Obj]:
    return h.render_chart([ALL_OPTIONS], kube_version=KUBE_VERSION, api_versions=[MONITORING_API])


@pytest.fixture(scope="module")
def all_values() -> dict[str, Any]:
    return yaml.safe_load(ALL_OPTIONS.read_text())


def _both(request: pytest.FixtureRequest) -> list[Obj]:
    return request.getfixturevalue(request.param)


both = pytest.mark.parametrize("docs", ["default_docs", "all_docs"], indirect=True)


@pytest.fixture
def docs(request: pytest.FixtureRequest) -> list[Obj]:
    return _both(request)


def daemonset(docs: Iterable[Obj]) -> Obj:
    return h.one(docs, "DaemonSet")


def deployment(docs: Iterable[Obj]) -> Obj:
    return h.component(docs, "Deployment", "scheduler")


def plugin_args(docs: list[Obj]) -> Any:
    """The chart's settings (its ConfigMap and args) as share-plugin itself reads them."""
    from share_plugin.cli import build_parser

    return h.program_args(docs, daemonset(docs), "device-plugin", build_parser())


def extender_args(docs: list[Obj]) -> Any:
    """The chart's settings (its ConfigMap and args) as share-scheduler itself reads them."""
    from share_scheduler.cli import build_parser

    return h.program_args(docs, deployment(docs), "extender", build_parser())


def pod_spec(workload: Obj) -> Obj:
    return workload["spec"]["template"]["spec"]


# ------------------------------------------------------------------------------------ lint, schema


def test_lint_default_values(helm: Any) -> None:
    h.lint()


def test_lint_all_options(helm: Any) -> None:
    h.lint([ALL_OPTIONS])


def test_all_options_sets_every_key_of_values_yaml() -> None:
    """all-options.yaml is the file that turns everything on: it must not miss a key."""

    def paths(d: Any, prefix: str = "") -> set[str]:
        if not isinstance(d, dict) or not d:
            return {prefix}
        out: set[str] = set()
        for k, v in d.items():
            # free-form maps (labels, resources, securityContext...) count as one key
            leaf = k in {"resources", "securityContext", "podSecurityContext", "affinity", "updateStrategy"}
            out |= {f"{prefix}{k}"} if leaf else paths(v, f"{prefix}{k}.")
        return out

    defaults = yaml.safe_load((h.CHART_DIR / "values.yaml").read_text())
    every = yaml.safe_load(ALL_OPTIONS.read_text())
    missing = {p.rstrip(".") for p in paths(defaults)} - {p.rstrip(".") for p in paths(every)}
    # empty maps in values.yaml are leaves there, set to something in all-options
    missing = {m for m in missing if not any(p.startswith(m + ".") for p in paths(every))}
    assert not missing, f"all-options.yaml misses {sorted(missing)}"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"memoryUnit": "KiB"}, "memoryUnit"),
        ({"scheduler.policy": "worstfit"}, "policy"),
        ({"scheduler.port": 0}, "port"),
        ({"scheduler.replicas": 0}, "replicas"),
        ({"devicePlugin.deviceIdStrategy": "serial"}, "deviceIdStrategy"),
        ({"devicePlugin.healthCheck": "yes"}, "healthCheck"),
        ({"devicePlugin.backend": "rocm"}, "backend"),
        ({"logLevel": "verbose"}, "logLevel"),
        ({"scheduler.bogus": 1}, "bogus"),
        ({"serviceMonitor.enabled": "true"}, "enabled"),
        ({"devicePlugin.deviceListStrategy": "annotations"}, "deviceListStrategy"),
        ({"devicePlugin.monitor.overLimit": "evict"}, "overLimit"),
        ({"devicePlugin.monitor.interval": 0}, "interval"),
        ({"devicePlugin.mpsRoot": "run/mps"}, "mpsRoot"),
        ({"reservations.maxShare": 1.5}, "maxShare"),
        ({"consolidation.enabled": "yes"}, "enabled"),
        ({"reservations.leaveRoom": "maybe"}, "leaveRoom"),
    ],
)
def test_schema_rejects_bad_values(helm: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError, match=message):
        h.render_chart(set_values=values)


def test_several_replicas_need_leader_election(helm: Any) -> None:
    with pytest.raises(HelmError, match="leaderElection"):
        h.render_chart(set_values={"scheduler.replicas": 2, "scheduler.leaderElection.enabled": False})
    docs = h.render_chart(set_values={"scheduler.replicas": 1, "scheduler.leaderElection.enabled": False})
    assert h.scheduler_config(docs)["leaderElection"] == {"leaderElect": False}
    assert not h.objects(docs, "Role", "gpushare-scheduler"), "no lease Role without leader election"
    assert not h.objects(docs, "PodDisruptionBudget", "gpushare-scheduler"), "no PDB for a single replica"


def test_sim_backend_needs_gpus(helm: Any) -> None:
    with pytest.raises(HelmError, match="simGpus"):
        h.render_chart(set_values={"devicePlugin.backend": "sim"})


def test_components_can_be_turned_off(helm: Any) -> None:
    only_plugin = h.render_chart(set_values={"scheduler.enabled": False})
    assert not h.objects(only_plugin, "Deployment")
    assert [c["metadata"]["name"] for c in h.objects(only_plugin, "ConfigMap")] == ["gpushare-config"]
    assert "scheduler" not in yaml.safe_load(h.one(only_plugin, "ConfigMap")["data"]["config.yaml"])
    assert h.objects(only_plugin, "DaemonSet")
    only_sched = h.render_chart(set_values={"devicePlugin.enabled": False})
    assert not h.objects(only_sched, "DaemonSet")
    assert {d["metadata"]["name"] for d in h.objects(only_sched, "ClusterRole")} == {
        "gpushare-extender",
        "gpushare-webhook",
    }
    no_rbac = h.render_chart(set_values={"rbac.create": False, "serviceAccount.create": False})
    kinds = {d["kind"] for d in no_rbac}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"}


# ------------------------------------------------------------------------------------------- RBAC

RBAC_KINDS = ("ClusterRole", "Role")


def _rules(docs: Iterable[Obj]) -> list[tuple[str, Obj]]:
    return [(f"{d['kind']}/{d['metadata']['name']}", r) for d in docs if d["kind"] in RBAC_KINDS for r in d["rules"]]


@both
def test_rbac_has_no_wildcards(docs: list[Obj]) -> None:
    rules = _rules(docs)
    assert rules
    for where, rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in (rule.get(field) or []), f"{where}: wildcard in {field}: {rule}"
        assert not rule.get("nonResourceURLs"), f"{where}: non-resource URLs are not needed"
    for d in docs:
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert d["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), d["metadata"]["name"]


def _flatten(rules: Iterable[Obj]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {
        (g, res, v, tuple(r.get("resourceNames") or ()))
        for r in rules
        for g in r["apiGroups"]
        for res in r["resources"]
        for v in r["verbs"]
    }


def test_device_plugin_rbac_is_exactly_what_it_calls(default_docs: list[Obj]) -> None:
    rules = _flatten(h.cluster_role_rules(default_docs, "device-plugin"))
    assert rules == {
        ("", "nodes", "get", ()),
        ("", "nodes", "list", ()),  # the uninstall hook: share-plugin --unpublish
        ("", "nodes", "patch", ()),
        ("", "nodes/status", "patch", ()),
        ("", "pods", "get", ()),
        ("", "pods", "list", ()),
        ("", "pods", "watch", ()),
        ("", "pods", "patch", ()),
        ("", "events", "create", ()),
    }


def test_extender_rbac_is_exactly_what_it_calls(default_docs: list[Obj]) -> None:
    rules = _flatten(h.cluster_role_rules(default_docs, "scheduler"))
    assert rules == {
        ("", "nodes", "get", ()),
        ("", "nodes", "list", ()),
        ("", "nodes", "watch", ()),
        ("", "pods", "get", ()),
        ("", "pods", "list", ()),
        ("", "pods", "watch", ()),
        ("", "pods", "patch", ()),  # the gpushare.io/holds annotation of a reservation
        ("", "pods/binding", "create", ()),  # the assignment annotations travel on the Binding
        ("", "pods", "patch", ()),  # preemption: the gpushare.io/holds annotation on the preemptor
        ("", "pods", "delete", ()),  # preemption where kube-scheduler has no candidate: the victims
        ("", "pods/status", "patch", ()),  # ... marked DisruptionTarget first, as kube-scheduler does
        ("policy", "poddisruptionbudgets", "list", ()),  # preemption ranks candidates by PDB violations
        ("policy", "poddisruptionbudgets", "watch", ()),
        ("", "events", "create", ()),
        ("events.k8s.io", "events", "create", ()),
    }


def test_only_consolidation_may_evict(default_docs: list[Obj], all_docs: list[Obj]) -> None:
    """Evictions through the Eviction API only when consolidation is on (all-options turns it on)."""
    assert ("", "pods/eviction", "create", ()) not in _flatten(h.cluster_role_rules(default_docs, "scheduler"))
    assert ("", "pods/eviction", "create", ()) in _flatten(h.cluster_role_rules(all_docs, "scheduler"))


def test_waiting_pod_values_reach_the_extender(default_docs: list[Obj], all_docs: list[Obj]) -> None:
    default = extender_args(default_docs)
    from share_scheduler.starvation import StarvationConfig

    config = StarvationConfig()  # the chart's defaults are the extender's, which are share-sim's
    assert (default.reservations, default.reserve_after, default.max_reservations) == (
        True,
        config.wait_threshold,
        config.max_reservations,
    )
    assert (default.reservation_share, default.hold_seconds, default.consolidation) == (
        config.max_share,
        config.hold_seconds,
        False,
    )
    assert (default.remedy_min_gpus, default.evictions_per_minute) == (config.min_gpus, config.evictions_per_minute)
    every = extender_args(all_docs)
    assert (every.reservations, every.reserve_after, every.max_reservations, every.remedy_min_gpus) == (
        False,
        120,
        2,
        1,
    )
    assert (every.reservation_share, every.hold_seconds) == (0.1, 300)
    # Reservations never yield unless told (a null value renders nothing, so the flag keeps its default).
    assert (default.hold_yield_after, config.yield_after, every.hold_yield_after) == (None, None, 45.0)
    assert (every.consolidation, every.consolidation_max_moves, every.evictions_per_minute) == (True, 1, 3)


def test_leave_room_value_reaches_the_extender(default_docs: list[Obj], all_docs: list[Obj]) -> None:
    """reservations.leaveRoom renders share-scheduler's --leave-room: on by default in the chart (the flag
    itself defaults to off), off when set false."""
    from share_scheduler.cli import starvation_config

    default, every = extender_args(default_docs), extender_args(all_docs)
    # (Read through share-scheduler's own --config parsing: an unquoted `on` in the ConfigMap would be
    # YAML's true, which the flag refuses.)
    assert (default.leave_room, starvation_config(default).leave_room) == ("on", True)
    assert (every.leave_room, starvation_config(every).leave_room) == ("off", False)


@both
def test_kube_scheduler_rbac(docs: list[Obj]) -> None:
    dep = deployment(docs)
    sa = pod_spec(dep)["serviceAccountName"]
    ns = dep["metadata"]["namespace"]
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": ns}
    bound = {
        (d["kind"], d["metadata"].get("namespace"), d["roleRef"]["kind"], d["roleRef"]["name"])
        for d in docs
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in d["subjects"]
    }
    extender_role = h.component(h.objects(docs, "ClusterRole"), "ClusterRole", "scheduler")["metadata"]["name"]
    lease_role = h.component(docs, "Role", "scheduler")
    assert bound == {
        ("ClusterRoleBinding", None, "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", None, "ClusterRole", "system:volume-scheduler"),
        ("ClusterRoleBinding", None, "ClusterRole", extender_role),
        ("RoleBinding", ns, "Role", lease_role["metadata"]["name"]),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
    }
    # the lease Role allows exactly the lock the configuration names, in the release namespace
    le = h.scheduler_config(docs)["leaderElection"]
    assert lease_role["metadata"]["namespace"] == ns == le["resourceNamespace"]
    assert _flatten(lease_role["rules"]) == {
        ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "get", (le["resourceName"],)),
        ("coordination.k8s.io", "leases", "update", (le["resourceName"],)),
    }


@both
def test_every_binding_names_a_service_account_of_the_chart(docs: list[Obj]) -> None:
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in h.objects(docs, "ServiceAccount")}
    roles = {d["metadata"]["name"] for d in h.objects(docs, "ClusterRole")}
    for d in docs:
        if d["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        for s in d["subjects"]:
            assert s["kind"] == "ServiceAccount"
            assert (s["namespace"], s["name"]) in accounts, d["metadata"]["name"]
        ref = d["roleRef"]["name"]
        assert ref in roles or ref.startswith(("system:", "extension-apiserver-")) or d["kind"] == "RoleBinding"
    workloads = [*h.objects(docs, "DaemonSet"), *h.objects(docs, "Deployment")]
    users = {pod_spec(w)["serviceAccountName"] for w in workloads}
    assert users == {name for _, name in accounts}


# ------------------------------------------------------------------------------------ device plugin


@both
def test_daemonset_runs_on_labelled_gpu_nodes(docs: list[Obj]) -> None:
    spec = pod_spec(daemonset(docs))
    assert spec["nodeSelector"]["gpushare"] == "true"
    assert spec["priorityClassName"] == "system-node-critical"
    keys = {t["key"] for t in spec["tolerations"]}
    assert "nvidia.com/gpu" in keys


def test_daemonset_default_tolerations_and_no_runtime_class(default_docs: list[Obj]) -> None:
    spec = pod_spec(daemonset(default_docs))
    assert {t["key"] for t in spec["tolerations"]} >= {"nvidia.com/gpu", "CriticalAddonsOnly"}
    assert "runtimeClassName" not in spec


@both
def test_daemonset_mounts_and_env(docs: list[Obj]) -> None:
    ds = daemonset(docs)
    spec = pod_spec(ds)
    c = h.container(ds, "device-plugin")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    for name, sub in (("device-plugins", "device-plugins"), ("pod-resources", "pod-resources")):
        host = volumes[name]["hostPath"]
        assert host["path"].endswith("/" + sub) and host["type"] == "Directory"
        assert mounts[name]["mountPath"] == host["path"], "same path inside as kubelet uses outside"
    assert mounts["pod-resources"].get("readOnly") is True
    assert not mounts["device-plugins"].get("readOnly")
    hostpaths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mps = [v["hostPath"]["path"] for v in spec["volumes"] if v["name"].startswith("mps")]
    # --hard-limit (on in both): the host's cgroup tree, at its own path (NVML takes the full path)
    assert mounts["cgroup"]["mountPath"] == volumes["cgroup"]["hostPath"]["path"]
    assert len(hostpaths - set(mps)) == 3, "nothing else of the host is mounted (MPS: its own directories)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # the monitor (on in both) maps NVML's host PIDs through /proc/<pid>/cgroup: the host PID namespace
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")


def test_daemonset_security_context_is_tight(default_docs: list[Obj], all_docs: list[Obj]) -> None:
    # --hard-limit (auto by default, cgroup in all-options) adds SYS_ADMIN: NVML sets cgroup limits as admin
    for docs, caps in (
        (default_docs, {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        (all_docs, {"drop": ["ALL"], "add": ["KILL", "SYS_ADMIN"]}),
    ):
        _tight(h.container(daemonset(docs), "device-plugin")["securityContext"], caps)


@pytest.mark.parametrize("off", ["off", False], ids=["quoted", "yaml-false"])
def test_hard_limit_off_adds_no_capability_and_no_cgroup_mount(helm: Any, off: object) -> None:
    docs = h.render_chart(set_values={"devicePlugin.hardLimit": off}, kube_version=KUBE_VERSION)

    ds = daemonset(docs)
    c = h.container(ds, "device-plugin")
    assert plugin_args(docs).hard_limit == "off"
    assert "cgroup" not in {v["name"] for v in pod_spec(ds)["volumes"]}
    _tight(c["securityContext"], {"drop": ["ALL"]})


def test_hard_limit_args_reach_share_plugin(all_docs: list[Obj], default_docs: list[Obj]) -> None:
    for docs, mode, root in ((default_docs, "auto", "/sys/fs/cgroup"), (all_docs, "cgroup", "/sys/fs/cgroup/unified")):
        args = plugin_args(docs)
        assert (args.hard_limit, args.cgroup_root) == (mode, root)


def test_monitor_off_needs_no_host_pid(helm: Any) -> None:
    docs = h.render_chart(set_values={"devicePlugin.monitor.enabled": False}, kube_version=KUBE_VERSION)
    ds = daemonset(docs)
    assert not pod_spec(ds).get("hostPID")
    c = h.container(ds, "device-plugin")

    assert plugin_args(docs).monitor_interval == 0 and "ports" not in c


def _tight(sc: Obj, caps: Obj) -> None:
    """Only --over-limit kill adds KILL, to signal other users' processes, and --hard-limit SYS_ADMIN."""
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == caps
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["runAsUser"] == 0, "root: the kubelet socket dir and sockets are root-owned"


@both
def test_plugin_args_are_accepted_by_share_plugin(docs: list[Obj]) -> None:
    ds = daemonset(docs)
    c = h.container(ds, "device-plugin")
    args = plugin_args(docs)  # the container runs share-plugin
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args.device_plugin_dir == mounts["device-plugins"]
    assert args.pod_resources_socket == mounts["pod-resources"] + "/kubelet.sock"


def test_plugin_options_default(default_docs: list[Obj]) -> None:
    c = h.container(daemonset(default_docs), "device-plugin")
    args = plugin_args(default_docs)
    assert (args.backend, args.memory_unit, args.health_check, args.mps, args.device_id_strategy) == (
        "nvml",
        "GiB",
        True,
        False,
        "uuid",
    )
    assert (args.device_list_strategy, args.monitor_interval, args.over_limit, args.over_limit_grace) == (
        "envvar",
        5.0,
        "warn",
        30.0,
    )
    assert args.proc_root == "/proc"  # the pod's own /proc, which hostPID makes the host's
    assert c["ports"] == [{"name": "metrics", "containerPort": args.metrics_port, "protocol": "TCP"}]
    assert [c["name"] for c in pod_spec(daemonset(default_docs))["containers"]] == ["device-plugin"]
    assert args.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert args.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_plugin_options_all_on(all_docs: list[Obj], all_values: dict[str, Any]) -> None:
    ds = daemonset(all_docs)
    args = plugin_args(all_docs)
    dp = all_values["devicePlugin"]
    assert args.backend == "sim" and args.sim_gpus == dp["simGpus"]
    assert args.memory_unit == "MiB"
    assert args.health_check is False and args.mps is True and args.device_id_strategy == "index"
    assert args.device_list_strategy == "volume-mounts"
    assert (args.monitor_interval, args.over_limit, args.over_limit_grace, args.metrics_port) == (10, "kill", 60, 9500)
    assert args.usage_annotation_interval == 60
    assert (args.mps_pipe_dir, args.mps_shm_dir) == ("/run/gpushare-test/mps/pipe", "/run/gpushare-test/mps/shm")
    # the root dir moved, kubelet's compiled-in device plugin dir did not
    assert args.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert args.pod_resources_socket == "/var/lib/k0s/kubelet/pod-resources/kubelet.sock"
    spec = pod_spec(ds)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 2


# ----------------------------------------------------------------------------------------- scheduler


@both
def test_scheduler_pod_has_kube_scheduler_and_extender(docs: list[Obj]) -> None:
    dep = deployment(docs)
    names = [c["name"] for c in pod_spec(dep)["containers"]]
    assert names == ["kube-scheduler", "extender"]
    ks = h.container(dep, "kube-scheduler")
    assert ks["command"][0] == "kube-scheduler"
    config_arg = next(a for a in ks["command"] if a.startswith("--config="))
    config_path = config_arg.split("=", 1)[1]
    mount = next(m for m in ks["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod_spec(dep)["volumes"] if v["name"] == mount["name"])
    cm = h.one(docs, "ConfigMap", volume["configMap"]["name"])
    assert config_path.rsplit("/", 1)[1] in cm["data"]


def test_kube_scheduler_image_follows_cluster_version(helm: Any) -> None:
    for cluster, tag in (("v1.36.3", "v1.36.3"), ("v1.33.4+k3s1", "v1.33.4"), ("1.37.2", "v1.37.2")):
        docs = h.render_chart(kube_version=cluster)
        image = h.container(deployment(docs), "kube-scheduler")["image"]
        assert image == f"registry.k8s.io/kube-scheduler:{tag}", cluster


def test_images_all_options(all_docs: list[Obj]) -> None:
    dep = deployment(all_docs)
    assert h.container(dep, "kube-scheduler")["image"] == "registry.example.com/kube-scheduler:v1.36.3"
    assert h.container(dep, "extender")["image"] == "registry.example.com/gpushare/gpushare:0.1.0-test"
    assert (
        h.container(daemonset(all_docs), "device-plugin")["image"]
        == "registry.example.com/gpushare/gpushare:0.1.0-test"
    )


def test_gpushare_image_defaults_to_app_version(default_docs: list[Obj]) -> None:
    chart = yaml.safe_load((h.CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    image = h.container(deployment(default_docs), "extender")["image"]
    assert image == f"ghcr.io/gpushare/gpushare:{chart['appVersion']}"


@both
def test_extender_listens_where_kube_scheduler_and_service_reach_it(docs: list[Obj]) -> None:
    dep = deployment(docs)
    ext = h.container(dep, "extender")
    args = extender_args(docs)  # the container runs share-scheduler
    assert args.bind_address == "0.0.0.0", "the Service reaches inspect and /metrics on the pod IP"
    port = next(p for p in ext["ports"] if p["name"] == "http")
    assert port["containerPort"] == args.port
    ext_cfg = h.scheduler_config(docs)["extenders"][0]
    assert ext_cfg["urlPrefix"] == f"http://127.0.0.1:{args.port}/gpushare-scheduler"
    svc = h.component(docs, "Service", "scheduler")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


@both
def test_extender_options_parse(docs: list[Obj]) -> None:
    args = extender_args(docs)
    assert args.policy in {"frag", "spread"}
    assert args.memory_unit in {"GiB", "MiB"}
    assert args.log_level in {"INFO", "DEBUG"}


def test_default_policy_is_frag(default_docs: list[Obj]) -> None:
    """The chart's default placement is frag (docs/policies.md, "Why frag is the default")."""

    args = extender_args(default_docs)
    assert args.policy == "frag"


def test_memory_unit_reaches_plugin_and_extender(all_docs: list[Obj]) -> None:
    plugin = plugin_args(all_docs)
    ext = extender_args(all_docs)
    assert plugin.memory_unit == ext.memory_unit == "MiB"
    assert ext.policy == "spread" and ext.threads == 16 and ext.port == 23456


@both
def test_probes(docs: list[Obj]) -> None:
    dep = deployment(docs)
    ext = h.container(dep, "extender")
    assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert ext["startupProbe"]["httpGet"]["path"] == "/healthz"
    ks = h.container(dep, "kube-scheduler")
    assert ks["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "sched-https", "scheme": "HTTPS"}
    assert ks["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {p["name"]: p["containerPort"] for p in ks["ports"]} == {"sched-https": 10259}


@both
def test_scheduler_pod_runs_unprivileged(docs: list[Obj]) -> None:
    dep = deployment(docs)
    spec = pod_spec(dep)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, "writable /tmp on a read-only root"
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_scheduler_replicas_and_spread(default_docs: list[Obj], all_docs: list[Obj]) -> None:
    dep = deployment(default_docs)
    assert dep["spec"]["replicas"] == 2
    soft = pod_spec(dep)["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in soft
    assert h.one(default_docs, "PodDisruptionBudget", "gpushare-scheduler")["spec"]["maxUnavailable"] == 1
    dep = deployment(all_docs)
    assert dep["spec"]["replicas"] == 3
    aff = pod_spec(dep)["affinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in aff["podAntiAffinity"]
    assert "nodeAffinity" in aff


def test_config_change_rolls_the_scheduler(helm: Any) -> None:
    a = deployment(h.render_chart())["spec"]["template"]["metadata"]["annotations"]
    b = deployment(h.render_chart(set_values={"scheduler.filterKeeps": "fitting"}))["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert a["checksum/scheduler-config"] != b["checksum/scheduler-config"]


# ---------------------------------------------------------------- the KubeSchedulerConfiguration


def _print_config(capsys: pytest.CaptureFixture[str], *argv: str) -> Obj:
    from share_scheduler.cli import main

    capsys.readouterr()
    assert main(["print-config", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def _comparable(cfg: Obj) -> Obj:
    """The parts that must agree; plugin lists compared as sets."""
    out = {k: v for k, v in cfg.items() if k not in ("leaderElection", "clientConnection")}
    profiles = []
    for p in out.get("profiles", []):
        p = dict(p)
        plugins = {
            point: {state: sorted(x["name"] for x in lst) for state, lst in (cfg_point or {}).items()}
            for point, cfg_point in (p.pop("plugins", None) or {}).items()
        }
        profiles.append({**p, "plugins": plugins})
    out["profiles"] = profiles
    return out


def test_chart_config_matches_print_config(default_docs: list[Obj], capsys: pytest.CaptureFixture[str]) -> None:
    chart = h.scheduler_config(default_docs)
    printed = _print_config(capsys, "--extender-url", chart["extenders"][0]["urlPrefix"])
    assert _comparable(chart) == _comparable(printed)
    # leader election: the same switch; the chart keeps its lock in its own namespace
    assert chart["leaderElection"]["leaderElect"] is printed["leaderElection"]["leaderElect"] is True
    assert chart["leaderElection"]["resourceNamespace"] == DEFAULT_NAMESPACE
    assert chart["leaderElection"]["resourceLock"] == "leases"
    assert "clientConnection" not in chart, "in-cluster credentials of the pod's service account"


def test_filter_keeps_decides_prioritize(default_docs: list[Obj], all_docs: list[Obj]) -> None:
    best = h.scheduler_config(default_docs)["extenders"][0]
    assert "prioritizeVerb" not in best and "weight" not in best  # one HTTP call per scheduling cycle
    fitting = h.scheduler_config(all_docs)["extenders"][0]
    assert (fitting["prioritizeVerb"], fitting["weight"]) == ("prioritize", 200)

    for docs, keeps, events in ((default_docs, "best", "failures"), (all_docs, "fitting", "all")):
        args = extender_args(docs)
        assert (args.filter_keeps, args.bind_events) == (keeps, events)


def test_chart_config_equals_scheduler_configuration_function(default_docs: list[Obj]) -> None:
    from share_scheduler.config import scheduler_config

    chart = h.scheduler_config(default_docs)
    assert _comparable(chart) == _comparable(scheduler_config(extender_url=chart["extenders"][0]["urlPrefix"]))


def test_all_options_config_differs_only_where_values_say(
    all_docs: list[Obj], all_values: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    chart = h.scheduler_config(all_docs)
    s = all_values["scheduler"]
    printed = _print_config(
        capsys, "--extender-url", f"http://127.0.0.1:{s['port']}/gpushare-scheduler", "--filter-keeps", "fitting"
    )
    printed["extenders"][0].update(weight=s["extenderWeight"], httpTimeout=s["httpTimeout"])
    printed["percentageOfNodesToScore"] = s["percentageOfNodesToScore"]
    assert _comparable(chart) == _comparable(printed)
    le = chart["leaderElection"]
    assert le["resourceName"] == s["leaderElection"]["leaseName"]
    assert (le["leaseDuration"], le["renewDeadline"], le["retryPeriod"]) == ("20s", "15s", "3s")


@both
def test_config_key_facts(docs: list[Obj]) -> None:
    cfg = h.scheduler_config(docs)
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["percentageOfNodesToScore"] in (100, 70)  # 70: all-options sets it
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gpushare-scheduler"]
    ext = cfg["extenders"][0]
    assert (ext["filterVerb"], ext["bindVerb"], ext["preemptVerb"]) == ("filter", "bind", "preempt")
    assert ("prioritizeVerb" in ext) == ("weight" in ext)
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    assert "managedResources" not in ext  # every pod of the profile reaches the extender (IsInterested)
    assert re.fullmatch(r"\d+s", ext["httpTimeout"])
    assert cfg["leaderElection"]["leaderElect"] is True


# --------------------------------------------------------------------------- Service, monitoring


def test_service_monitor_only_when_enabled_and_served(helm: Any) -> None:
    on = {"serviceMonitor.enabled": True}
    assert not h.objects(h.render_chart(api_versions=[MONITORING_API]), "ServiceMonitor")
    assert not h.objects(h.render_chart(set_values=on), "ServiceMonitor")
    sm = h.one(h.render_chart(set_values=on, api_versions=[MONITORING_API]), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["endpoints"][0]["port"] == "http"


def test_service_monitor_all_options(all_docs: list[Obj]) -> None:
    sm = h.one(all_docs, "ServiceMonitor")
    svc = h.component(all_docs, "Service", "scheduler")
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["type"] == "NodePort" and svc["spec"]["ports"][0]["port"] == 8080


@both
def test_every_object_is_labelled_and_namespaced(docs: list[Obj]) -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for d in docs:
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "gpushare"
        if d["kind"] in cluster_scoped:
            assert "namespace" not in d["metadata"]
        else:
            assert d["metadata"]["namespace"] in (DEFAULT_NAMESPACE, "kube-system")


def test_common_labels(all_docs: list[Obj]) -> None:
    assert all(d["metadata"]["labels"]["team"] == "ml-platform" for d in all_docs)


def test_release_named_gpushare_gives_short_names(default_docs: list[Obj]) -> None:
    assert deployment(default_docs)["metadata"]["name"] == "gpushare-scheduler"
    assert daemonset(default_docs)["metadata"]["name"] == "gpushare-device-plugin"
    assert h.one(default_docs, "Service", "gpushare-scheduler")
    assert h.one(default_docs, "Service", "gpushare-webhook")


def test_uninstall_hook_cleans_nodes_with_the_plugins_account(default_docs: list[Obj]) -> None:
    job = next(d for d in default_docs if d["kind"] == "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"].endswith("device-plugin")
    assert spec["containers"][0]["command"][:2] == ["share-plugin", "--unpublish"]
    assert spec["containers"][0]["securityContext"]["runAsNonRoot"] is True
    off = h.render_chart(set_values={"devicePlugin.cleanupOnUninstall": False})
    assert not [d for d in off if d["kind"] == "Job"]


def test_mps_daemon_beside_the_plugin(all_docs: list[Obj]) -> None:
    """MPS: the control daemon runs in the plugin's pod, its pipe where the plugin checks it and Allocate mounts it."""

    ds = daemonset(all_docs)
    spec = pod_spec(ds)
    daemon = h.container(ds, "mps-control-daemon")
    assert daemon["command"] == ["nvidia-cuda-mps-control", "-f"]
    env = {e["name"]: e["value"] for e in daemon["env"]}
    args = plugin_args(all_docs)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == args.mps_pipe_dir
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/run/gpushare-test/mps/log"
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    # CUDA 13's daemon listens on a socket there (an H100, driver 580); older ones made a named pipe
    probe = ["sh", "-c", 'test -S "$0" || test -p "$0"', args.mps_pipe_dir + "/control"]
    assert daemon["startupProbe"]["exec"]["command"] == probe
    assert daemon["livenessProbe"]["exec"]["command"] == probe
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["mps"]["hostPath"] == {"path": "/run/gpushare-test/mps", "type": "DirectoryOrCreate"}
    assert volumes["mps-shm"]["hostPath"]["path"] == args.mps_shm_dir
    dmounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    assert dmounts == {"mps": "/run/gpushare-test/mps", "mps-shm": "/dev/shm"}
    pmount = next(m for m in h.container(ds, "device-plugin")["volumeMounts"] if m["name"] == "mps")
    assert pmount["readOnly"] is True and args.mps_pipe_dir.startswith(pmount["mountPath"])
    assert daemon["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert daemon["resources"]["limits"]["memory"] == "256Mi"


def test_mps_daemon_probe_passes_on_a_socket_or_a_named_pipe_only(all_docs: list[Obj], tmp_path: Path) -> None:
    """The probe's command, run: CUDA 13's socket and an older daemon's FIFO pass, nothing else does."""
    command = h.container(daemonset(all_docs), "mps-control-daemon")["startupProbe"]["exec"]["command"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(str(tmp_path / "sock"))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("")
    try:
        for name, passes in (("sock", True), ("fifo", True), ("file", False), ("missing", False)):
            rc = subprocess.run([*command[:-1], str(tmp_path / name)], check=False).returncode
            assert (rc == 0) is passes, (name, rc)
    finally:
        sock.close()


def test_pod_monitor_only_when_enabled_and_served(helm: Any) -> None:
    on = {"podMonitor.enabled": True}
    assert not h.objects(h.render_chart(api_versions=[MONITORING_API]), "PodMonitor")
    assert not h.objects(h.render_chart(set_values=on), "PodMonitor")
    off = {**on, "devicePlugin.monitor.enabled": False}
    assert not h.objects(h.render_chart(set_values=off, api_versions=[MONITORING_API]), "PodMonitor")
    pm = h.one(h.render_chart(set_values=on, api_versions=[MONITORING_API]), "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0] == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "10s",
    }


def test_pod_monitor_selects_the_plugin_pods(all_docs: list[Obj]) -> None:
    pm = h.one(all_docs, "PodMonitor")
    ds = daemonset(all_docs)
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pm["spec"]["podMetricsEndpoints"][0]["interval"] == "20s"


def test_grafana_dashboard_config_map(all_docs: list[Obj], default_docs: list[Obj]) -> None:
    import json

    assert not [d for d in default_docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("dashboard")]
    cm = next(d for d in all_docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["gpushare.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    # every metric the dashboard queries is one the plugin exports
    import re

    from share_core.contract import MemoryUnit
    from share_core.fake import FakeKube
    from share_node.backend.sim import SimBackend
    from share_plugin.metrics import MonitorCollector
    from share_plugin.monitor import Monitor

    monitor = Monitor(PluginNode("n", FakeKube(), SimBackend("1xT4:16GiB", "n"), MemoryUnit.GiB))
    exported = {f.name for f in MonitorCollector(monitor).collect()}
    exported |= {n + "_total" for n in exported}
    queried = set(re.findall(r"gpushare_[a-z_]+", exprs))
    assert queried and queried <= exported


# ---------------------------------------------------------------------------------- cluster versions

SUPPORTED_MINORS = range(33, 38)  # README "Supported Kubernetes versions", hack/build-k8s.sh --list


def test_chart_kube_version_is_the_tested_range() -> None:
    """Chart.yaml's kubeVersion is the range hack/build-k8s.sh builds and `make test-matrix` tests."""
    chart = yaml.safe_load((h.CHART_DIR / "Chart.yaml").read_text())
    listed = subprocess.run(
        [str(h.REPO_ROOT / "hack" / "build-k8s.sh"), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [int(v.split(".")[1]) for v in listed] == list(SUPPORTED_MINORS)
    lo, hi = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1] + 1
    assert chart["kubeVersion"] == f">=1.{lo}.0-0 <1.{hi}.0-0"
    # ...and the README and docs/versions.md state that range
    for doc in ("README.md", "docs/versions.md"):
        text = (h.REPO_ROOT / doc).read_text()
        assert f"Kubernetes 1.{lo} to 1.{hi - 1}" in text or f"Kubernetes **1.{lo} to 1.{hi - 1}**" in text, doc


@pytest.mark.parametrize(
    "cluster", ["v1.33.0", "v1.33.5-eks-1a2b3c4", "v1.34.1-gke.1200", "v1.35.4+k3s1", "v1.36.3", "v1.37.2"]
)
def test_chart_installs_on_supported_clusters(helm: Any, cluster: str) -> None:
    assert h.render_chart(kube_version=cluster)


@pytest.mark.parametrize("cluster", ["v1.25.16", "v1.32.13", "v1.32.9-eks-1a2b3c4", "v1.38.0"])
def test_chart_refuses_unsupported_clusters_naming_the_range(helm: Any, cluster: str) -> None:
    with pytest.raises(h.HelmError) as err:
        h.render_chart(kube_version=cluster)
    message = str(err.value)
    assert "chart requires kubeVersion: >=1.33.0-0 <1.38.0-0" in message, message
    assert f"incompatible with Kubernetes {cluster.split('-')[0]}" in message, message
