# gpushare: two commands on a fresh machine.
#   make demo   start a local control plane with simulated GPU nodes and show where pods land
#   make test   install what the tests need, build the control plane binaries, run every test
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test unit integration demo lint venv k8s-bins proto bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

k8s-bins:
	hack/build-k8s.sh >/dev/null

LINT_PATHS := share_core share_plugin share_scheduler share_inspect tests bench hack samples

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

unit: venv
	$(PY) -m pytest tests -m 'not integration' -q

integration: venv k8s-bins
	$(PY) -m pytest tests -m integration -q

# Every test, the control plane ones included: a missing binary or a control plane that
# cannot start fails the run; nothing is skipped.
test: venv k8s-bins lint
	$(PY) -m pytest tests -q

demo: venv k8s-bins
	$(PY) -m hack.demo

bench: venv
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
