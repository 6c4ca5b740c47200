#!/usr/bin/env bash
# Build the container runtime the real test node (tests/node) runs: containerd v2 with its CRI
# plugin, containerd-shim-runc-v2 and ctr, from the Go module github.com/containerd/containerd/v2
# (the Go module proxy is the only upstream source this project may reach). Debian's containerd 1.6
# knows nothing of CDI: containerd >= 2.0 applies CDI devices (the CRI field `CDIDevices` kubelet
# fills for DRA claims and for device plugins' CDI names) from the spec directories in its config.
# runc stays Debian's. Nothing is written into the repository: the binaries land in
# ${GPUSHARE_CACHE:-$HOME/.cache/gpushare}/bin/<stamp>/.
#
# Usage: BIN=$(hack/build-containerd.sh | tail -1)
#        hack/build-containerd.sh --version   # the release a build would use
# Progress goes to stderr; the last line of stdout is the bin dir.
set -euo pipefail

# --- pinned --------------------------------------------------------------------------------
CONTAINERD_VERSION="v2.4.2"  # the newest v2 release the Go module proxy serves that builds here
# Pure Go (CGO_ENABLED=0): btrfs needs cgo and its headers; devmapper, zfs and tracing are plugins
# the node never loads. urfave_cli_no_docs as upstream's Makefile; the shim without gRPC (no_grpc)
# as upstream builds it.
BUILD_TAGS="urfave_cli_no_docs no_btrfs no_devmapper no_zfs no_tracing"
SHIM_BUILD_TAGS="${BUILD_TAGS} no_grpc"
# Bump when the recipe (tags, flags) changes: a warm cache of the old recipe is rebuilt.
RECIPE=1
# -------------------------------------------------------------------------------------------

if [[ "${1:-}" == "--version" ]]; then
    echo "$CONTAINERD_VERSION"
    exit 0
fi

log() { printf '[build-containerd] %s\n' "$*" >&2; }

BINARIES=(containerd containerd-shim-runc-v2 ctr)
# shellcheck source=hack/cache-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cache-lib.sh"
go_build_cache "containerd-${CONTAINERD_VERSION}" "tags=${BUILD_TAGS}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpushare-build-containerd.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
PKG="github.com/containerd/containerd/v2"

# A throwaway module that requires containerd and nothing else (containerd's go.mod has no replaces).
mkdir -p "$WORK/m"
printf 'module gpushare.local/build/containerd\n\ngo %s\n' "$GOVER" >"$WORK/m/go.mod"
cd "$WORK/m"
"$GO" mod edit -require="${PKG}@${CONTAINERD_VERSION}"
# Like upstream's Makefile: version and package stamped in (`containerd --version`, CRI's
# runtime version that kubelet logs); no git revision outside a checkout.
LDFLAGS="-s -w -X ${PKG}/version.Version=${CONTAINERD_VERSION} -X ${PKG}/version.Revision=gpushare-module-build"
LDFLAGS+=" -X ${PKG}/version.Package=github.com/containerd/containerd/v2"
log "containerd ${CONTAINERD_VERSION}: building containerd, ctr (tags: ${BUILD_TAGS})"
"$GO" build -p "$BUILD_PARALLEL" -trimpath -tags "$BUILD_TAGS" -ldflags "$LDFLAGS" -o "$BIN_DIR/" \
    "${PKG}/cmd/containerd" "${PKG}/cmd/ctr"
log "containerd ${CONTAINERD_VERSION}: building containerd-shim-runc-v2"
"$GO" build -p "$BUILD_PARALLEL" -trimpath -tags "$SHIM_BUILD_TAGS" -ldflags "$LDFLAGS" -o "$BIN_DIR/" \
    "${PKG}/cmd/containerd-shim-runc-v2"

for b in "${BINARIES[@]}"; do
    [[ -x "${BIN_DIR}/${b}" ]] || { log "missing after build: ${BIN_DIR}/${b}"; exit 1; }
done
printf '%s\n' "$STAMP_TEXT" >"$STAMP_FILE"
log "build took $((SECONDS - START))s (cold; less when GOCACHE is warm)"
echo "$BIN_DIR"
