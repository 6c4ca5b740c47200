#!/usr/bin/env bash
# Install the given Debian packages when any is missing (apt-get update, then install without
# recommends). Prints nothing when all are there; on failure prints apt's output, names the
# caller, and exits non-zero. The one apt path behind hack/node-deps.sh and hack/image-deps.sh.
#
# Usage: hack/apt-deps.sh WHO PACKAGE...   (root, or sudo without a password, on Debian/Ubuntu)
set -euo pipefail

who="$1"
shift
PACKAGES=("$@")

installed() {  # package
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

command -v dpkg-query >/dev/null || { echo "${who}: not a Debian-based system (no dpkg-query)" >&2; exit 1; }

missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
((${#missing[@]} == 0)) && exit 0

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || { echo "${who}: need root to install: ${missing[*]}" >&2; exit 1; }
    SUDO=(sudo -n)
fi

log="$(mktemp "${TMPDIR:-/tmp}/${who}.XXXXXX")"
trap 'rm -f "$log"' EXIT
if ! { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
        && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "${who}: apt-get could not install: ${missing[*]}" >&2
    exit 1
fi
for p in "${missing[@]}"; do
    installed "$p" || { cat "$log" >&2; echo "${who}: $p still not installed" >&2; exit 1; }
done
