"""The chart installed into the real control plane: its objects are accepted and created, the
kube-scheduler runs from the chart's ConfigMap as the chart's service account, and every sample in
samples/ is scheduled through the extender onto the simulated nodes where it belongs. The sample
Deployment's pods are made by the real Deployment and ReplicaSet controllers (kube-controller-manager,
started for this test only)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from share_core.assignment import parse_assignment
from share_core.assignment import pod_annotations
from tests.controlplane.gpucluster import NAMESPACE
from tests.controlplane.gpucluster import RELEASE
from tests.controlplane.gpucluster import GpuCluster
from tests.controlplane.gpucluster import load_yaml_docs
from tests.controlplane.gpucluster import sa_identity
from tests.controlplane.gpucluster import with_scheduler
from tests.unit.chart.helm import render_chart
from tests.unit.chart.helm import scheduler_config

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def test_chart_installs_and_its_scheduler_places_every_sample(gpu_cluster: GpuCluster, ns: str) -> None:
    cp = gpu_cluster.cp
    version = json.loads(cp.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    objects = render_chart(
        release=RELEASE,
        namespace=NAMESPACE,
        kube_version=version,
        # No webhook here (its pods need a real node: test_helm_realnode.py installs it, test_webhook.py runs
        # it on this API server): the samples get their schedulerName from with_scheduler, as written
        # for a chart installed with webhook.enabled=false.
        set_values={"scheduler.port": gpu_cluster.extender_port, "scheduler.replicas": 1, "webhook.enabled": False},
    )
    kinds = Counter(o["kind"] for o in objects)
    assert {"DaemonSet", "Deployment", "ConfigMap", "Service", "ClusterRole", "ClusterRoleBinding"} <= set(kinds)

    # Install: every object accepted by the API server's validation and admission, and created.
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    for obj in objects:
        ns_args = ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []
        got = cp.kubectl("get", obj["kind"].lower(), obj["metadata"]["name"], *ns_args, "-o", "json")
        assert json.loads(got.stdout)["metadata"]["name"] == obj["metadata"]["name"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert any(i.startswith("registry.k8s.io/kube-scheduler:" + version) for i in images), images

    # The kube-scheduler of the chart, from the chart's ConfigMap, as the chart's service account.
    config = scheduler_config(objects)
    scheduler_sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    cp.stop_scheduler()
    # Only the controllers the samples need: this session's control plane has no ServiceAccount
    # admission and its stand-in nodes never heartbeat (no node lifecycle controller). The chart's
    # own kube-scheduler runs as a process here (no real kubelet), so its Deployment is scaled to 0.
    cp.kubectl("scale", "deployment", "-n", NAMESPACE, deployment["metadata"]["name"], "--replicas=0")
    cp.start_controller_manager(
        controllers=("deployment-controller", "replicaset-controller", "garbage-collector-controller")
    )
    try:
        cp.start_scheduler(yaml.safe_dump(config), kubeconfig=cp.kubeconfig_for(*sa_identity(NAMESPACE, scheduler_sa)))
        gpu_cluster.add_node(f"{ns}-a100", "2xA100:80GiB")
        gpu_cluster.add_node(f"{ns}-t4", "4xT4:16GiB")
        docs = [with_scheduler(d) for f in sorted(SAMPLES.glob("*.yaml")) for d in load_yaml_docs(f)]
        pods = [d for d in docs if d["kind"] == "Pod"]
        workloads = [d for d in docs if d["kind"] != "Pod"]
        assert len(pods) >= 4 and [d["kind"] for d in workloads] == ["Deployment"]
        for pod in pods:
            gpu_cluster.create_pod({**pod, "metadata": {**pod["metadata"], "namespace": ns}})
        cp.kubectl(
            "apply", "-n", ns, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": workloads})
        )
        expected = len(pods) + sum(int(d["spec"]["replicas"]) for d in workloads)
        gpu_cluster.wait_all_running(ns, expected, timeout=120)
        made = [p for p in gpu_cluster.pods(ns) if p["metadata"].get("ownerReferences")]
        assert {o["kind"] for p in made for o in p["metadata"]["ownerReferences"]} == {"ReplicaSet"}
        assert len(made) == expected - len(pods)
        _assert_samples_landed_where_they_should(gpu_cluster, ns)
        lease = json.loads(cp.kubectl("get", "lease", "-n", NAMESPACE, "-o", "json").stdout)["items"]
        assert lease, "leader election on: kube-scheduler holds a lease in the release namespace"
    finally:
        # The garbage collector removes the sample ReplicaSet; the ns fixture deletes the pods.
        cp.kubectl("delete", "deployment", "--all", "-n", ns, check=False)
        for _ in range(60):
            if not json.loads(cp.kubectl("get", "replicasets", "-n", ns, "-o", "json").stdout)["items"]:
                break
            time.sleep(0.5)
        cp.stop_controller_manager()
        cp.stop_scheduler()
        gpu_cluster.start_scheduler()


def _assert_samples_landed_where_they_should(cluster: GpuCluster, ns: str) -> None:
    cluster.check_invariants()
    placed = {}
    for pod in cluster.pods(ns):
        a = parse_assignment(pod_annotations(pod))
        assert a is not None, pod["metadata"]["name"]
        placed[pod["metadata"]["name"]] = (pod["spec"]["nodeName"], a)
    node, a = placed["gpushare-gpu-model"]
    assert node.endswith("-t4"), "the gpu-model sample asks for a T4"
    node, a = placed["gpushare-two-gpu"]
    assert len(a.gpu_indices) == 2
    env = cluster.env_of(cluster.admin.get_pod(ns, "gpushare-multi-container"))
    assert len({e["NVIDIA_VISIBLE_DEVICES"] for e in env.values()}) == 1 and len(env) == 3
    # Binpack prefers the GPU left with the least free memory: the 16 GiB T4s take everything
    # (38 GiB in all) before an 80 GiB A100 is touched, whatever order the pods are scheduled in.
    assert {n for n, _ in placed.values()} == {f"{ns}-t4"}, placed
    replicas = [v for k, v in placed.items() if k.startswith("gpushare-deployment-")]
    assert len(replicas) == 4
