"""A real Kubernetes node for integration tests: containerd + runc + the upstream kubelet."""

from .images import NodeImage
from .images import NodeImages
from .images import node_images
from .realnode import RealNode
from .realnode import RealNodeError

__all__ = ["NodeImage", "NodeImages", "RealNode", "RealNodeError", "node_images"]
