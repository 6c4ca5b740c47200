"""The webhook's few API calls (its Secret, its webhook configurations' caBundle, the nodes' GPUs) behind a
small adapter, so the certificate keeper and the cluster view are tested against a fake."""

from __future__ import annotations

import base64
from typing import Any
from typing import Protocol

from share_core.contract import NODE_LABEL_SELECTOR
from share_core.kube import ApiServerClient
from share_core.kube import Conflict
from share_core.kube import KubeError
from share_core.kube import NotFound

MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


class WebhookApi(Protocol):
    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or None when it does not exist."""
        ...

    def create_secret(self, namespace: str, name: str, data: dict[str, str], owners: list[dict[str, Any]]) -> None:
        """Raises Conflict when it exists already (another replica made it)."""
        ...

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, str], owners: list[dict[str, Any]], resource_version: str
    ) -> None:
        """Raises Conflict when the Secret changed since `resource_version` was read."""
        ...

    def config_uid(self, kind: str, name: str) -> str | None:
        """The webhook configuration's UID; None when it does not exist."""
        ...

    def set_ca_bundle(self, kind: str, name: str, ca_bundle: str) -> bool:
        """Write `ca_bundle` into every webhook of the configuration; False when it does not exist."""
        ...

    def gpu_nodes(self) -> list[dict[str, Any]]: ...


class ApiServerWebhookApi:
    def __init__(self, client: ApiServerClient) -> None:
        self.client = client

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.client.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except NotFound:
            return None

    def create_secret(self, namespace: str, name: str, data: dict[str, str], owners: list[dict[str, Any]]) -> None:
        body = _secret(name, data, owners)
        try:
            self.client.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body=body)
        except KubeError as exc:
            if exc.status == 409:
                raise Conflict(str(exc), 409, "AlreadyExists") from exc
            raise

    def replace_secret(
        self, namespace: str, name: str, data: dict[str, str], owners: list[dict[str, Any]], resource_version: str
    ) -> None:
        body = _secret(name, data, owners)
        body["metadata"]["resourceVersion"] = resource_version
        self.client.request("PUT", f"/api/v1/namespaces/{namespace}/secrets/{name}", body=body)

    def config_uid(self, kind: str, name: str) -> str | None:
        try:
            cfg = self.client.request("GET", f"{MUTATING if kind == 'mutating' else VALIDATING}/{name}")
        except NotFound:
            return None
        return (cfg.get("metadata") or {}).get("uid")

    def set_ca_bundle(self, kind: str, name: str, ca_bundle: str) -> bool:
        base = MUTATING if kind == "mutating" else VALIDATING
        try:
            cfg = self.client.request("GET", f"{base}/{name}")
        except NotFound:
            return False
        encoded = base64.b64encode(ca_bundle.encode()).decode()
        hooks = cfg.get("webhooks") or []
        if all((h.get("clientConfig") or {}).get("caBundle") == encoded for h in hooks):
            return True
        patch = [
            {"op": "replace" if "caBundle" in (h.get("clientConfig") or {}) else "add",
             "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
            for i, h in enumerate(hooks)
        ]  # fmt: skip
        patch.insert(
            0, {"op": "test", "path": "/metadata/resourceVersion", "value": cfg["metadata"]["resourceVersion"]}
        )
        self.client.request("PATCH", f"{base}/{name}", body=patch, content_type="application/json-patch+json")
        return True

    def gpu_nodes(self) -> list[dict[str, Any]]:
        return list(self.client.list_nodes(label_selector=NODE_LABEL_SELECTOR).items)


def _secret(name: str, data: dict[str, str], owners: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/component": "webhook"}}
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": meta, "data": data}
