#!/usr/bin/env bash
# Regenerate the Python gRPC bindings of the kubelet APIs: the device plugin's (share_plugin/api/*.proto)
# and the DRA kubelet plugin's (share_dra/api/*.proto).
# The generated *_pb2.py / *_pb2_grpc.py files are committed; run this after editing a .proto.
# Imports are rewritten to be package-relative so `share_plugin.api` / `share_dra.api` need no sys.path tricks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
GENERATED=()
gen() {
  local api="$1" proto="$2"
  "$PY" -m grpc_tools.protoc -I "$api" --python_out="$api" --pyi_out="$api" --grpc_python_out="$api" "$api/$proto.proto"
  sed -i -E "s/^import ${proto}_pb2 as /from . import ${proto}_pb2 as /" "$api/${proto}_pb2_grpc.py"
  GENERATED+=("$api/$proto")
}
for proto in deviceplugin_v1beta1 podresources_v1; do gen share_plugin/api "$proto"; done
for proto in dra_v1 pluginregistration_v1; do gen share_dra/api "$proto"; done
"$PY" - "${GENERATED[@]}" <<'PY'
import re
import sys
for name in sys.argv[1:]:
    text = open(f"{name}_pb2.py").read()
    gen = re.search(r"Domain.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)", text)
    print(f"{name}: needs protobuf runtime >= {'.'.join(gen.groups()) if gen else '?'}")
    grpc_text = open(f"{name}_pb2_grpc.py").read()
    ver = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", grpc_text)
    print(f"{name}: needs grpcio >= {ver.group(1) if ver else '?'}")
PY
