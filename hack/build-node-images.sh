#!/usr/bin/env bash
# Build (or find in the cache) the OCI archives a real test node imports: the pause sandbox image
# and a busybox test image. Never pulls. See hack/node_images.py.
#
# Usage: DIR=$(hack/build-node-images.sh | tail -1)    # DIR/images.json names the archives
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m hack.node_images "$@"
