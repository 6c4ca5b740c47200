"""`make demo`: a local control plane with simulated GPU nodes, the samples applied, and where they
landed, as `kubectl inspect gpushare` shows it.

Everything runs on loopback: etcd, kube-apiserver and kube-scheduler built from upstream by
hack/build-k8s.sh, our extender and a device plugin per node. Where the machine allows it (root, Debian's
runc installable, containerd v2 built by hack/build-containerd.sh), one node is real: the upstream kubelet
with containerd and runc, real containers from an image built here, and the demo prints what a container
printed. The other nodes use the kubelet stand-in; the demo says plainly when it cannot run the real one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def build_binaries() -> Path:
    say(
        "Building kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, etcd, kubectl and helm "
        "from Go modules "
        "(first run only: about 9 minutes on 2 cores; cached in ~/.cache/gpushare)"
    )
    result = subprocess.run([str(REPO / "hack" / "build-k8s.sh")], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"hack/build-k8s.sh failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


REAL_NODE = "node-real"
REAL_NODE_GPUS = "2xA100:80GiB"
# Keeps the samples (images from a registry, which a demo machine cannot pull) off the real node.
GPU_ENV_PREFIXES = ("NVIDIA_VISIBLE_DEVICES", "GPUSHARE_", "ALIYUN_COM_GPU_MEM_")
REAL_NODE_TAINT = {"key": "gpushare.io/demo", "value": "real-node", "effect": "NoSchedule"}


def real_node_blocker() -> str:
    """Why this machine cannot run a real node, or "" when it can (installs what is missing)."""
    if os.geteuid() != 0:
        return "not root (a real node needs mount namespaces, cgroups and containerd)"
    result = subprocess.run(
        [str(REPO / "hack" / "node-deps.sh")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    if result.returncode != 0:
        return f"hack/node-deps.sh failed: {result.stdout.strip()[-400:]}"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    parser.add_argument("--policy", default="binpack", help="placement policy of the extender")
    parser.add_argument("--no-real-node", action="store_true", help="use kubelet stand-ins only")
    args = parser.parse_args(argv)

    from share_core.assignment import parse_assignment
    from share_core.assignment import pod_annotations
    from share_core.contract import ENV_MEM_LIMIT_MIB
    from share_core.contract import ENV_VISIBLE_DEVICES
    from share_inspect.cli import main as inspect_main
    from tests.controlplane import ControlPlane
    from tests.controlplane.gpucluster import GpuCluster
    from tests.controlplane.gpucluster import load_yaml_docs
    from tests.controlplane.gpucluster import with_scheduler

    bin_dir = build_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="gpushare-demo-"))
    say(f"Starting etcd and a secured kube-apiserver on 127.0.0.1 (work dir {workdir})")
    cp = ControlPlane(workdir / "controlplane", bin_dir)
    cp.start()
    cluster = GpuCluster(cp, workdir / "gpushare", policy=args.policy)
    real = None
    blocker = "--no-real-node given" if args.no_real_node else real_node_blocker()
    try:
        say("Installing the chart's RBAC; starting the extender (share-scheduler) and kube-scheduler")
        cluster.start()
        namespace = "demo"
        cluster.create_namespace(namespace)
        if blocker:
            say(f"No real kubelet in this demo: {blocker}. Every node uses the kubelet stand-in.")
        else:
            real = start_real_node(cluster, workdir, namespace)
        for name, gpus in (("node-a100", "2xA100:80GiB"), ("node-t4", "4xT4:16GiB")):
            say(f"Adding simulated node {name} ({gpus}): device plugin + kubelet stand-in")
            cluster.add_node(name, gpus)
        say("Starting kube-controller-manager (Deployment and ReplicaSet controllers) for the samples")
        cp.start_controller_manager(
            controllers=("deployment-controller", "replicaset-controller", "garbage-collector-controller")
        )
        # samples/ leave schedulerName to the chart's admission webhook, which this demo does not run
        docs = [with_scheduler(d) for f in sorted((REPO / "samples").glob("*.yaml")) for d in load_yaml_docs(f)]
        expected = sum(int(d["spec"].get("replicas", 1)) if d["kind"] != "Pod" else 1 for d in docs)
        say(f"Applying samples/: {len(docs)} objects ({', '.join(sorted({d['kind'] for d in docs}))}), {expected} pods")
        cp.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
        )
        cluster.wait_all_running(namespace, expected + (1 if real is not None else 0), timeout=120)
        say("Where they landed, and what each container was told:")
        for pod in sorted(cluster.pods(namespace), key=lambda p: p["metadata"]["name"]):
            if pod["spec"].get("nodeName") not in cluster.nodes:
                continue  # the real node's pod: shown above from its containers' own logs
            a = parse_assignment(pod_annotations(pod))
            env = cluster.env_of(pod)
            for container, e in env.items():
                print(
                    f"    {pod['metadata']['name']:<34} {container:<10} node={pod['spec']['nodeName']:<10} "
                    f"gpu={','.join(map(str, a.gpu_indices)) if a else '?':<4} "
                    f"{ENV_MEM_LIMIT_MIB}={e.get(ENV_MEM_LIMIT_MIB)} {ENV_VISIBLE_DEVICES}={e.get(ENV_VISIBLE_DEVICES)}"
                )
        say("kubectl inspect gpushare")
        inspect_main(["--kubeconfig", str(cp.admin_kubeconfig), "--no-color"])
        say("kubectl inspect gpushare -d")
        inspect_main(["--kubeconfig", str(cp.admin_kubeconfig), "--no-color", "-d"])
        cluster.check_invariants()
        if real is not None:
            real.check_invariants()
        say("Every container's env names the GPU its pod's annotations name; no GPU is over-committed.")
        if args.keep:
            say(f"Cluster kept running. Try: KUBECONFIG={cp.admin_kubeconfig} kubectl get pods -A")
            say(f"  or: kubectl-inspect-gpushare --kubeconfig {cp.admin_kubeconfig}  (Ctrl-C to stop)")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        say("Stopping everything the demo started")
        cluster.stop()
        if real is not None:
            real.stop()
            real.node.stop()
        cp.stop()
    return 0


def start_real_node(cluster, workdir: Path, namespace: str):  # type: ignore[no-untyped-def]
    """The real node, our plugin on it, and one pod whose containers print what they were given."""
    from share_core.contract import ENV_VISIBLE_DEVICES
    from tests.controlplane.realgpunode import RealGpuNode
    from tests.node import RealNode

    say(f"Adding real node {REAL_NODE} ({REAL_NODE_GPUS}): upstream kubelet, containerd and runc, our device plugin")
    node = RealNode(cluster.cp, REAL_NODE, workdir / "real-node").start()
    cluster.admin.request(
        "PATCH",
        f"/api/v1/nodes/{REAL_NODE}",
        body={"spec": {"taints": [REAL_NODE_TAINT]}},
        content_type="application/merge-patch+json",
    )
    real = RealGpuNode(cluster, node, REAL_NODE_GPUS)
    try:
        real.start_plugin()
        say(f"kubelet on {REAL_NODE} is Ready and lists {real.units} nvidia.com/gpu-mem from our plugin")
        extra = {
            "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
            "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
        }
        pod = real.pod("hello-real-kubelet", namespace, [6, 2], init_gib=2, extra=extra)
        cluster.create_pod(pod)
        pod = cluster.wait_phase(namespace, pod["metadata"]["name"], ["Running"], timeout=120)
        say(f"Pod {pod['metadata']['name']} runs on {REAL_NODE}; its containers printed (kubectl logs, GPU lines):")
        for container, env in real.env_of(pod).items():
            shown = {k: v for k, v in sorted(env.items()) if k.startswith(GPU_ENV_PREFIXES)}
            print(f"    {container}: " + " ".join(f"{k}={v}" for k, v in shown.items()))
            if ENV_VISIBLE_DEVICES not in env:
                raise RuntimeError(f"container {container} printed no {ENV_VISIBLE_DEVICES}: {env}")
    except BaseException:
        real.stop()
        node.stop()
        raise
    return real


if __name__ == "__main__":
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    sys.exit(main())
