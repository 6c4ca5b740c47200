"""Whether a pod's ResourceClaims ask gpushare.io GPUs: what sends a DRA pod to the gpushare scheduler.

A pod names its claims (`resourceClaimName`) or templates (`resourceClaimTemplateName`) only by name, so
the webhook reads them (same namespace). A lookup that fails leaves the pod as it is, with a log line:
kube-scheduler's own DRA placement still serves it, only not by the policy; admission never fails on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

from cachetools import TTLCache

from share_core.dra import uses_device_class
from share_core.kube import KubeError
from share_core.kube import NotFound

log = logging.getLogger(__name__)

BASE = "/apis/resource.k8s.io/v1/namespaces/{namespace}/{kind}/{name}"
KNOWN_FOR = 60.0  # seconds a template's answer is reused: templates rarely change, pods come in bursts


class ClaimClasses:
    """`ours(pod)`: whether any claim or template the pod names asks our DeviceClass."""

    def __init__(self, get: Callable[[str], Mapping[str, Any]]) -> None:
        self._get = get
        self._known: TTLCache[tuple[str, str, str], bool] = TTLCache(maxsize=4096, ttl=KNOWN_FOR)

    def _uses(self, namespace: str, kind: str, name: str) -> bool:
        key = (namespace, kind, name)
        if key in self._known:
            return self._known[key]
        try:
            obj = self._get(BASE.format(namespace=namespace, kind=kind, name=name))
        except NotFound:
            return False  # not made yet (a claim the pod's controller will create): nothing to read
        except KubeError as exc:
            log.warning("cannot read %s %s/%s (%s): the pod keeps its scheduler", kind, namespace, name, exc)
            return False
        spec = obj.get("spec") or {}
        used = uses_device_class(spec.get("spec") or {} if kind == "resourceclaimtemplates" else spec)
        if kind == "resourceclaimtemplates":
            self._known[key] = used  # a claim is read each time: it is made once, right before its pod
        return used

    def ours(self, pod: Mapping[str, Any]) -> bool:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        namespace = str(meta.get("namespace") or "default")
        for entry in spec.get("resourceClaims") or []:
            if not isinstance(entry, Mapping):
                continue
            if entry.get("resourceClaimTemplateName"):
                if self._uses(namespace, "resourceclaimtemplates", str(entry["resourceClaimTemplateName"])):
                    return True
            elif entry.get("resourceClaimName") and self._uses(
                namespace, "resourceclaims", str(entry["resourceClaimName"])
            ):
                return True
        return False
