#!/usr/bin/env bash
# `make image`: build/gpushare.oci.tar and build/kube-scheduler.oci.tar, no registry, no engine
# (hack/gpushare_image.py; needs root and hack/image-deps.sh). Cached: a rebuild with nothing
# changed takes seconds. The last line of stdout is build/images.json.
#
#   ctr images import build/gpushare.oci.tar      # containerd: named gpushare.local/gpushare:<version>
#   docker load -i build/gpushare.oci.tar         # Docker 25+
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m hack.gpushare_image "$@"
