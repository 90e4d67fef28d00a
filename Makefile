# spanmill's front door. `make demo` and `make test` install whatever is missing first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
CACHE := $(CURDIR)/.cache
# Models, helper binaries and the local stack's state stay inside the checkout.
export SPANMILL_HOME ?= $(CACHE)/spanmill
export PATH := $(BIN):$(SPANMILL_HOME)/bin:$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# The venv is rebuilt when the dependency list changes. constraints.txt pins every
# version a working venv resolved (`make lock` writes it): installs are reproducible
# and skip pip's backtracking through the boto/aiobotocore ranges.
DEPS_HASH := $(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
VENV_STAMP := $(VENV)/.installed-$(DEPS_HASH)
# The collector's C extension, built in place by the editable install; rebuilt here
# when its source changes after that.
NATIVE_SRC := src/spanmill/_native.c
NATIVE_STAMP := $(VENV)/.native-$(shell sha1sum $(NATIVE_SRC) | cut -c1-12)
HELM := $(SPANMILL_HOME)/bin/helm
BASE_MODEL := smollm2-135m
MODEL_STAMP := $(SPANMILL_HOME)/models/$(BASE_MODEL)/spanmill-model.json
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`, each given whole test files, the slow ones first
# (tests/conftest.py orders them); TEST_WORKERS=0 runs every test in one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: help install demo test test-fast bench fuzz lint format charts up down status clean lock

help:
	@echo "make demo    install what is missing, then run the demo on the embedded stack"
	@echo "make test    install what is missing, then run every test"
	@echo "make lint    ruff and mypy;  make bench  benchmarks;  make charts  helm checks;  make fuzz  the native decoder under sanitizers"
	@echo "make up | status | down   the local stack (tansu, MLflow, tritonserver, the gateway, the collector)"

install: $(VENV_STAMP) $(NATIVE_STAMP) $(HELM) $(MODEL_STAMP)

# torch goes first and pinned to its CPU build (constraints.txt): an open range would
# pull a multi-GB CUDA build. Where pip's own sources lack that build (a machine with
# no wheel of it at hand), PyTorch's CPU index has it.
TORCH_CPU := torch==2.13.0+cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
$(VENV_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q --no-compile '$(TORCH_CPU)' 2>/dev/null \
	  || $(BIN)/python -m pip install -q --no-compile --index-url $(TORCH_CPU_INDEX) '$(TORCH_CPU)'
	$(BIN)/python -m pip install -q --no-compile -c constraints.txt -e '.[all,dev]'
	$(BIN)/python -m pip check
	# Byte-compiled on every core at once (pip compiles one file after another): 20 seconds
	# sooner on two cores. As pip does, a file that does not compile on this Python (torch
	# ships test files in 3.12 syntax) is left as source.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	# The editable build leaves spanmill.egg-info in the checkout; run from here, Python
	# would read its entry points (tasks, evaluators) instead of the installed ones.
	rm -rf spanmill.egg-info
	rm -f $(VENV)/.installed-*
	touch $@

$(NATIVE_STAMP): $(NATIVE_SRC) setup.py | $(VENV_STAMP)
	$(BIN)/python -W ignore setup.py -q build_ext --inplace
	$(BIN)/python -c "import spanmill._native"
	rm -f $(VENV)/.native-*
	touch $@

$(HELM): | $(VENV_STAMP)
	PYTHON=$(BIN)/python infra/local/fetch-helm.sh $(SPANMILL_HOME)/bin

$(MODEL_STAMP): | $(VENV_STAMP)
	$(BIN)/spanmill models pull $(BASE_MODEL)

# What the venv waits for goes on side by side after it (the model's download, the
# extension's build, helm's fetch, and for `make test` mypy and the charts): a minute
# sooner on two cores. Each step's output is printed whole when it ends.
SETUP := $(MAKE) --no-print-directory -j 3 --output-sync=target

demo:
	$(SETUP) install
	$(BIN)/spanmill demo

test:
	$(SETUP) install lint charts
	$(PYTEST) $(PYTEST_ARGS)

test-fast: install
	$(PYTEST) -m "not services and not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m bench

# The collector's native decoder and row builder under libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer (fuzz/run.py); the corpus in fuzz/corpus grows in place.
FUZZ_SECONDS ?= 1200
fuzz: install
	$(BIN)/python fuzz/run.py --seconds $(FUZZ_SECONDS)

lint: $(VENV_STAMP)
	$(BIN)/ruff check src tests bench infra components pipelines services examples fuzz
	$(BIN)/ruff format --check src tests bench infra components pipelines services examples fuzz
	$(BIN)/mypy src

format: $(VENV_STAMP)
	$(BIN)/ruff check --fix src tests bench infra components pipelines services examples fuzz
	$(BIN)/ruff format src tests bench infra components pipelines services examples fuzz

# Each chart: helm lint --strict and helm template (Kubernetes 1.30) for every value
# set in its ci/ folder, then kubernetes-validate --strict of everything rendered.
# Custom resources are checked against their vendored CRD schemas (Strimzi's, the
# Trainer's); ServiceMonitor alone is skipped by name: see infra/charts/validate_manifests.py.
CHARTS_OUT := $(CACHE)/charts
KUBE_VERSION := 1.30.0
charts: $(HELM) $(VENV_STAMP)
	@rm -rf $(CHARTS_OUT); mkdir -p $(CHARTS_OUT)
	@found=0; for chart in charts/*/Chart.yaml; do \
	  [[ -e $$chart ]] || continue; found=1; dir=$$(dirname $$chart); \
	  for set in $$dir/ci/*.yaml; do \
	    [[ -e $$set ]] || { echo "charts: $$dir has no ci/*.yaml value sets" >&2; exit 1; }; \
	    out=$(CHARTS_OUT)/$$(basename $$dir)-$$(basename $$set); \
	    echo "charts: $$dir with $$set"; \
	    $(HELM) lint --strict --quiet --kube-version $(KUBE_VERSION) "$$dir" -f "$$set"; \
	    $(HELM) template spanmill "$$dir" --namespace spanmill --kube-version $(KUBE_VERSION) \
	      -f "$$set" > "$$out"; \
	  done; \
	done; \
	if [[ $$found == 1 ]]; then \
	  $(BIN)/python infra/charts/validate_manifests.py --kube-version $(KUBE_VERSION) $(CHARTS_OUT)/*.yaml; \
	else echo "charts: no chart in charts/ yet"; fi

up status down: $(VENV_STAMP)
	$(BIN)/spanmill $@

lock: $(VENV_STAMP)
	{ head -1 constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^spanmill'; } > constraints.new
	mv constraints.new constraints.txt

clean:
	-$(BIN)/spanmill down
	rm -rf $(VENV) $(CACHE) .pytest_cache .mypy_cache .ruff_cache
