#!/usr/bin/env bash
# Install what `make image` needs when it is missing: mmdebstrap (the Debian root filesystem of
# the gpushare image), Debian's archive keyring, and skopeo (turns the OCI archive into the
# `docker save` format for `docker load`; the image tests read the archives with it). Prints nothing when all is there; on failure
# it prints apt's output and exits non-zero.
#
# Usage: hack/image-deps.sh        (root, or sudo without a password, on Debian/Ubuntu)
set -euo pipefail
exec "$(dirname "$0")/apt-deps.sh" image-deps mmdebstrap debian-archive-keyring skopeo
