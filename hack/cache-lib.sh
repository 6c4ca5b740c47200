# Sourced by hack/build-*.sh: one cached build per stamp, serialised across concurrent callers.
# The caller sets RECIPE, BINARIES (names that must be executable in BIN_DIR) and a log function, then
# calls `go_build_cache STAMP [RECIPE_TEXT]`: it sets up the Go toolchain (GO, GOVER, BUILD_PARALLEL) and
# the stamp's cache (BIN_DIR, STAMP_FILE, STAMP_TEXT), then `use_cache_or_lock`: it prints BIN_DIR and
# exits when the cache is warm (before or after waiting for another build of the same stamp), else
# returns holding the lock (fd 9) with the stale stamp removed, for the caller to build.

go_build_cache() {  # stamp [more recipe text for the stamp file]
    GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
    # Two cores, 24 GiB: two compile jobs at a time keeps kube-apiserver's link in memory.
    BUILD_PARALLEL="${GPUSHARE_BUILD_PARALLEL:-2}"
    GOVER="$("$GO" env GOVERSION)"
    STAMP="$1"
    CACHE="${GPUSHARE_CACHE:-$HOME/.cache/gpushare}"
    BIN_DIR="${CACHE}/bin/${STAMP}"
    STAMP_FILE="${BIN_DIR}/.stamp"
    STAMP_TEXT="${STAMP} recipe=${RECIPE} ${GOVER} CGO_ENABLED=0${2:+ $2}"
    GOVER="${GOVER#go}"
    use_cache_or_lock
}

is_warm() {
    [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$STAMP_TEXT" ]] || return 1
    local b
    for b in "${BINARIES[@]}"; do [[ -x "${BIN_DIR}/${b}" ]] || return 1; done
}

use_cache_or_lock() {
    if is_warm; then
        log "cache warm: ${BIN_DIR}"
        echo "$BIN_DIR"
        exit 0
    fi
    mkdir -p "$BIN_DIR"
    # Serialise concurrent callers (parallel test sessions, make -j) on one lock per stamp.
    exec 9>"${BIN_DIR}.lock"
    flock 9
    if is_warm; then
        log "cache warmed by another build: ${BIN_DIR}"
        echo "$BIN_DIR"
        exit 0
    fi
    rm -f "$STAMP_FILE"
}
