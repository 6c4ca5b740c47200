"""Workload variants, derived from a trace the way the FGD paper's evaluation derives them.

Weng et al. (ATC '23, section 6) evaluate on the openb default trace and on variants of the same
production cluster that stress one kind of pod each. `derive(workload, "family=value", seed)` builds
such a variant from any loaded workload (openb CSV or YAML), resampling pods of the trace with
replacement (seeded), so every pod of a variant is a pod the trace really has:

- ``gpushare=P`` (20..100): P % of the GPU pods share a GPU (ask part of one GPU). The number of GPU
  pods stays; sharing pods are drawn from the trace's sharing pods, the rest from its whole-GPU pods.
- ``multigpu=P`` (20..50): multi-GPU pods ask P % of the GPU demand. The number of single-GPU pods
  stays; multi-GPU pods are drawn until their demand reaches P / (100 - P) x the single-GPU demand.
- ``gpuspec=P`` (5..33): P % of the GPU pods, chosen at random, may only use some GPU models. The
  restriction is drawn from the model mix of the restricted pods in the public gpuspec33 trace
  (mostly T4, then P100, the V100s, G2 and G3), keeping only restrictions some node can serve (a model
  present with enough GPUs and CPU for the pod); a cluster with none of those models draws one of its
  own models, weighted by GPU count.
- ``cpu=X`` (0..3): CPU-only pods ask X times the CPU they ask in the trace: they are drawn until their
  CPU demand reaches X x the trace's (none at 0). GPU pods stay.

The simulator's protocol then draws arrivals from the variant as from any trace (until the GPU demand
reaches `--tune` x capacity), so "total arrivals" follow the protocol, not the variant's pod count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from dataclasses import replace

from share_scheduler.sim.workload import SimPod
from share_scheduler.sim.workload import Workload

FAMILIES: dict[str, tuple[float, float]] = {
    "gpushare": (0.0, 100.0),
    "multigpu": (0.0, 95.0),
    "gpuspec": (0.0, 100.0),
    "cpu": (0.0, 10.0),
}
# The points the docs' table reports (extremes and a middle point per family); see docs/simulator.md.
DOC_POINTS: dict[str, tuple[float, ...]] = {
    "gpushare": (20, 60, 100),
    "multigpu": (20, 30, 50),
    "gpuspec": (5, 20, 33),
    "cpu": (0, 1, 3),
}
# Restrictions of the restricted pods in the public gpuspec33 trace (share of them, rounded).
GPUSPEC_MIX: tuple[tuple[tuple[str, ...], float], ...] = (
    (("t4",), 0.60),
    (("p100",), 0.16),
    (("v100m16", "v100m32"), 0.08),
    (("g2",), 0.06),
    (("p100", "v100m16", "v100m32"), 0.04),
    (("g3",), 0.02),
    (("v100m32",), 0.02),
    (("g2", "p100", "t4", "v100m16", "v100m32"), 0.02),
)


class VariantError(ValueError):
    """A variant the generator cannot build; the message says why."""


@dataclass(frozen=True, slots=True)
class Mix:
    """What a workload's pod population looks like (printed for every variant)."""

    pods: int
    cpu_only: int
    gpu_pods: int
    share_pct: float  # sharing pods among GPU pods
    multi_demand_pct: float  # GPU demand of multi-GPU pods among all GPU demand
    restricted_pct: float  # GPU pods restricted to GPU models
    cpu_only_cpu: int  # millicores asked by CPU-only pods

    def line(self) -> str:
        return (
            f"{self.pods} pods: {self.cpu_only} CPU-only ({self.cpu_only_cpu / 1000:.0f} cores), "
            f"{self.gpu_pods} GPU pods, {self.share_pct:.1f}% of them sharing a GPU, "
            f"{self.restricted_pct:.1f}% restricted to GPU models, "
            f"multi-GPU pods ask {self.multi_demand_pct:.1f}% of the GPU demand"
        )


def _is_share(p: SimPod, unit: int) -> bool:
    return p.count == 1 and p.per_gpu < unit


def gpu_unit(workload: Workload) -> int:
    """The size of the cluster's largest GPU: a pod asking that much of one GPU takes it whole."""
    return max(max(n.gpus) for n in workload.nodes if n.gpus)


def mix(workload: Workload) -> Mix:
    unit = gpu_unit(workload)
    pods = workload.pods
    gpu = [p for p in pods if p.count > 0]
    demand = sum(p.gpu_request for p in gpu)
    multi = sum(p.gpu_request for p in gpu if p.count > 1)
    return Mix(
        pods=len(pods),
        cpu_only=len(pods) - len(gpu),
        gpu_pods=len(gpu),
        share_pct=100.0 * sum(1 for p in gpu if _is_share(p, unit)) / len(gpu) if gpu else 0.0,
        multi_demand_pct=100.0 * multi / demand if demand else 0.0,
        restricted_pct=100.0 * sum(1 for p in gpu if p.models) / len(gpu) if gpu else 0.0,
        cpu_only_cpu=sum(p.cpu for p in pods if p.count == 0),
    )


def parse(spec: str) -> tuple[str, float]:
    """'gpushare=60' -> ('gpushare', 60.0), with a clear error for anything else."""
    family, sep, value = spec.partition("=")
    family = family.strip().lower()
    if not sep or family not in FAMILIES:
        raise VariantError(f"variant {spec!r}: expected FAMILY=VALUE with FAMILY one of {', '.join(FAMILIES)}")
    try:
        number = float(value.rstrip("x%"))
    except ValueError:
        raise VariantError(f"variant {spec!r}: {value!r} is not a number") from None
    low, high = FAMILIES[family]
    if not low <= number <= high:
        raise VariantError(f"variant {spec!r}: {family} must be between {low:g} and {high:g}")
    return family, number


def derive(workload: Workload, spec: str, seed: int = 0) -> Workload:
    """The variant `spec` of `workload` (see the module docstring), reproducible for a seed."""
    family, value = parse(spec)
    rng = random.Random(f"{spec}-{seed}")
    unit = gpu_unit(workload)
    pods = list(workload.pods)
    cpu_only = [p for p in pods if p.count == 0]
    gpu = [p for p in pods if p.count > 0]
    if not gpu and family != "cpu":
        raise VariantError(f"variant {spec!r}: the trace has no GPU pods")
    if family == "gpushare":
        share = [p for p in gpu if _is_share(p, unit)]
        whole = [p for p in gpu if not _is_share(p, unit)]
        n_share = round(value / 100.0 * len(gpu))
        if (n_share and not share) or (len(gpu) - n_share and not whole):
            raise VariantError(f"variant {spec!r}: the trace lacks sharing or whole-GPU pods to draw from")
        gpu = [rng.choice(share) for _ in range(n_share)] + [rng.choice(whole) for _ in range(len(gpu) - n_share)]
    elif family == "multigpu":
        multi = [p for p in gpu if p.count > 1]
        single = [p for p in gpu if p.count == 1]
        if not multi or not single:
            raise VariantError(f"variant {spec!r}: the trace lacks multi-GPU or single-GPU pods to draw from")
        target = value / (100.0 - value) * sum(p.gpu_request for p in single)
        drawn: list[SimPod] = []
        asked = 0
        while asked < target:
            p = rng.choice(multi)
            drawn.append(p)
            asked += p.gpu_request
        gpu = single + drawn
    elif family == "gpuspec":
        gpu = _restrict(workload, gpu, value / 100.0, rng)
    else:  # cpu
        base = sum(p.cpu for p in cpu_only)
        if value > 0 and (not cpu_only or base <= 0):
            raise VariantError(f"variant {spec!r}: the trace has no CPU-only pods asking for CPU")
        drawn = []
        asked = 0
        while asked < value * base:
            p = rng.choice(cpu_only)
            drawn.append(p)
            asked += p.cpu
        cpu_only = drawn
    # Keep the trace's order of kinds irrelevant: the protocol draws arrivals at random anyway.
    return replace(workload, pods=tuple(cpu_only + gpu))


def _restrict(workload: Workload, gpu: list[SimPod], share: float, rng: random.Random) -> list[SimPod]:
    """Restrict `share` of the GPU pods to GPU models, drawn from GPUSPEC_MIX (or the cluster's models)."""
    present = {n.model.lower() for n in workload.nodes if n.gpus}

    shapes = {(n.model.lower(), tuple(n.gpus), n.cpu) for n in workload.nodes if n.gpus}
    served: dict[tuple[tuple[str, ...], int, int, int], bool] = {}

    def can_serve(models: tuple[str, ...], pod: SimPod) -> bool:
        key = (models, pod.per_gpu, pod.count, pod.cpu)
        if key not in served:
            served[key] = any(
                model in models
                and sum(1 for g in gpus if g >= pod.per_gpu) >= pod.count
                and (cpu is None or cpu >= pod.cpu)
                for model, gpus, cpu in shapes
            )
        return served[key]

    mix_ = [(m, w) for m, w in GPUSPEC_MIX if any(x in present for x in m)]
    if not mix_:
        counts: dict[str, int] = {}
        for n in workload.nodes:
            counts[n.model.lower()] = counts.get(n.model.lower(), 0) + len(n.gpus)
        mix_ = [((m,), float(c)) for m, c in sorted(counts.items()) if m]
    chosen = set(rng.sample(range(len(gpu)), round(share * len(gpu))))
    out = []
    for i, pod in enumerate(gpu):
        if i in chosen and not pod.models:
            options = [(m, w) for m, w in mix_ if can_serve(m, pod)]
            if options:
                models = rng.choices([m for m, _ in options], weights=[w for _, w in options])[0]
                pod = replace(pod, models=tuple(sorted(models)))
        out.append(pod)
    return out
