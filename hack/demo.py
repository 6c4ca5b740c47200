"""`make demo`: a local control plane with two simulated GPU nodes, the samples applied, and where
they landed, as `kubectl inspect gpushare` shows it.

Everything runs on loopback: etcd, kube-apiserver and kube-scheduler built from upstream by
hack/build-k8s.sh, our extender, a device plugin per node and a kubelet stand-in per node.
"""

from __future__ import annotations

import argparse
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
        "Building kube-apiserver, kube-scheduler, etcd, kubectl and helm from Go modules "
        "(first run only: about 9 minutes on 2 cores; cached in ~/.cache/gpushare)"
    )
    result = subprocess.run([str(REPO / "hack" / "build-k8s.sh")], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"hack/build-k8s.sh failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    parser.add_argument("--policy", default="binpack", help="placement policy of the extender")
    args = parser.parse_args(argv)

    from share_core.assignment import parse_assignment, pod_annotations
    from share_core.contract import ENV_MEM_LIMIT_MIB, ENV_VISIBLE_DEVICES
    from share_inspect.cli import main as inspect_main
    from tests.controlplane import ControlPlane
    from tests.controlplane.gpucluster import GpuCluster, expand_workloads, load_yaml_docs

    bin_dir = build_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="gpushare-demo-"))
    say(f"Starting etcd and a secured kube-apiserver on 127.0.0.1 (work dir {workdir})")
    cp = ControlPlane(workdir / "controlplane", bin_dir)
    cp.start()
    cluster = GpuCluster(cp, workdir / "gpushare", policy=args.policy)
    try:
        say("Installing the chart's RBAC; starting the extender (share-scheduler) and kube-scheduler")
        cluster.start()
        for name, gpus in (("node-a100", "2xA100:80GiB"), ("node-t4", "4xT4:16GiB")):
            say(f"Adding simulated node {name} ({gpus}): device plugin + kubelet stand-in")
            cluster.add_node(name, gpus)
        namespace = "demo"
        cluster.create_namespace(namespace)
        docs = [d for f in sorted((REPO / "samples").glob("*.yaml")) for d in load_yaml_docs(f)]
        pods = expand_workloads(docs, namespace)
        say(f"Applying {len(pods)} pods from samples/ ({', '.join(sorted({d['kind'] for d in docs}))})")
        for pod in pods:
            cluster.create_pod(pod)
        cluster.wait_all_running(namespace, len(pods), timeout=120)
        say("Where they landed, and what each container was told:")
        for pod in sorted(cluster.pods(namespace), key=lambda p: p["metadata"]["name"]):
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
        cp.stop()
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    sys.exit(main())
