"""gRPC bindings of the kubelet DRA and plugin registration APIs (hack/gen-proto.sh)."""
