"""`share-scheduler print-config`: the KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) that
wires kube-scheduler to this extender. Field names follow upstream `k8s.io/kube-scheduler/config/v1`.
"""

from __future__ import annotations

from typing import Any

import yaml

from share_core.contract import EXTENDER_DEFAULT_PORT
from share_core.contract import EXTENDER_PREFIX
from share_core.contract import SCHEDULER_NAME

DEFAULT_EXTENDER_URL = f"http://127.0.0.1:{EXTENDER_DEFAULT_PORT}{EXTENDER_PREFIX}"

# Score plugins whose preferences fight GPU packing: NodeResourcesFit scores LeastAllocated by default
# (it spreads), BalancedAllocation spreads to even out CPU/memory, PodTopologySpread's default system
# constraints spread replicas over hosts, ImageLocality pulls pods to wherever an image is cached.
# Their Filter stages stay on: only their scores are turned off.
SCORE_PLUGINS_DISABLED = (
    "NodeResourcesFit",
    "NodeResourcesBalancedAllocation",
    "PodTopologySpread",
    "ImageLocality",
)

# The extender's 0..10 score is multiplied by weight and by 10 (MaxNodeScore / MaxExtenderPriority).
# The plugins left scoring (TaintToleration 3, NodeAffinity 2, InterPodAffinity 2: at most 700 in all)
# stay below one step of ours (1 x 100 x 10 = 1000): user preferences break our ties, never override us.
EXTENDER_WEIGHT = 100

HTTP_TIMEOUT = "30s"  # bind may wait for the node lock behind other binds, and retries conflicts


def scheduler_config(
    extender_url: str = DEFAULT_EXTENDER_URL,
    kubeconfig: str | None = None,
    leader_elect: bool = True,
    scheduler_name: str = SCHEDULER_NAME,
    filter_keeps: str = "best",
    bind: bool = True,
) -> dict[str, Any]:
    """The configuration as plain data (tests validate its shape; print_config renders it).

    `filter_keeps` must match the extender's flag: with "best" its filter leaves only the nodes its
    policy would choose among, so there is no prioritizeVerb (and no weight): one HTTP call per
    scheduling cycle instead of two."""
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": leader_elect,
            "resourceNamespace": "kube-system",
            "resourceName": scheduler_name,
        },
        # Score every feasible node: by default a large cluster sends the extender only a sample
        # (adaptive, down to 5%), and binpack cannot find the fullest GPU among nodes it never sees.
        "percentageOfNodesToScore": 100,
        "profiles": [
            {
                "schedulerName": scheduler_name,
                "plugins": {"score": {"disabled": [{"name": n} for n in SCORE_PLUGINS_DISABLED]}},
            }
        ],
        "extenders": [
            {
                "urlPrefix": extender_url.rstrip("/"),
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                # Victims that free room on ONE GPU (share_scheduler.preempt); UIDs in, UIDs out (nodeCacheCapable).
                "preemptVerb": "preempt",
                "weight": EXTENDER_WEIGHT,
                "httpTimeout": HTTP_TIMEOUT,
                # Node names only: the extender has its own node cache (5,000 full nodes are tens of MB).
                "nodeCacheCapable": True,
                # No managedResources: kube-scheduler's HTTPExtender.IsInterested (pkg/scheduler/extender.go)
                # calls an extender without them for every pod of the profile, so pods that ask no GPU
                # are placed by the policy too (it sees the whole node). kube-scheduler still checks the
                # node capacity of nvidia.com/gpu-mem itself (NodeResourcesFit ignores only resources an
                # extender lists with ignoredByScheduler).
                # Not ignorable: without the extender no GPU is chosen, and a bound pod would lack its GPU.
                "ignorable": False,
            }
        ],
    }
    if filter_keeps == "best":
        extender = config["extenders"][0]
        del extender["prioritizeVerb"], extender["weight"]
    if not bind:
        # DRA mode alone: kube-scheduler's DefaultBinder binds, after its DynamicResources PreBind wrote
        # the claims' allocation; the extender only filters.
        del config["extenders"][0]["bindVerb"]
        del config["extenders"][0][
            "preemptVerb"
        ]  # a DRA pod's GPUs are its claims: kube-scheduler's DRA plugin weighs them
    if kubeconfig:
        config["clientConnection"] = {"kubeconfig": kubeconfig}
    return config


HEADER = """\
# KubeSchedulerConfiguration for the gpushare scheduler extender (share-scheduler print-config).
# - percentageOfNodesToScore: 100 -- kube-scheduler otherwise scores only a sample of a large
#   cluster's nodes, and the placement policy cannot pick a node it is never shown.
# - filter keeps {keeps} nodes: {keeps_why}
# - score plugins that spread pods are disabled for this profile (their filters still run):
#   {disabled}.
# - nodeCacheCapable: the extender keeps its own node cache, so kube-scheduler sends node names only.
"""


KEEPS_WHY = {
    "best": "only the node the placement policy scores highest passes (ties to the\n"
    "#   lowest name; all of them for bestfit, which kube-scheduler picks from at random), so there\n"
    "#   is no prioritize call and no scoring.",
    "fitting": "every node the pod fits on passes; the extender's prioritize weight\n"
    f"#   ({EXTENDER_WEIGHT}) dominates: one step of its 0..10 score is worth {EXTENDER_WEIGHT * 10} points,\n"
    "#   more than every score plugin left enabled together.",
}


def print_config(**kw: Any) -> str:
    keeps = kw.get("filter_keeps", "best")
    header = HEADER.format(keeps=keeps, keeps_why=KEEPS_WHY[keeps], disabled=", ".join(SCORE_PLUGINS_DISABLED))
    return header + yaml.safe_dump(scheduler_config(**kw), sort_keys=False)
