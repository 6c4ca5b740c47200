#!/bin/sh
# Turn a Debian root filesystem that has hack/image/packages.txt installed into the gpushare image.
# Runs inside that root: as a Dockerfile RUN step (docker build) and under chroot (make image), so
# both ways give one layout:
#   /opt/gpushare                 a venv with the gpushare wheel and its dependencies (no pip left)
#   /usr/local/bin/share-plugin, share-dra, share-scheduler, share-webhook, share-sim, kubectl-inspect-gpushare  -> the venv
#   user and group gpushare, 65532:65532 (the chart's scheduler runAsUser), no home, no shell
#
# Usage: setup.sh WHEEL_DIR     (every wheel needed is in WHEEL_DIR; nothing is downloaded)
set -eu
WHEELS="$1"
VENV=/opt/gpushare
SCRIPTS="share-plugin share-dra share-scheduler share-webhook share-sim kubectl-inspect-gpushare"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --no-compile --no-index --find-links="$WHEELS" gpushare
"$VENV/bin/python" -m pip check
# pip and setuptools are not needed at run time: leave them out of the image
"$VENV/bin/python" -m pip uninstall --quiet --yes pip setuptools
for s in $SCRIPTS; do
    ln -sf "$VENV/bin/$s" "/usr/local/bin/$s"
    "/usr/local/bin/$s" --help >/dev/null
done
# byte-compile once, here, so a read-only root filesystem starts as fast as a writable one
"$VENV/bin/python" -m compileall -q --invalidation-mode unchecked-hash "$VENV/lib" >/dev/null
if ! getent group gpushare >/dev/null; then groupadd --gid 65532 gpushare; fi
if ! getent passwd gpushare >/dev/null; then
    useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpushare
fi
# what apt and the steps above leave behind
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/* /root/.cache
