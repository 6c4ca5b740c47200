# gpushare: two commands on a fresh machine.
#   make demo   start a local control plane with simulated GPU nodes and show where pods land
#   make test   install what the tests need, build the control plane binaries, run every test
#               (the default Kubernetes version), then the integration tier on the oldest supported one
#   make test-matrix   the integration tier on every supported Kubernetes minor (docs/versions.md)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test gpu-test test-matrix unit integration demo lint venv k8s-bins containerd node-deps node-images image-deps image proto bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

k8s-bins:
	hack/build-k8s.sh >/dev/null

# The real test node's runtime: containerd v2 (CDI), its runc shim and ctr, from the Go module; cached
containerd:
	hack/build-containerd.sh >/dev/null

# A real test node (tests/node): runc, CNI plugins, busybox, a C compiler (apt, when missing)
node-deps:
	hack/node-deps.sh

# Its images (pause sandbox, busybox), built from source, never pulled; cached
node-images: venv node-deps
	PYTHON=$(abspath $(PY)) hack/build-node-images.sh >/dev/null

# The product images without a registry or an engine: build/gpushare.oci.tar (Debian bookworm +
# the project's wheels, hack/image/) and build/kube-scheduler.oci.tar; cached (root: mmdebstrap, chroot)
image-deps:
	hack/image-deps.sh

image: venv k8s-bins image-deps
	PYTHON=$(abspath $(PY)) hack/build-image.sh >/dev/null

LINT_PATHS := share_core share_node share_placement share_plugin share_dra share_scheduler share_inspect share_webhook tests bench hack samples

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

# The unit tier runs in a random order every time (pytest-random-order): a test that needs another's
# side effects fails loudly instead of passing by luck. Bucket `module`: the modules in a random order,
# and the tests within each; a module-scoped fixture (a helm render, a protoc compile, the openb trace)
# is still made once per module, so the shuffle costs nothing. The seed is printed at the top and the
# bottom of the run; `make unit SEED=<n>` replays that order (docs/testing.md). The integration tier
# keeps its file order: its modules share one control plane and some walk one release through install,
# upgrade and uninstall; each module and each test there passes alone, which is how that tier is checked.
SEED ?=
UNIT_ORDER := --random-order-bucket=module$(if $(SEED), --random-order-seed=$(SEED))
UNIT := $(PY) -m pytest tests -m 'not integration' -q $(UNIT_ORDER)

unit: venv
	$(UNIT)

integration: venv k8s-bins containerd node-deps node-images image
	$(PY) -m pytest tests -m integration -q

# Every test, the control plane ones included: a missing binary or a control plane that
# cannot start fails the run; nothing is skipped. Then the integration tier again on the oldest
# supported Kubernetes (its own binaries and images, cached per version).
# The unit tier first (random order, above), then the integration tier; both run even when the first
# fails, and the oldest version's tier runs only when both passed.
test: venv k8s-bins containerd node-deps node-images image lint
	status=0; $(UNIT) || status=$$?; $(PY) -m pytest tests -m integration -q || status=$$?; exit $$status
	PYTHON=$(abspath $(PY)) hack/test-matrix.sh --oldest

# The GPU tier (tests/gpu, docs/testing.md): NVML, CUDA processes in pods' cgroups, over-limit kill, MPS
# and the samples on a real NVIDIA GPU. Root, and a Python with PyTorch and JAX (GPU_PYTHON) beside our
# dependencies. `make test` does not collect it (no GPU in CI); here it fails, never skips, without one.
GPU_PYTHON ?= python3
gpu-test:
	GPUSHARE_GPU_PYTHON=$(GPU_PYTHON) $(GPU_PYTHON) -m pytest tests/gpu --gpu -v -s -p no:cacheprovider

# The integration tier on each supported minor at its newest patch (hack/build-k8s.sh --list);
# `hack/test-matrix.sh 1.33 1.37` runs some. GPUSHARE_K8S_VERSION=1.33 picks one for any pytest run.
test-matrix: venv containerd node-deps image-deps
	PYTHON=$(abspath $(PY)) hack/test-matrix.sh

demo: venv k8s-bins containerd node-deps
	$(PY) -m hack.demo

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
