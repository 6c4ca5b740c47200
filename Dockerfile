# syntax=docker/dockerfile:1
# gpushare: one image carrying all three programs.
#   share-plugin              device plugin (DaemonSet)
#   share-scheduler           scheduler extender (beside kube-scheduler)
#   kubectl-inspect-gpushare  the inspect view (also usable from a laptop)
#
#   docker build -t ghcr.io/gpushare/gpushare:0.1.0 .
#
# The image runs as an unprivileged user (65532). The device plugin is the one exception and the
# chart says so: it runs as root (no capabilities, not privileged, read-only root filesystem)
# because kubelet's device-plugins directory and its sockets are root-owned: it must create
# gpushare.sock there and connect to kubelet.sock and the pod-resources socket.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: the project's wheel and every dependency's wheel -----------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first (cached while only the code changes); the version is read from share_core.
COPY pyproject.toml README.md ./
COPY share_core/ share_core/
COPY share_plugin/ share_plugin/
COPY share_scheduler/ share_scheduler/
COPY share_inspect/ share_inspect/
RUN pip wheel --wheel-dir /wheels . \
 && ls /wheels

# ---- runtime ------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="GPU memory sharing for Kubernetes: device plugin, scheduler extender, inspect" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Only wheels built above: nothing is fetched at this stage, and no compiler is in the final image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels gpushare \
 && pip check \
 && share-scheduler --help >/dev/null \
 && share-plugin --help >/dev/null \
 && kubectl-inspect-gpushare --help >/dev/null \
 && groupadd --gid 65532 gpushare \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpushare
USER 65532:65532
WORKDIR /tmp
# The chart sets the command of each container; this default serves the extender.
CMD ["share-scheduler", "--port", "12345"]
