#!/usr/bin/env bash
# Regenerate the Python gRPC bindings of the kubelet APIs (share_plugin/api/*.proto).
# The generated *_pb2.py / *_pb2_grpc.py files are committed; run this after editing a .proto.
# Imports are rewritten to be package-relative so `share_plugin.api` needs no sys.path tricks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
API=share_plugin/api
for proto in deviceplugin_v1beta1 podresources_v1; do
  "$PY" -m grpc_tools.protoc -I "$API" --python_out="$API" --pyi_out="$API" --grpc_python_out="$API" "$API/$proto.proto"
  sed -i -E "s/^import ${proto}_pb2 as /from . import ${proto}_pb2 as /" "$API/${proto}_pb2_grpc.py"
done
"$PY" - <<'PY'
import re
for name in ("deviceplugin_v1beta1", "podresources_v1"):
    text = open(f"share_plugin/api/{name}_pb2.py").read()
    gen = re.search(r"Domain.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)", text)
    print(f"{name}: needs protobuf runtime >= {'.'.join(gen.groups()) if gen else '?'}")
    grpc_text = open(f"share_plugin/api/{name}_pb2_grpc.py").read()
    ver = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", grpc_text)
    print(f"{name}: needs grpcio >= {ver.group(1) if ver else '?'}")
PY
