#!/usr/bin/env bash
# Install what `make image` needs when it is missing: mmdebstrap (the Debian root filesystem of
# the gpushare image) and Debian's archive keyring. Prints nothing when all is there; on failure
# it prints apt's output and exits non-zero.
#
# Usage: hack/image-deps.sh        (root, or sudo without a password, on Debian/Ubuntu)
set -euo pipefail

PACKAGES=(mmdebstrap debian-archive-keyring)

installed() {  # package
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

command -v dpkg-query >/dev/null || { echo "image-deps: not a Debian-based system (no dpkg-query)" >&2; exit 1; }

missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
((${#missing[@]} == 0)) && exit 0

SUDO=()
if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || { echo "image-deps: need root to install: ${missing[*]}" >&2; exit 1; }
    SUDO=(sudo -n)
fi

log="$(mktemp "${TMPDIR:-/tmp}/image-deps.XXXXXX")"
trap 'rm -f "$log"' EXIT
if ! { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
        && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "image-deps: apt-get could not install: ${missing[*]}" >&2
    exit 1
fi
for p in "${missing[@]}"; do
    installed "$p" || { cat "$log" >&2; echo "image-deps: $p still not installed" >&2; exit 1; }
done
