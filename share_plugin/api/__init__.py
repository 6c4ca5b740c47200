"""Generated bindings of the kubelet device plugin (v1beta1) and PodResources (v1) APIs.

Regenerate with `hack/gen-proto.sh`; the .proto files beside them are the source.
"""
