# Two-command set-up: `make demo` and `make test` create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned for development and CI: any other request pulls GBs of CUDA wheels.
TORCH_PIN := torch==2.13.0

.PHONY: setup test lint typecheck pytest demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev]" "$(TORCH_PIN)"
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(PY) -m pytest -n 2 -q

test: lint typecheck pytest

demo: setup
	$(VENV)/bin/meshlayout plan --world 64 --pp 2 --cp 2 --tp 4 --ep 4 --ranks-per-host 8 --rank 13 --view tp,fsdp,ep
	$(VENV)/bin/meshlayout demo

bench: setup
	$(PY) benchmarks/bench_layout.py
	$(PY) benchmarks/bench_mesh.py
	$(PY) benchmarks/bench_sharding.py
	$(PY) benchmarks/bench_runtime.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
