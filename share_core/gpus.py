"""The per-GPU inventory a plugin publishes on its Node (`gpushare.io/gpus`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

from share_core.contract import ANN_NODE_GPUS
from share_core.contract import RESOURCE_COUNT
from share_core.contract import RESOURCE_MEM
from share_core.request import InvalidRequest
from share_core.request import parse_units


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory: int  # in the resource unit
    healthy: bool = True
    parent: str = ""  # a MIG instance: the UUID of its physical GPU (absent from the JSON for a whole GPU)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.parent:
            del out["parent"]
        return out


def format_node_gpus(gpus: list[GpuInfo]) -> str:
    return json.dumps([g.to_json() for g in sorted(gpus, key=lambda g: g.index)], separators=(",", ":"))


def parse_node_gpus(raw: str) -> list[GpuInfo]:
    """Parse `gpushare.io/gpus`; raises InvalidRequest naming what is wrong."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"node annotation {ANN_NODE_GPUS} is not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise InvalidRequest(f"node annotation {ANN_NODE_GPUS} must be a JSON list")
    gpus: list[GpuInfo] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InvalidRequest(f"node annotation {ANN_NODE_GPUS}[{i}] is not an object")
        try:
            index, memory = item["index"], item["memory"]
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise InvalidRequest(f"node annotation {ANN_NODE_GPUS}[{i}].index={index!r} is not a GPU index")
            if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
                raise InvalidRequest(f"node annotation {ANN_NODE_GPUS}[{i}].memory={memory!r} is not a whole amount")
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=str(item.get("uuid", "")),
                    model=str(item.get("model", "")),
                    memory=memory,
                    healthy=bool(item.get("healthy", True)),
                    parent=str(item.get("parent", "") or ""),
                )
            )
        except KeyError as exc:
            raise InvalidRequest(f"node annotation {ANN_NODE_GPUS}[{i}] lacks {exc.args[0]!r}") from exc
    if len({g.index for g in gpus}) != len(gpus):
        raise InvalidRequest(f"node annotation {ANN_NODE_GPUS} lists a GPU index twice")
    return sorted(gpus, key=lambda g: g.index)


def node_gpus(node: Mapping[str, Any]) -> list[GpuInfo]:
    """A node's GPUs: from its annotation, else capacity split evenly over `nvidia.com/gpu-count`.

    Returns [] for a node that does not offer `nvidia.com/gpu-mem`. Raises InvalidRequest when the
    node's annotation is garbage (the caller decides whether to skip the node or report it).
    """
    meta = node.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANN_NODE_GPUS)
    if raw:
        return parse_node_gpus(raw)
    capacity = ((node.get("status") or {}).get("capacity")) or {}
    if RESOURCE_MEM not in capacity:
        return []
    total = parse_units(capacity[RESOURCE_MEM], f"node capacity {RESOURCE_MEM}")
    count = parse_units(capacity.get(RESOURCE_COUNT, 1), f"node capacity {RESOURCE_COUNT}") or 1
    per_gpu = total // count
    name = meta.get("name", "node")
    return [GpuInfo(i, f"{name}-gpu{i}", "", per_gpu, True) for i in range(count)]
