#!/usr/bin/env bash
# Build the upstream binaries the integration tests run against a real control plane:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kubectl, etcd and helm, from Go modules (the Go module
# proxy is the only upstream source this project may reach). Nothing is written into the
# repository: binaries land in ${GPUSHARE_CACHE:-$HOME/.cache/gpushare}/bin/<stamp>/.
#
# Usage: BIN=$(hack/build-k8s.sh | tail -1)
#        BIN=$(K8S_VERSION=1.33 hack/build-k8s.sh | tail -1)   # any supported minor or patch
#        hack/build-k8s.sh --list       # the supported minors' newest patches, oldest first
#        hack/build-k8s.sh --version    # the release a build would use (K8S_VERSION honoured)
# K8S_VERSION (or GPUSHARE_K8S_VERSION, which the tests pass through) picks the release:
# "1.33" means that minor's newest patch in the table below, "1.33.13"/"v1.33.13" that patch.
# Each version has its own cache directory (the stamp names it); the recipe is the same.
# Progress goes to stderr; the last line of stdout is the bin dir.
set -euo pipefail

# --- pinned versions -------------------------------------------------------------------
# The supported minors (README "Supported Kubernetes versions"; docs/versions.md says why),
# each at its newest patch the Go module proxy serves, with what that minor needs pinned.
# minor  newest patch  etcd (go.etcd.io/etcd/server/v3)
SUPPORTED="
1.33   v1.33.13      v3.6.16
1.34   v1.34.4       v3.6.16
1.35   v1.35.4       v3.6.16
1.36   v1.36.3       v3.6.16
1.37   v1.37.2       v3.6.16
"
DEFAULT_MINOR="1.37"       # the newest: what `make test` runs in full (then the oldest's integration tier)
HELM_VERSION="v3.22.0"     # helm.sh/helm/v3/cmd/helm (one client for every cluster version)
# Bump when the build recipe (flags, ldflags) changes: a warm cache of the old recipe is rebuilt.
RECIPE=3

# `--list`: the supported minors' newest patches, oldest first (what `make test-matrix` runs).
if [[ "${1:-}" == "--list" ]]; then
    awk 'NF == 3 {print $2}' <<<"$SUPPORTED"
    exit 0
fi
REQUESTED="${K8S_VERSION:-${GPUSHARE_K8S_VERSION:-$DEFAULT_MINOR}}"
REQUESTED="${REQUESTED#v}"
REQ_MINOR="$(cut -d. -f1,2 <<<"$REQUESTED")"
ROW="$(awk -v m="$REQ_MINOR" 'NF == 3 && $1 == m' <<<"$SUPPORTED")"
if [[ -z "$ROW" ]]; then
    printf '[build-k8s] Kubernetes %s is not supported; supported minors: %s\n' "$REQUESTED" \
        "$(awk 'NF == 3 {printf "%s ", $1}' <<<"$SUPPORTED")" >&2
    exit 2
fi
read -r _ K8S_VERSION ETCD_VERSION <<<"$ROW"
# An explicit patch builds that patch (k8s.io/kubernetes; staging modules are k8s.io/* v0.X.Y).
[[ "$REQUESTED" == "$REQ_MINOR" ]] || K8S_VERSION="v${REQUESTED}"
# `--version`: the release this call would build (e.g. v1.36.3), and nothing else.
if [[ "${1:-}" == "--version" ]]; then
    echo "$K8S_VERSION"
    exit 0
fi
# ---------------------------------------------------------------------------------------

log() { printf '[build-k8s] %s\n' "$*" >&2; }

BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl etcd helm)
# shellcheck source=hack/cache-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cache-lib.sh"
go_build_cache "k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpushare-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
TOTAL_START=$SECONDS
TIMES=()

# Throwaway module: a go.mod that requires one upstream module (plus replaces), nothing else.
new_module() {  # dir module-path required-module@version
    mkdir -p "$1"
    printf 'module %s\n\ngo %s\n' "$2" "$GOVER" >"$1/go.mod"
    (cd "$1" && "$GO" mod edit -require="$3")
}

# The recipe's one way to build: static, reproducible paths, BUILD_PARALLEL jobs.
go_build() {  # ldflags output package...
    "$GO" build -p "$BUILD_PARALLEL" -trimpath -ldflags "$1" -o "$2" "${@:3}"
}

# A path field of `go mod download -json` (GoMod: the module's go.mod; Info: its .info).
module_field() {  # module@version field
    "$GO" mod download -json "$1" | sed -n "s/^[[:space:]]*\"$2\": \"\(.*\)\",\{0,1\}\$/\1/p"
}

build_k8s() {
    local start=$SECONDS dir="$WORK/k8s" minor="${K8S_VERSION#v1.}" gomod
    local staging="v0.${minor}"
    log "kubernetes ${K8S_VERSION}: resolving staging modules (-> ${staging})"
    new_module "$dir" gpushare.local/build/k8s "k8s.io/kubernetes@${K8S_VERSION}"
    gomod="$(module_field "k8s.io/kubernetes@${K8S_VERSION}" GoMod)"
    [[ -f "$gomod" ]] || { log "cannot find go.mod of k8s.io/kubernetes@${K8S_VERSION}"; exit 1; }
    (
        cd "$dir"
        # Every staging module is required as v0.0.0 and replaced by a ./staging path
        # upstream; outside that repo each maps to its published v0.X.Y tag.
        local mod n=0
        for mod in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u); do
            "$GO" mod edit -replace="${mod}=${mod}@${staging}"
            n=$((n + 1))
        done
        log "kubernetes: ${n} staging replaces"
        local date major="1" kminor="${minor%%.*}" ldflags="" pkg
        # The release's publish time from the proxy's .info: a reproducible build date.
        date="$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' \
            "$(module_field "k8s.io/kubernetes@${K8S_VERSION}" Info)")"
        date="${date:-1970-01-01T00:00:00Z}"
        for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION}"
            ldflags+=" -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${kminor}"
            ldflags+=" -X ${pkg}.gitCommit=0000000000000000000000000000000000000000"
            ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=${date}"
        done
        log "kubernetes: building kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl (slow on few cores)"
        go_build "-s -w${ldflags}" "$BIN_DIR/" \
            k8s.io/kubernetes/cmd/kube-apiserver \
            k8s.io/kubernetes/cmd/kube-scheduler \
            k8s.io/kubernetes/cmd/kube-controller-manager \
            k8s.io/kubernetes/cmd/kubelet \
            k8s.io/kubernetes/cmd/kubectl
    )
    TIMES+=("kube-apiserver+kube-scheduler+kube-controller-manager+kubelet+kubectl: $((SECONDS - start))s")
}

build_etcd() {
    local start=$SECONDS dir="$WORK/etcd"
    log "etcd ${ETCD_VERSION}: building"
    new_module "$dir" gpushare.local/build/etcd "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    (cd "$dir" && go_build "-s -w" "$BIN_DIR/etcd" go.etcd.io/etcd/server/v3)
    TIMES+=("etcd: $((SECONDS - start))s")
}

build_helm() {
    local start=$SECONDS dir="$WORK/helm"
    log "helm ${HELM_VERSION}: building"
    new_module "$dir" gpushare.local/build/helm "helm.sh/helm/v3@${HELM_VERSION}"
    (
        cd "$dir"
        # Like helm's Makefile: the Kubernetes version `helm template`/`helm lint` assume by
        # default follows the client-go helm is built with.
        local gomod kmajor kminor
        gomod="$(module_field "helm.sh/helm/v3@${HELM_VERSION}" GoMod)"
        read -r kmajor kminor < <(awk '$1 == "k8s.io/client-go" {
            split($2, v, "."); print v[1] == "v0" ? 1 : substr(v[1], 2), v[2]; exit }' "$gomod")
        [[ -n "$kminor" ]] || { log "cannot read client-go version from ${gomod}"; exit 1; }
        local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
        ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
        local pkg
        for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
            ldflags+=" -X ${pkg}.k8sVersionMajor=${kmajor} -X ${pkg}.k8sVersionMinor=${kminor}"
        done
        go_build "$ldflags" "$BIN_DIR/helm" helm.sh/helm/v3/cmd/helm
    )
    TIMES+=("helm: $((SECONDS - start))s")
}

build_etcd
build_helm
build_k8s

for b in "${BINARIES[@]}"; do
    [[ -x "${BIN_DIR}/${b}" ]] || { log "missing after build: ${BIN_DIR}/${b}"; exit 1; }
done
printf '%s\n' "$STAMP_TEXT" >"$STAMP_FILE"
for t in "${TIMES[@]}"; do log "built ${t}"; done
log "build took $((SECONDS - TOTAL_START))s (cold; less when GOCACHE is warm)"
echo "$BIN_DIR"
