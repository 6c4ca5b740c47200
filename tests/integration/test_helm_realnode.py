"""What the README tells a user, for real: `helm install` of charts/gpushare into a cluster whose
node is a real kubelet (containerd, runc), from the images `make image` built.

The cluster: etcd, kube-apiserver with the ServiceAccount admission plugin, the real
kube-controller-manager and a default kube-scheduler (the DaemonSet and Deployment controllers
make every pod of the chart and of the samples; nothing is made by hand), one RealNode labelled
gpushare=true, the `kubernetes` Service reachable from pods (tests/node/serviceproxy.py stands in
for kube-proxy for that one Service). The chart is installed with values only (no template override): our images with
pullPolicy Never, the sim backend, the node's kubelet root. Its device plugin registers with
kubelet from inside its container through the hostPath sockets; its scheduler pod runs
kube-scheduler and the extender with the chart's RBAC only; the samples (image replaced by our
busybox, which cannot be pulled otherwise, and each container's command prefixed with a print of
its env) run, and every container's env matches its pod's annotations. The chart's admission webhook
(on by default) gives the samples, which name no scheduler, gpushare-scheduler, and refuses through its
Service what could never be placed: kube-apiserver runs with --enable-aggregator-routing=true and calls
the Service on an endpoint's pod IP (there is no kube-proxy), which the endpoints controllers publish.
`helm upgrade` with a changed value rolls every workload and keeps the webhook's CA; `helm uninstall`
leaves nothing of the release behind, the webhook's certificate Secret (owned by its
MutatingWebhookConfiguration) included.

Each test passes alone (`-k upgrade_rolls`): the `installed` fixture installs the release where it is not
(the first test that needs it, and again after the uninstall test), and each test's pods live in a
namespace of their own.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import NODE_LABEL
from share_core.contract import NODE_LABEL_VALUE
from share_core.contract import RESOURCE_COUNT
from tests.controlplane import ControlPlane
from tests.controlplane.cluster import CONTROLLER_MANAGER_USER
from tests.controlplane.cluster import DEFAULT_CONTROLLERS
from tests.controlplane.gpucluster import wait_for
from tests.controlplane.webhook import serves_policy
from tests.node import RealNode
from tests.node.images import node_images
from tests.node.product_images import ProductImages
from tests.node.product_images import product_images
from tests.node.serviceproxy import KubernetesServiceProxy

pytestmark = [pytest.mark.integration, pytest.mark.realkubelet, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpushare"
SAMPLES = REPO / "samples"
RELEASE = "gpushare"
NAMESPACE = "gpushare-system"
SAMPLES_NS = "samples"
UPGRADE_NS = "after-upgrade"  # the pod test_helm_upgrade_... creates
POD_NAMESPACES = (SAMPLES_NS, UPGRADE_NS)
WEBHOOK = f"{RELEASE}-webhook"  # the chart's names for the release
POLICY_KINDS = "mutatingadmissionpolicies,mutatingadmissionpolicybindings"
WEBHOOK_SECRET = f"{WEBHOOK}-tls"
NODE = "gpunode-0"
SIM_GPUS = "2xA100:80GiB,1xT4:16GiB"
GPU_MEM_UNITS = 80 + 80 + 16
KUBERNETES_SERVICE = ("10.0.0.1", 443)  # ClusterIP of `kubernetes` (first of SERVICE_CLUSTER_IP_RANGE)
KUBELET_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # compiled into kubelet
ENV_PREFIXES = ("GPUSHARE_", "NVIDIA_VISIBLE_DEVICES=", "ALIYUN_COM_GPU_MEM_")
PRINT_ENV = "env | grep -E '^(GPUSHARE_|NVIDIA_VISIBLE_DEVICES=|ALIYUN_COM_GPU_MEM_)' | sort; echo ENV-END; "
TIMINGS: dict[str, float] = {}


class Cluster:
    def __init__(self, cp: ControlPlane, node: RealNode, images: ProductImages, workdir: Path) -> None:
        self.cp, self.node, self.images, self.workdir = cp, node, images, workdir

    def helm(self, *args: str, timeout: float = 400, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cp.binary("helm")), f"--kubeconfig={self.cp.admin_kubeconfig}", *args]
        env = {"HOME": str(self.workdir), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(self.workdir / "helm")}
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
        if check and result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}\n"
                + self.describe()
            )
        return result

    def get(self, *args: str) -> Any:
        return json.loads(self.cp.kubectl("get", *args, "-o", "json").stdout)

    def pods(self, ns: str, selector: str | None = None) -> list[dict[str, Any]]:
        return self.get("pods", "-n", ns, *(["-l", selector] if selector else []))["items"]

    def describe(self) -> str:
        out = [self.cp.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout]
        out.append(self.cp.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-6000:])
        for ns in (NAMESPACE, SAMPLES_NS):
            for pod in self.pods(ns) if self._ns_exists(ns) else []:
                for c in pod["spec"]["containers"]:
                    try:
                        log = self.node.pod_log(ns, pod["metadata"]["name"], c["name"])
                    except Exception as exc:
                        log = f"<{exc}>"
                    out.append(f"--- {ns}/{pod['metadata']['name']}/{c['name']}\n{log[-3000:]}")
        return "\n".join(out)

    def _ns_exists(self, ns: str) -> bool:
        return self.cp.kubectl("get", "namespace", ns, check=False).returncode == 0


def _poll(check, timeout: float, what: str, cluster: Cluster | None = None):
    try:
        return wait_for(check, timeout, what, interval=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n" + (cluster.describe() if cluster else "")) from None


@pytest.fixture(scope="module")
def cluster(k8s_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    t0 = time.monotonic()
    images = product_images()
    TIMINGS["images"] = time.monotonic() - t0
    work = tmp_path_factory.mktemp("helm-realnode")
    # The admission webhook is a Service: kube-apiserver calls it on its endpoint's pod IP (no kube-proxy
    # here to route the ClusterIP), which the endpoints controllers publish.
    cp = ControlPlane(
        work / "controlplane", k8s_bin_dir, service_accounts=True, apiserver_args=["--enable-aggregator-routing=true"]
    )
    proxy: KubernetesServiceProxy | None = None
    node: RealNode | None = None
    try:
        cp.start()
        cp.start_controller_manager(
            controllers=(*DEFAULT_CONTROLLERS, "endpoints-controller", "endpointslice-controller")
        )
        cp.start_scheduler("{}")  # the cluster's default-scheduler (places the chart's own pods)
        proxy = KubernetesServiceProxy(*KUBERNETES_SERVICE, "127.0.0.1", cp.apiserver_port).start()
        node = RealNode(cp, NODE, work / "node", images=node_images(), pod_subnet="10.245.0.0/24", pod_gateway=True)
        node.start()
        t1 = time.monotonic()
        for image in images.all():
            node.ctr("images", "import", str(image.archive), timeout=300)
        listed = node.ctr("images", "ls", "-q").stdout.split()
        assert all(i.ref in listed for i in images.all()), listed
        TIMINGS["import"] = time.monotonic() - t1
        TIMINGS["cluster"] = time.monotonic() - t0
        yield Cluster(cp, node, images, work)
    finally:
        if node is not None:
            node.stop()
        if proxy is not None:
            proxy.stop()
        cp.stop()
        print(f"\n[helm-realnode] timings: { {k: round(v, 1) for k, v in TIMINGS.items()} }")


def _values(c: Cluster) -> dict[str, Any]:
    g_repo, g_tag = c.images.gpushare.ref.rsplit(":", 1)
    s_repo, s_tag = c.images.kube_scheduler.ref.rsplit(":", 1)
    return {
        "image": {"repository": g_repo, "tag": g_tag, "pullPolicy": "Never"},
        "devicePlugin": {
            "backend": "sim",
            "simGpus": SIM_GPUS,
            "kubeletRootDir": str(c.node.kubelet_root),
            "devicePluginDir": KUBELET_DEVICE_PLUGIN_DIR,
        },
        "scheduler": {"kubeScheduler": {"image": {"repository": s_repo, "tag": s_tag, "pullPolicy": "Never"}}},
    }


def _values_file(c: Cluster, name: str, values: dict[str, Any]) -> Path:
    path = c.workdir / name
    path.write_text(yaml.safe_dump(values))
    return path


def _node_gpu_mem(c: Cluster) -> int:
    node = c.get("node", NODE)
    return int(node["status"].get("allocatable", {}).get("nvidia.com/gpu-mem", "0"))


def _ready(pod: dict[str, Any]) -> bool:
    conds = {x["type"]: x["status"] for x in pod.get("status", {}).get("conditions", [])}
    return pod.get("status", {}).get("phase") == "Running" and conds.get("Ready") == "True"


def _deployed(c: Cluster) -> bool:
    """Whether the release is installed (and not uninstalled since): `helm status` knows it."""
    return c.helm("status", RELEASE, "--namespace", NAMESPACE, check=False).returncode == 0


def _install(c: Cluster) -> None:
    """What the README tells a user: label the node, `helm install`, then wait, as a user does before
    creating pods, until the plugin has registered and the webhook's CA is in both configurations (pods
    created before that would be admitted without our scheduler: failurePolicy Ignore for them is not ours
    to rely on). Every test that needs the release calls this through `installed`, so each passes alone."""
    c.cp.kubectl("label", "node", NODE, f"{NODE_LABEL}={NODE_LABEL_VALUE}", "--overwrite")
    t0 = time.monotonic()
    values = _values_file(c, "values.yaml", _values(c))
    c.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "-f", str(values), "--wait", "--timeout", "3m",
    )  # fmt: skip
    TIMINGS["helm_install"] = time.monotonic() - t0
    _poll(lambda: _node_gpu_mem(c) == GPU_MEM_UNITS, 120, f"{GPU_MEM_UNITS} nvidia.com/gpu-mem allocatable", c)
    TIMINGS["plugin_ready"] = time.monotonic() - t0
    _poll(lambda: _webhook_trusted(c), 60, "the webhook's Secret made and its CA in both configurations", c)
    TIMINGS["webhook_ready"] = time.monotonic() - t0


@pytest.fixture
def installed(cluster: Cluster) -> Cluster:
    """The release, installed by the first test that needs it (again after the uninstall test, in whatever
    order the tests run). Costs one `helm status` where it is already there."""
    t0 = time.monotonic()
    if not _deployed(cluster):
        _install(cluster)
        TIMINGS["installs"] = TIMINGS.get("installs", 0) + 1
    TIMINGS["installed_fixture"] = TIMINGS.get("installed_fixture", 0) + time.monotonic() - t0
    return cluster


def _namespace(c: Cluster, name: str) -> None:
    """A namespace for pods, made if missing, once its default ServiceAccount exists (pods need it)."""
    if not c._ns_exists(name):
        c.cp.kubectl("create", "namespace", name)
    _poll(lambda: c.cp.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0, 30, "default sa", c)


def test_helm_install(installed: Cluster) -> None:
    c = installed

    # The device plugin: one pod, made by the DaemonSet controller, from our image, on the real node.
    plugin_pods = c.pods(NAMESPACE, "app.kubernetes.io/component=device-plugin")
    assert len(plugin_pods) == 1, plugin_pods
    pod = plugin_pods[0]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert pod["spec"]["nodeName"] == NODE and _ready(pod)
    assert pod["spec"]["containers"][0]["image"] == c.images.gpushare.ref
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0, status
    # ... registered from inside its container: kubelet advertises the GPUs' memory (`installed` waited for it).
    assert _node_gpu_mem(c) == GPU_MEM_UNITS
    gpus = json.loads(c.get("node", NODE)["metadata"]["annotations"]["gpushare.io/gpus"])
    assert sorted(g["memory"] for g in gpus) == [16, 80, 80]

    # The scheduler: Deployment -> ReplicaSet -> pods, both containers ready, leader elected.
    sched_pods = c.pods(NAMESPACE, "app.kubernetes.io/component=scheduler")
    assert len(sched_pods) == 2 and all(_ready(p) for p in sched_pods), sched_pods
    for p in sched_pods:
        assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        images = {x["name"]: x["image"] for x in p["spec"]["containers"]}
        assert images == {"kube-scheduler": c.images.kube_scheduler.ref, "extender": c.images.gpushare.ref}
        assert p["spec"]["securityContext"]["runAsUser"] == 65532
    leases = c.get("lease", "-n", NAMESPACE)["items"]
    assert any(x["spec"].get("holderIdentity") for x in leases), leases

    # The admission webhook: two replicas from our image, ready over HTTPS, their certificate made by
    # themselves in a Secret owned by the MutatingWebhookConfiguration, its CA in both configurations.
    hook_pods = c.pods(NAMESPACE, "app.kubernetes.io/component=webhook")
    assert len(hook_pods) == 2 and all(_ready(p) for p in hook_pods), hook_pods
    assert {p["spec"]["containers"][0]["image"] for p in hook_pods} == {c.images.gpushare.ref}
    secret = c.get("secret", "-n", NAMESPACE, WEBHOOK_SECRET)
    mutating = c.get("mutatingwebhookconfiguration", WEBHOOK)
    assert [(o["kind"], o["uid"]) for o in secret["metadata"]["ownerReferences"]] == [
        ("MutatingWebhookConfiguration", mutating["metadata"]["uid"])
    ]
    assert _ca_bundles(c) == {secret["data"]["ca.crt"]}  # `installed` waited for the webhook to patch it
    # helm discovered v1 MutatingAdmissionPolicy where kube-apiserver serves it (1.36+): the scheduler is set
    # there, and the webhook is only asked to validate
    policies = [x["metadata"]["name"] for x in c.get(POLICY_KINDS)["items"]] if serves_policy(c.cp) else []
    hooks = [h["name"] for h in mutating.get("webhooks") or []]
    if serves_policy(c.cp):
        assert policies == [f"{WEBHOOK}-scheduler"] * 2 and hooks == []
    else:
        assert hooks == ["scheduler.gpushare.io"]
    # Nobody but the controllers made pods: no pod of the release lacks an owner.
    assert all(p["metadata"].get("ownerReferences") for p in c.pods(NAMESPACE))
    assert CONTROLLER_MANAGER_USER  # the controllers ran under their own credentials (cluster.py)


def _webhook_trusted(c: Cluster) -> bool:
    """The webhook made its Secret and patched its CA into both configurations."""
    got = c.cp.kubectl("get", "secret", "-n", NAMESPACE, WEBHOOK_SECRET, "-o", "json", check=False)
    return got.returncode == 0 and _ca_bundles(c) == {json.loads(got.stdout)["data"]["ca.crt"]}


def _ca_bundles(c: Cluster) -> set[str]:
    kinds = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
    return {h["clientConfig"].get("caBundle", "") for kind in kinds for h in c.get(kind, WEBHOOK).get("webhooks") or []}


def _sample_docs() -> list[dict[str, Any]]:
    docs = []
    for f in sorted(SAMPLES.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def _adapt(doc: dict[str, Any], image: str) -> dict[str, Any]:
    """Our busybox instead of the CUDA image (no registry here), and each container prints its env first."""
    spec = doc["spec"]["template"]["spec"] if doc["kind"] in ("Deployment", "Job") else doc["spec"]
    for ctr in [*spec.get("initContainers", []), *spec["containers"]]:
        ctr["image"] = image
        ctr["imagePullPolicy"] = "Never"
        cmd = list(ctr.get("command", [])) + list(ctr.pop("args", []))
        assert cmd[:2] == ["sh", "-c"] and len(cmd) == 3, cmd
        ctr["command"] = ["sh", "-c", PRINT_ENV + cmd[2]]
    spec["terminationGracePeriodSeconds"] = 1
    return doc


def _constrained(doc: dict[str, Any]) -> bool:
    """A sample that asks for a GPU model (gpushare.io/gpu-model)."""
    meta = doc["spec"]["template"]["metadata"] if doc["kind"] in ("Deployment", "Job") else doc["metadata"]
    return "gpushare.io/gpu-model" in (meta.get("annotations") or {})


def _printed_env(log: str) -> dict[str, str] | None:
    if "ENV-END" not in log:
        return None
    env = {}
    for line in log.split("ENV-END", 1)[0].splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


def _limit_gib(ctr: dict[str, Any]) -> int:
    return int(ctr["resources"]["limits"]["nvidia.com/gpu-mem"])


def test_samples_run_with_the_env_of_their_annotations(installed: Cluster) -> None:
    c = installed
    docs = [_adapt(d, node_images().busybox.ref) for d in _sample_docs()]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("Pod") >= 4 and "Deployment" in kinds, kinds
    _namespace(c, SAMPLES_NS)
    t0 = time.monotonic()
    # Pods restricted to a GPU model first, bound before the others arrive: whatever the policy (the
    # chart's default, frag; binpack before it), the unrestricted samples on one small T4, bound in
    # whatever order kube-scheduler takes them (v1.37.2 took another than v1.36.3), can leave too little
    # for the T4-only pod.
    constrained = [d for d in docs if _constrained(d)]
    for batch in (constrained, [d for d in docs if not _constrained(d)]):
        c.cp.kubectl(
            "apply", "-n", SAMPLES_NS, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
        )
        names = [d["metadata"]["name"] for d in batch if d["kind"] == "Pod"]
        _poll(
            lambda names=names: all(c.get("pod", n, "-n", SAMPLES_NS)["spec"].get("nodeName") for n in names),
            120,
            f"sample pods {names} bound",
            c,
        )
    replicas = sum(d["spec"]["replicas"] for d in docs if d["kind"] == "Deployment")
    expected = kinds.count("Pod") + replicas

    def running() -> list[dict[str, Any]] | None:
        pods = c.pods(SAMPLES_NS)
        return pods if len(pods) == expected and all(_ready(p) for p in pods) else None

    pods = _poll(running, 240, f"{expected} sample pods running", c)
    TIMINGS["samples_running"] = time.monotonic() - t0
    # None of the samples names a scheduler: the webhook gave every one of them ours.
    assert all("schedulerName" not in json.dumps(d) for d in docs)
    assert {p["spec"]["schedulerName"] for p in pods} == {"gpushare-scheduler"}
    # ...and refuses, through its Service, what the extender could never place; nothing is created.
    bad = _adapt(next(d for d in _sample_docs() if d["metadata"]["name"] == "gpushare-pod"), node_images().busybox.ref)
    bad["metadata"]["name"] = "gpushare-uneven"
    bad["metadata"]["annotations"] = {"gpushare.io/gpu-count": "3"}
    refused = c.cp.kubectl("apply", "-n", SAMPLES_NS, "-f", "-", input=json.dumps(bad), check=False)
    print(f"\n[helm-realnode] kubectl apply (4 GiB over gpu-count 3): {refused.stderr.strip()}")
    assert refused.returncode != 0
    denied = f'admission webhook "request.gpushare.io" denied the request: gpushare: pod {SAMPLES_NS}/gpushare-uneven: '
    assert denied in refused.stderr and "must divide evenly by the GPU count" in refused.stderr, refused.stderr
    assert c.cp.kubectl("get", "pod", "-n", SAMPLES_NS, "gpushare-uneven", check=False).returncode != 0
    gpus = {g["index"]: g for g in json.loads(c.get("node", NODE)["metadata"]["annotations"]["gpushare.io/gpus"])}
    checked = 0
    for pod in pods:
        name, ann = pod["metadata"]["name"], pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == NODE
        indices = ann["gpushare.io/gpu-index"].split(",")
        count = len(indices)
        assert ann["gpushare.io/assigned"] == "true", ann
        for ctr in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
            env = _poll(
                lambda n=name, x=ctr["name"]: _printed_env(c.node.pod_log(SAMPLES_NS, n, x)), 60, f"{name} env", c
            )
            where = f"{name}/{ctr['name']}: {env}"
            assert env["GPUSHARE_GPU_INDEX"] == ann["gpushare.io/gpu-index"], where
            assert env["NVIDIA_VISIBLE_DEVICES"] == ann["gpushare.io/gpu-uuid"], where
            assert int(env["GPUSHARE_MEM_LIMIT_MIB"]) == _limit_gib(ctr) * 1024 // count, where
            totals = [int(gpus[int(i)]["memory"]) * 1024 for i in indices]
            assert [int(x) for x in env["GPUSHARE_MEM_TOTAL_MIB"].split(",")] == totals, where
            assert env["ALIYUN_COM_GPU_MEM_POD"] == ann["gpushare.io/gpu-mem"], where
            checked += 1
    if "gpushare.io/gpu-model" in json.dumps([d["metadata"] for d in docs]):
        model_pod = next(p for p in pods if p["metadata"]["name"] == "gpushare-gpu-model")
        idx = int(model_pod["metadata"]["annotations"]["gpushare.io/gpu-index"])
        assert "T4" in gpus[idx]["model"]
    assert checked >= expected
    print(f"\n[helm-realnode] {len(pods)} sample pods, {checked} containers' env checked")


def test_helm_upgrade_rolls_every_workload_and_keeps_the_webhook_ca(installed: Cluster) -> None:
    c = installed
    before = {p["metadata"]["name"] for p in c.pods(NAMESPACE)}
    secret_before = c.get("secret", "-n", NAMESPACE, WEBHOOK_SECRET)
    values = _values(c)
    values["logLevel"] = "debug"  # both workloads' args change
    values["scheduler"]["policy"] = "spread"
    t0 = time.monotonic()
    c.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "-f", str(_values_file(c, "values-upgrade.yaml", values)), "--wait", "--timeout", "3m",
    )  # fmt: skip

    def rolled() -> list[dict[str, Any]] | None:
        pods = c.pods(NAMESPACE)
        fresh = [p for p in pods if p["metadata"]["name"] not in before]
        if len(pods) == 5 and len(fresh) == 5 and all(_ready(p) for p in pods):
            return pods
        return None

    pods = _poll(rolled, 240, "every release pod replaced and ready, none left terminating", c)
    TIMINGS["helm_upgrade"] = time.monotonic() - t0
    # The new settings reached the programs through the configuration ConfigMap (--config), and its
    # checksum rolled the pods above.
    for p in pods:
        for ctr in p["spec"]["containers"]:
            if ctr["name"] in ("device-plugin", "extender", "webhook"):
                assert "--config=/etc/gpushare/config.yaml" in ctr["args"], ctr["args"]
    configs = [
        yaml.safe_load(cm["data"]["config.yaml"])
        for cm in c.get("configmap", "-n", NAMESPACE)["items"]
        if "config.yaml" in (cm.get("data") or {})
    ]
    assert len(configs) == 1, configs
    assert configs[0]["plugin"]["logLevel"] == configs[0]["scheduler"]["logLevel"] == "DEBUG"
    assert configs[0]["webhook"]["logLevel"] == "DEBUG"
    assert configs[0]["scheduler"]["policy"] == "spread"
    _poll(lambda: _node_gpu_mem(c) == GPU_MEM_UNITS, 120, "the new plugin registered", c)
    # A new pod is still placed by the new scheduler and gets its env (in a namespace of its own: the
    # samples test counts the pods of its namespace, whichever of the two runs first).
    _namespace(c, UPGRADE_NS)
    pod = _adapt(next(d for d in _sample_docs() if d["metadata"]["name"] == "gpushare-pod"), node_images().busybox.ref)
    pod["metadata"]["name"] = "gpushare-pod-after-upgrade"
    c.cp.kubectl("apply", "-n", UPGRADE_NS, "-f", "-", input=json.dumps(pod))
    _poll(lambda: _ready(c.get("pod", "-n", UPGRADE_NS, "gpushare-pod-after-upgrade")), 120, "new pod running", c)
    env = _poll(lambda: _printed_env(c.node.pod_log(UPGRADE_NS, "gpushare-pod-after-upgrade", "cuda")), 60, "env", c)
    after = c.get("pod", "-n", UPGRADE_NS, "gpushare-pod-after-upgrade")
    assert env["GPUSHARE_GPU_INDEX"] == after["metadata"]["annotations"]["gpushare.io/gpu-index"]
    assert after["spec"]["schedulerName"] == "gpushare-scheduler", "the new webhook replicas gave it"
    # The upgrade kept the webhook's certificate (helm never renders the Secret, and leaves the caBundle
    # it never rendered), so the configurations trust the new replicas at once.
    secret = c.get("secret", "-n", NAMESPACE, WEBHOOK_SECRET)
    assert secret["data"] == secret_before["data"]
    assert _ca_bundles(c) == {secret["data"]["ca.crt"]}


def test_helm_uninstall_leaves_nothing_behind(installed: Cluster) -> None:
    c = installed
    t0 = time.monotonic()
    c.cp.kubectl("delete", "namespace", *POD_NAMESPACES, "--wait=false", "--ignore-not-found")
    c.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m")
    selector = f"app.kubernetes.io/instance={RELEASE}"
    kinds = (
        "pods,daemonsets,deployments,replicasets,services,configmaps,serviceaccounts,roles,rolebindings,"
        "poddisruptionbudgets,controllerrevisions"
    )

    def gone() -> bool:
        left = c.get(kinds, "-A", "-l", selector)["items"]
        left += c.get("clusterroles,clusterrolebindings", "-l", selector)["items"]
        left += c.get("mutatingwebhookconfigurations,validatingwebhookconfigurations", "-l", selector)["items"]
        if serves_policy(c.cp):
            left += c.get(POLICY_KINDS, "-l", selector)["items"]
        # the webhook's own Secret (helm never made it): the garbage collector deletes it with its owner
        left += [x for x in c.get("secrets", "-n", NAMESPACE)["items"] if x["metadata"]["name"] == WEBHOOK_SECRET]
        left += c.pods(NAMESPACE)
        return not left

    _poll(gone, 120, "every object of the release gone", c)
    for ns in POD_NAMESPACES:
        _poll(lambda ns=ns: not c._ns_exists(ns), 120, f"namespace {ns} gone (no pod stuck terminating)", c)
    # kubelet drops the resource once the plugin's socket is gone
    _poll(lambda: _node_gpu_mem(c) == 0, 120, "nvidia.com/gpu-mem allocatable back to 0", c)
    # the chart's pre-delete hook (share-plugin --unpublish) removed what the plugin published on the node
    node = c.get("node", NODE)
    assert ANN_NODE_GPUS not in (node["metadata"].get("annotations") or {}), node["metadata"]["annotations"]
    assert RESOURCE_COUNT not in node["status"].get("capacity", {}), node["status"]["capacity"]
    assert not c.get("jobs", "-A", "-l", selector)["items"], "the hook Job is deleted once it succeeded"
    TIMINGS["helm_uninstall"] = time.monotonic() - t0
    leftovers = [x["metadata"]["name"] for x in c.get("lease", "-n", NAMESPACE)["items"]]
    print(f"\n[helm-realnode] after uninstall, in {NAMESPACE}: leases {leftovers} (kube-scheduler's, not the chart's)")
    # Nothing of ours runs on the node any more; kubelet's garbage collection then removes the
    # exited containers' records too.
    assert c.node.ctr("tasks", "ls", "-q").stdout.split() == []
    t1 = time.monotonic()
    _poll(lambda: not c.node.ctr("containers", "ls", "-q").stdout.split(), 180, "containers removed by kubelet", c)
    TIMINGS["containers_collected"] = time.monotonic() - t1
