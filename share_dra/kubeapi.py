"""The few resource.k8s.io/v1 calls the DRA driver makes, over share_core.kube's API client.

RBAC they need (the chart grants them; tests/integration/test_dra.py runs the plugin with exactly these):
resource.k8s.io resourceslices list/create/update/delete (the driver touches only its node's slice,
`spec.nodeName` = its node), resourceclaims get.
"""

from __future__ import annotations

from typing import Any
from typing import Protocol
from urllib.parse import quote

from share_core.contract import DRA_DRIVER_NAME
from share_core.kube import ApiServerClient

Obj = dict[str, Any]
BASE = "/apis/resource.k8s.io/v1"


class DraApi(Protocol):
    def get_claim(self, namespace: str, name: str) -> Obj: ...

    def list_slices(self, node: str) -> list[Obj]: ...

    def create_slice(self, obj: Obj) -> Obj: ...

    def replace_slice(self, obj: Obj) -> Obj: ...

    def delete_slice(self, name: str) -> None: ...


class ApiServerDraApi:
    """`DraApi` against a real API server."""

    def __init__(self, client: ApiServerClient) -> None:
        self.client = client

    def get_claim(self, namespace: str, name: str) -> Obj:
        return self.client.request("GET", f"{BASE}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}")

    def list_slices(self, node: str) -> list[Obj]:
        # Field selectors the API server supports for ResourceSlices: spec.nodeName, spec.driver.
        page = self.client.request(
            "GET",
            f"{BASE}/resourceslices",
            query={"fieldSelector": f"spec.nodeName={node},spec.driver={DRA_DRIVER_NAME}"},
        )
        return list(page.get("items") or [])

    def create_slice(self, obj: Obj) -> Obj:
        return self.client.request("POST", f"{BASE}/resourceslices", body=obj)

    def replace_slice(self, obj: Obj) -> Obj:
        return self.client.request("PUT", f"{BASE}/resourceslices/{quote(obj['metadata']['name'])}", body=obj)

    def delete_slice(self, name: str) -> None:
        self.client.request("DELETE", f"{BASE}/resourceslices/{quote(name)}")
