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

.PHONY: setup setup-demo test lint typecheck pytest demo bench clean test-torch-latest

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

test: lint typecheck pytest

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
	rm -rf $(VENV) $(LATEST_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
