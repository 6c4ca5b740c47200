"""Device-plugin requests to DRA claims: `limits: nvidia.com/gpu-mem: N` becomes a ResourceClaimTemplate.

The migration path of docs/dra.md, as a pure translation of the whole device-plugin request language:

- one claim per container that asks memory (share-dra gives a container the env of its whole claim, so
  a claim per container is what keeps each container's own limit in GPUSHARE_MEM_LIMIT_MIB); each claim
  from a ResourceClaimTemplate `<workload>-<container>-gpu-mem`;
- `gpushare.io/gpu-count: N` becomes N requests of `limit / N` in the container's claim, kept on different
  GPUs by `distinctAttribute: gpushare.io/uuid` (constraints act within one claim);
- `gpushare.io/gpu-model` becomes a CEL selector (each allowed model a case-insensitive substring, ORed);
- a regular init container runs before the app containers, so it uses the claim of the smallest app
  container (or sidecar) that asks at least as much, as kube-scheduler lets init containers reuse app
  containers' requests for extended resources (`createRequestsAndMappings`); only when none is big enough
  does it get a claim of its own, held for the pod's lifetime (reported in `Converted.notes`);
- the limits and requests of `nvidia.com/gpu-mem`, `schedulerName: gpushare-scheduler` and the two
  annotations are removed.

What differs: device-plugin mode puts all of a pod's containers on the same GPU(s); separate claims may
land on different GPUs of the node (a note says so). `convert_manifest` works on a Pod or anything with a
pod template (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob); `main` is the
`gpushare-dra-convert` command over YAML streams.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import TextIO

from share_core.contract import ANN_GPU_COUNT
from share_core.contract import ANN_GPU_MODEL
from share_core.contract import DRA_ATTR_MODEL
from share_core.contract import DRA_ATTR_UUID
from share_core.contract import DRA_CAPACITY_MEMORY
from share_core.contract import DRA_DEVICE_CLASS
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_core.request import ContainerRequest
from share_core.request import InvalidRequest
from share_core.request import pod_request

Obj = dict[str, Any]

CLAIM_PREFIX = "gpu-mem-"  # the pod's spec.resourceClaims entry of container c: gpu-mem-<c>
TEMPLATE_SUFFIX = "-gpu-mem"
RESOURCE_API = "resource.k8s.io/v1"
UUID_ATTRIBUTE = f"{DRA_DRIVER_NAME}/{DRA_ATTR_UUID}"
NAME_MAX = 63  # a request name is a DNS label


@dataclass
class Converted:
    """One manifest's translation: the claim templates to create first (none: nothing asks GPU memory)."""

    templates: list[Obj]
    manifest: Obj
    notes: list[str] = field(default_factory=list)


def quantity(units: int, unit: MemoryUnit) -> str:
    mib = units * unit.mib
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def model_selector(models: Sequence[str]) -> str:
    """CEL matching like the gpu-model annotation: any allowed model as a case-insensitive substring."""
    attr = f'device.attributes["{DRA_DRIVER_NAME}"].{DRA_ATTR_MODEL}.lowerAscii()'
    return " || ".join(f"{attr}.contains({json.dumps(m.lower())})" for m in models)


def _request_names(gpus: int) -> list[str]:
    return ["gpu"] if gpus == 1 else [f"gpu{i}" for i in range(gpus)]


def _entry_name(container: str) -> str:
    """The pod's resourceClaims entry for one container's claim (a DNS label)."""
    return (f"{CLAIM_PREFIX}{container}")[:NAME_MAX].rstrip("-")


def _per_gpu(c: ContainerRequest, gpus: int) -> int:
    if c.units % gpus:
        raise InvalidRequest(
            f"container {c.name!r} asks {c.units} {RESOURCE_MEM} over {gpus} GPUs ({ANN_GPU_COUNT}): "
            "each container's limit must divide evenly by the GPU count to become one request per GPU"
        )
    return c.units // gpus


def claim_spec(share: int, gpus: int, models: Sequence[str], unit: MemoryUnit) -> Obj:
    """One container's claim: `share` units on each of `gpus` different GPUs of an allowed model."""
    requests = []
    for name in _request_names(gpus):
        exactly: Obj = {"deviceClassName": DRA_DEVICE_CLASS}
        if models:
            exactly["selectors"] = [{"cel": {"expression": model_selector(models)}}]
        exactly["capacity"] = {"requests": {DRA_CAPACITY_MEMORY: quantity(share, unit)}}
        requests.append({"name": name, "exactly": exactly})
    devices: Obj = {"requests": requests}
    if gpus > 1:
        devices["constraints"] = [{"requests": _request_names(gpus), "distinctAttribute": UUID_ATTRIBUTE}]
    return {"devices": devices}


def container_claims(pod: Mapping[str, Any], unit: MemoryUnit) -> tuple[dict[str, Obj], dict[str, str], list[str]]:
    """What a pod's device-plugin request becomes: a claim spec per container that owns one (by container
    name), the claim each container uses (container -> owner), and notes for a person.

    Empty when the pod asks no GPU memory; InvalidRequest (naming the problem) for what cannot be translated.
    """
    req = pod_request(pod)
    if req is None:
        return {}, {}, []
    gpus = req.gpu_count
    specs: dict[str, Obj] = {}
    uses: dict[str, str] = {}
    shares: dict[str, int] = {}
    notes: list[str] = []
    for c in req.containers:
        if c.units and (not c.init or c.sidecar):
            shares[c.name] = _per_gpu(c, gpus)
            specs[c.name] = claim_spec(shares[c.name], gpus, req.models, unit)
            uses[c.name] = c.name
    for c in req.containers:
        if not c.units or not c.init or c.sidecar:
            continue
        share = _per_gpu(c, gpus)
        fitting = sorted((s, name) for name, s in shares.items() if s >= share)
        if fitting:
            uses[c.name] = fitting[0][1]  # runs before that container: its memory is free then
            continue
        specs[c.name] = claim_spec(share, gpus, req.models, unit)
        uses[c.name] = c.name
        notes.append(
            f"init container {c.name!r}: no app container asks {share} or more per GPU, so it gets a claim of its "
            f"own, held for the pod's lifetime ({quantity(share * gpus, unit)} more than in device-plugin mode)"
        )
    if len({o for o in uses.values()}) > 1:
        notes.append(
            "one claim per container: each keeps its own limit, but the containers may get different GPUs of "
            "the node (device-plugin mode put them on one); for one GPU, give them one claim and one budget"
        )
    return specs, uses, notes


def _strip_container(c: Obj, entry: str | None) -> None:
    resources = c.setdefault("resources", {})
    for key in ("limits", "requests"):
        values = resources.get(key)
        if isinstance(values, dict):
            values.pop(RESOURCE_MEM, None)
            if not values:
                resources.pop(key)
    if entry:
        resources.setdefault("claims", []).append({"name": entry})
    if not resources:
        c.pop("resources")


def convert_pod_template(template: Obj, workload: str, unit: MemoryUnit) -> tuple[list[Obj], Obj, list[str]]:
    """(claim templates, converted copy of the pod (template), notes); no templates when nothing asks memory.

    Templates are named `<workload>-<container>-gpu-mem`."""
    pod = copy.deepcopy(template)
    specs, uses, notes = container_claims(pod, unit)
    if not specs:
        return [], pod, []
    pod_spec = pod.setdefault("spec", {})
    taken = {c.get("name") for c in pod_spec.get("resourceClaims") or []}
    names = {
        owner: f"{workload[: 253 - len(owner) - len(TEMPLATE_SUFFIX) - 1]}-{owner}{TEMPLATE_SUFFIX}" for owner in specs
    }
    for owner in specs:
        if _entry_name(owner) in taken:
            raise InvalidRequest(f"the pod already has a resource claim named {_entry_name(owner)!r}")
        pod_spec.setdefault("resourceClaims", []).append(
            {"name": _entry_name(owner), "resourceClaimTemplateName": names[owner]}
        )
    for key in ("initContainers", "containers"):
        for c in pod_spec.get(key) or []:
            owner = uses.get(str(c.get("name")))
            _strip_container(c, _entry_name(owner) if owner else None)
    if pod_spec.get("schedulerName") == SCHEDULER_NAME:
        del pod_spec["schedulerName"]
    annotations = (pod.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        for key in (ANN_GPU_COUNT, ANN_GPU_MODEL):
            annotations.pop(key, None)
        if not annotations:
            del pod["metadata"]["annotations"]
    templates = [
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": names[owner]},
            "spec": {"spec": spec},
        }
        for owner, spec in specs.items()
    ]
    return templates, pod, notes


def _pod_template_path(kind: str) -> tuple[str, ...] | None:
    if kind == "Pod":
        return ()
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"):
        return ("spec", "template")
    if kind == "CronJob":
        return ("spec", "jobTemplate", "spec", "template")
    return None


def convert_manifest(obj: Mapping[str, Any], unit: MemoryUnit = MemoryUnit.GiB) -> Converted:
    """One manifest translated; objects without a pod template, or asking no GPU memory, come back unchanged."""
    out = copy.deepcopy(dict(obj))
    path = _pod_template_path(str(out.get("kind", "")))
    if path is None:
        return Converted([], out)
    meta = out.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not name:
        raise InvalidRequest(f"{out.get('kind')} without metadata.name: its claim templates are named after it")
    holder: Any = out
    for key in path[:-1]:
        holder = holder.get(key) or {}
    template = holder.get(path[-1]) if path else out
    if not isinstance(template, dict):
        return Converted([], out)
    try:
        templates, pod, notes = convert_pod_template(template, name, unit)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{out.get('kind')} {name}: {exc}") from exc
    if not templates:
        return Converted([], out)
    if path:
        holder[path[-1]] = pod
    else:
        out = pod
    if meta.get("namespace"):
        for t in templates:
            t["metadata"]["namespace"] = meta["namespace"]
    return Converted(templates, out, [f"{out.get('kind')} {name}: {n}" for n in notes])


def convert_all(docs: Iterable[Mapping[str, Any]], unit: MemoryUnit) -> tuple[list[Obj], list[str]]:
    out: list[Obj] = []
    notes: list[str] = []
    for d in docs:
        if not d:
            continue
        c = convert_manifest(d, unit)
        out.extend(c.templates)
        out.append(c.manifest)
        notes.extend(c.notes)
    return out, notes


def main(
    argv: Sequence[str] | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """gpushare-dra-convert: device-plugin manifests in (files or stdin), DRA manifests out (stdout)."""
    import yaml

    p = argparse.ArgumentParser(
        prog="gpushare-dra-convert",
        description=f"Rewrite pods asking {RESOURCE_MEM} into pods with a ResourceClaimTemplate of DeviceClass "
        f"{DRA_DEVICE_CLASS} (docs/dra.md, migration path). Other objects pass through unchanged.",
    )
    p.add_argument("files", nargs="*", help="YAML files (default: stdin)")
    p.add_argument("--memory-unit", choices=("GiB", "MiB"), default="GiB", help="the unit of nvidia.com/gpu-mem")
    args = p.parse_args(argv)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        texts = (
            [Path(f).read_text(encoding="utf-8") for f in args.files] if args.files else [(stdin or sys.stdin).read()]
        )
        docs = [d for t in texts for d in yaml.safe_load_all(t)]
    except (OSError, yaml.YAMLError) as exc:
        err.write(f"error: cannot read the manifests: {exc}\n")
        return 1
    if not all(isinstance(d, dict) or d is None for d in docs):
        err.write("error: every YAML document must be an object (a Kubernetes manifest)\n")
        return 1
    try:
        converted, notes = convert_all([d for d in docs if d], MemoryUnit.parse(args.memory_unit))
    except InvalidRequest as exc:
        err.write(f"error: {exc}\n")
        return 2
    out.write(yaml.safe_dump_all(converted, sort_keys=False))
    for n in notes:
        err.write(f"note: {n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
