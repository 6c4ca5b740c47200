"""What admission decides about a pod: the scheduler it gets, and whether gpushare could ever place it.

Pure functions over the pod (the API's JSON form) and a summary of the cluster's GPUs; the webhook
(share_webhook) calls them at `kubectl apply`, the extender (share_scheduler) at filter, so a request is
refused with one message wherever it is found. What can never be scheduled (a fractional request,
requests != limits, a GPU count that does not divide the request, garbage annotations) is refused; what
may become schedulable later (a model not in the cluster today, a size larger than every GPU present
now) is a warning: a node can join tomorrow.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.gpus import GpuInfo
from share_core.request import InvalidRequest
from share_core.request import PodRequest
from share_core.request import pod_request

Pod = Mapping[str, Any]
DEFAULT_SCHEDULER = "default-scheduler"


def invalid_request_message(pod: Pod, exc: InvalidRequest) -> str:
    """The refusal a person reads, in the extender's FailedScheduling event and at `kubectl apply` alike."""
    meta = pod.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "?"
    return f"pod {meta.get('namespace', 'default')}/{name}: {exc}"


def asks_gpu_mem(pod: Pod) -> bool:
    """Whether any container (init and sidecar included) names `nvidia.com/gpu-mem` in limits or requests.

    Only presence counts: a malformed quantity is still ours, to be refused with its reason."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        return False
    for field in ("initContainers", "containers"):
        for c in spec.get(field) or []:
            resources = c.get("resources") if isinstance(c, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for part in ("limits", "requests"):
                values = resources.get(part)
                if isinstance(values, Mapping) and RESOURCE_MEM in values:
                    return True
    return False


def _scheduler_named(pod: Pod) -> Any:
    spec = pod.get("spec") or {}
    return spec.get("schedulerName") if isinstance(spec, Mapping) else None


def choose_scheduler(
    pod: Pod, opted_in: bool, scheduler_name: str = SCHEDULER_NAME, claims_ours: bool = False
) -> str | None:
    """The scheduler the mutating webhook sets on a pod (None: leave the pod). A pod asking gpu-mem that
    names no scheduler (or the default one) gets ours; so does one whose ResourceClaims ask our DeviceClass
    (`claims_ours`: DRA mode, where the policy places claims through the extender); in an opted-in
    namespace every pod does, CPU-only pods included, so the policy places them too. A pod that names
    another scheduler keeps it (validation warns a gpu-mem one: `other_scheduler`). The chart's
    MutatingAdmissionPolicy (Kubernetes 1.36+) decides the gpu-mem case in CEL the same way."""
    named = _scheduler_named(pod)
    if named in (None, "", DEFAULT_SCHEDULER) and (opted_in or claims_ours or asks_gpu_mem(pod)):
        return scheduler_name
    return None


def other_scheduler(pod: Pod, scheduler_name: str = SCHEDULER_NAME) -> str | None:
    """The warning for a pod asking gpu-mem that is stored with another scheduler than ours: our device plugin
    will refuse its containers. Said at validation, of the pod as stored, whichever mutation ran (the
    webhook's, the chart's policy, or none: a mutation that failed open leaves default-scheduler)."""
    named = _scheduler_named(pod)
    if named == scheduler_name or not asks_gpu_mem(pod):
        return None
    return (
        f"schedulerName {named or DEFAULT_SCHEDULER!r} is not {scheduler_name!r}: {RESOURCE_MEM} is served only to "
        f"pods {scheduler_name} placed; gpushare's device plugin will refuse this pod's containers"
    )


@dataclass(frozen=True, slots=True)
class ClusterGpus:
    """What admission knows of the cluster's GPUs today: their models and per-node GPU sizes, one node of
    each shape (its healthy GPUs' models and sizes): a review then looks at a few shapes, not at every
    node (5,000 alike nodes are one), so a pod no node fits costs no more to review than one that fits."""

    nodes: tuple[tuple[GpuInfo, ...], ...] = ()

    @staticmethod
    def of(nodes: Iterable[Sequence[GpuInfo]]) -> ClusterGpus:
        shapes: dict[tuple[tuple[str, int], ...], tuple[GpuInfo, ...]] = {}
        for gpus in nodes:
            healthy = tuple(g for g in gpus if g.healthy)
            shapes.setdefault(tuple(sorted((g.model, g.memory) for g in healthy)), healthy)
        return ClusterGpus(tuple(shapes.values()))


@dataclass(frozen=True, slots=True)
class Verdict:
    """`refusal` set: the pod can never be scheduled (the message names why); else allowed, with warnings."""

    refusal: str | None = None
    warnings: tuple[str, ...] = ()
    request: PodRequest | None = None


def _fits_some_node(request: PodRequest, cluster: ClusterGpus) -> tuple[bool, bool]:
    """(some node has `gpu_count` GPUs of an allowed model, some such node has them with room for a share)."""
    model_ok = size_ok = False
    for gpus in cluster.nodes:
        allowed = [g for g in gpus if request.model_allowed(g.model)]
        if len(allowed) < request.gpu_count:
            continue
        model_ok = True
        if sum(1 for g in allowed if g.memory >= request.per_gpu) >= request.gpu_count:
            size_ok = True
            break
    return model_ok, size_ok


def review(pod: Pod, cluster: ClusterGpus | None, unit: str = "GiB", scheduler_name: str | None = None) -> Verdict:
    """Refuse what can never be scheduled; warn about what cannot be today (`cluster` None: unknown, no
    warnings) and, with `scheduler_name`, about a pod stored with another scheduler. The refusal is
    `invalid_request_message`, the extender's own."""
    try:
        request = pod_request(pod)
    except InvalidRequest as exc:
        return Verdict(refusal=invalid_request_message(pod, exc))
    other = other_scheduler(pod, scheduler_name) if scheduler_name else None
    verdict = _capacity_verdict(request, cluster, unit)
    if other is None:
        return verdict
    return Verdict(warnings=(other, *verdict.warnings), request=request)


def _capacity_verdict(request: PodRequest | None, cluster: ClusterGpus | None, unit: str) -> Verdict:
    """Warnings about what no GPU in the cluster fits today."""
    if request is None or cluster is None:
        return Verdict(request=request)
    model_ok, size_ok = _fits_some_node(request, cluster)
    where = "one GPU" if request.gpu_count == 1 else f"each of {request.gpu_count} GPUs on one node"
    need = f"{request.per_gpu} {unit} of {RESOURCE_MEM} on {where}"
    if request.models and not model_ok:
        models = "|".join(request.models)
        return Verdict(
            warnings=(
                f"no node has {request.gpu_count} healthy GPU(s) of model {models} today; the pod stays Pending "
                f"until one joins (gpushare.io/gpu-model)",
            ),
            request=request,
        )
    if not size_ok:
        largest = max((g.memory for gpus in cluster.nodes for g in gpus), default=0)
        return Verdict(
            warnings=(
                f"pod needs {need}; the largest healthy GPU in the cluster today has {largest} {unit}: it stays "
                f"Pending until a node with room for it joins",
            ),
            request=request,
        )
    return Verdict(request=request)
