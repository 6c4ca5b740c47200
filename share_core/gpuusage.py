"""The GPU memory a node's plugin measured, as published on the Node (`gpushare.io/gpu-usage`), for kubectl inspect.

The value is JSON, every amount in MiB whatever the resource unit:
`{"time": "<RFC 3339>", "gpus": {"<gpu index>": used}, "pods": {"<namespace>/<name>": {"<gpu index>": used}}}`.
The plugin rewrites it only when a figure moved by a threshold or a pod came or went, and at most once per
interval (share-plugin --usage-annotation-interval), so the API server sees few writes; `time` says how old it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from share_core.contract import ANN_NODE_GPU_USAGE
from share_core.request import InvalidRequest


@dataclass(frozen=True, slots=True)
class UsageSummary:
    """MiB used per GPU index, and per pod ("namespace/name") per GPU index; `time` when measured."""

    gpus: Mapping[int, int]
    pods: Mapping[str, Mapping[int, int]]
    time: str = ""

    def to_json(self, time: str) -> str:
        return json.dumps(
            {
                "time": time,
                "gpus": {str(i): v for i, v in sorted(self.gpus.items())},
                "pods": {k: {str(i): v for i, v in sorted(p.items())} for k, p in sorted(self.pods.items())},
            },
            separators=(",", ":"),
        )


def changed_enough(old: UsageSummary | None, new: UsageSummary, threshold_mib: int) -> bool:
    """Worth an API write: a GPU or pod appeared or left, or some figure moved by `threshold_mib` or more."""
    if old is None:
        return True
    if old.gpus.keys() != new.gpus.keys() or old.pods.keys() != new.pods.keys():
        return True
    if any(abs(old.gpus[i] - new.gpus[i]) >= threshold_mib for i in new.gpus):
        return True
    for k, per in new.pods.items():
        before = old.pods[k]
        if before.keys() != per.keys() or any(abs(before[i] - per[i]) >= threshold_mib for i in per):
            return True
    return False


def parse_gpu_usage(raw: str) -> UsageSummary:
    """Parse the node annotation; raises InvalidRequest naming what is wrong."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        gpus = {int(k): int(v) for k, v in (data.get("gpus") or {}).items()}
        pods = {str(k): {int(i): int(v) for i, v in per.items()} for k, per in (data.get("pods") or {}).items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidRequest(f"node annotation {ANN_NODE_GPU_USAGE} is not valid: {exc}") from exc
    return UsageSummary(gpus, pods, str(data.get("time", "")))
