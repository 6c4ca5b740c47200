"""Whether a node's agent holds each pod to its share with the NVIDIA driver's hard GPU memory limit, as
published on the Node (`gpushare.io/hard-limit`) by the node agents and read by kubectl inspect.

The value is JSON: `{"mode": "auto|cgroup|off", "enforced": bool, "reason": "...", "driver": "<version>",
"agent": "<share-plugin|share-dra>", "time": "<RFC 3339>"}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HardLimitStatus:
    """Whether the node's agent puts the driver's hard GPU memory limit on each pod, and if not, why."""

    mode: str
    enforced: bool
    reason: str
    driver: str = ""

    @property
    def text(self) -> str:
        return f"{'enforced' if self.enforced else 'not enforced'} (--hard-limit {self.mode}): {self.reason}"

    def annotation(self, agent: str, time: str) -> str:
        """The `gpushare.io/hard-limit` node annotation."""
        return json.dumps(
            {
                "mode": self.mode,
                "enforced": self.enforced,
                "reason": self.reason,
                "driver": self.driver,
                "agent": agent,
                "time": time,
            },
            sort_keys=True,
        )

    @classmethod
    def parse(cls, raw: str) -> HardLimitStatus:
        """The status an annotation says. Raises ValueError, TypeError or KeyError for one no agent wrote."""
        data = json.loads(raw)
        enforced = bool(data["enforced"])
        return cls(str(data.get("mode", "")), enforced, str(data.get("reason", "")), str(data.get("driver", "")))
