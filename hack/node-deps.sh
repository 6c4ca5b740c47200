#!/usr/bin/env bash
# Install what a real test node needs (tests/node: containerd + runc + kubelet) when it is missing:
# Debian's runc, CNI plugins (bridge, host-local), iproute2, a static busybox for the test image, and a
# C compiler with static libc for the pause image. containerd itself is v2, built from its Go module by
# hack/build-containerd.sh (Debian's 1.6 applies no CDI). Prints nothing when all is
# there; on failure it prints apt's output and exits non-zero.
#
# Usage: hack/node-deps.sh        (root, or sudo without a password, on Debian/Ubuntu)
set -euo pipefail
exec "$(dirname "$0")/apt-deps.sh" node-deps \
    runc containernetworking-plugins iproute2 busybox-static gcc libc6-dev util-linux mount
