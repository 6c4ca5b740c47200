"""A real Kubernetes node for integration tests: containerd + runc + the upstream kubelet."""

from .images import NodeImage, NodeImages, node_images
from .realnode import RealNode, RealNodeError

__all__ = ["NodeImage", "NodeImages", "RealNode", "RealNodeError", "node_images"]
