# syntax=docker/dockerfile:1
# gpushare: one image carrying all three programs.
#   share-plugin              device plugin (DaemonSet)
#   share-scheduler           scheduler extender (beside kube-scheduler)
#   kubectl-inspect-gpushare  the inspect view (also usable from a laptop)
#
#   docker build -t ghcr.io/gpushare/gpushare:0.1.0 .
#
# Without Docker or a registry, `make image` builds the same image (build/gpushare.oci.tar) from
# the same two files: hack/image/packages.txt (the Debian packages) and hack/image/setup.sh (the
# venv at /opt/gpushare, the console scripts in /usr/local/bin, user gpushare 65532:65532). The
# ENV, USER, WORKDIR and CMD below are hack/gpushare_image.py's DOCKERFILE_CONFIG (a test compares).
#
# The image runs as an unprivileged user (65532). The device plugin is the one exception and the
# chart says so: it runs as root (no capabilities, not privileged, read-only root filesystem)
# because kubelet's device-plugins directory and its sockets are root-owned: it must create
# gpushare.sock there and connect to kubelet.sock and the pod-resources socket.

ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- build: the project's wheel and every dependency's wheel -----------------------------------
FROM ${DEBIAN_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY hack/image/packages.txt /tmp/image/packages.txt
RUN apt-get update \
 && sed -e 's/#.*//' /tmp/image/packages.txt | xargs apt-get install -y --no-install-recommends \
 && python3 -m venv /build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY share_core/ share_core/
COPY share_node/ share_node/
COPY share_placement/ share_placement/
COPY share_plugin/ share_plugin/
COPY share_dra/ share_dra/
COPY share_scheduler/ share_scheduler/
COPY share_inspect/ share_inspect/
RUN /build/bin/pip wheel --wheel-dir /wheels . \
 && ls /wheels

# ---- runtime ------------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="GPU memory sharing for Kubernetes: device plugin, scheduler extender, inspect" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/gpushare/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY hack/image/packages.txt hack/image/setup.sh /tmp/image/
# Only wheels built above: nothing is fetched from PyPI at this stage, and no compiler is in the image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    apt-get update \
 && sed -e 's/#.*//' /tmp/image/packages.txt | xargs apt-get install -y --no-install-recommends \
 && sh /tmp/image/setup.sh /wheels \
 && rm -rf /tmp/image
USER 65532:65532
WORKDIR /tmp
# The chart sets the command of each container; this default serves the extender.
CMD ["share-scheduler", "--port", "12345"]
