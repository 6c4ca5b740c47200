# Sourced by hack/build-*.sh: one cached build per stamp, serialised across concurrent callers.
# The caller sets BIN_DIR, STAMP_FILE, STAMP_TEXT, BINARIES (names that must be executable in BIN_DIR)
# and a log function, then calls `use_cache_or_lock`: it prints BIN_DIR and exits when the cache is warm
# (before or after waiting for another build of the same stamp), else returns holding the lock (fd 9)
# with the stale stamp removed, for the caller to build.

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
