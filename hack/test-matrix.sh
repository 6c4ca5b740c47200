#!/usr/bin/env bash
# `make test-matrix`: the integration tier (real control plane, stand-in nodes, and the real-kubelet
# tests on a real node) against each supported Kubernetes minor at its newest patch.
#
# Usage: hack/test-matrix.sh              # every supported minor (hack/build-k8s.sh --list)
#        hack/test-matrix.sh 1.33 1.37    # those minors (or patches) only
#        hack/test-matrix.sh --oldest     # the oldest supported minor (what `make test` adds)
#
# Per version: the upstream binaries (hack/build-k8s.sh, cached per version), the kube-scheduler
# and pause images of that version (built by the tests through hack/build-image.sh and
# hack/build-node-images.sh, cached per version), then `pytest -m integration` with
# GPUSHARE_K8S_VERSION set. Every version runs even when one fails; the summary table names the
# result of each and the exit status is non-zero if any failed. JUnit reports: build/matrix/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT=build/matrix
mkdir -p "$OUT"

if [[ "${1:-}" == "--oldest" ]]; then
    set -- "$(hack/build-k8s.sh --list | head -1)"
elif [[ $# -eq 0 ]]; then
    mapfile -t versions < <(hack/build-k8s.sh --list)
    set -- "${versions[@]}"
fi

log() { printf '[test-matrix] %s\n' "$*" >&2; }
SUMMARY=()
FAILED=0
for want in "$@"; do
    version="$(K8S_VERSION="$want" hack/build-k8s.sh --version)" || { FAILED=1; SUMMARY+=("$want unsupported"); continue; }
    log "Kubernetes ${version}: building (cached per version)"
    start=$SECONDS
    if ! K8S_VERSION="$version" hack/build-k8s.sh >/dev/null; then
        FAILED=1
        SUMMARY+=("${version} build-failed $((SECONDS - start))s")
        continue
    fi
    built=$((SECONDS - start))
    log "Kubernetes ${version}: pytest -m integration"
    start=$SECONDS
    report="${OUT}/${version}.xml"
    GPUSHARE_K8S_VERSION="$version" "$PY" -m pytest tests -m integration -q -p no:cacheprovider \
        --junitxml="$report"
    rc=$?
    tested=$((SECONDS - start))
    counts="$("$PY" - "$report" <<'EOF'
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print("no-report")
    sys.exit()
suite = root if root.tag == "testsuite" else root.find("testsuite")
n, f, e, s = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"passed={n - f - e - s} failed={f} errors={e} skipped={s}")
EOF
)"
    # A skipped test is a tier that did not run: the matrix fails on it as on a failure.
    [[ $rc -eq 0 && "$counts" == *" skipped=0" ]] || { rc=1; FAILED=1; }
    SUMMARY+=("${version} $([[ $rc -eq 0 ]] && echo pass || echo FAIL) ${counts} build=${built}s tests=${tested}s")
done

log "summary (version result counts build-time test-time):"
for line in "${SUMMARY[@]}"; do log "  ${line}"; done
exit "$FAILED"
