# Two commands do all the set-up: `make demo` (the main job) and `make test` (the test suite).
# Both create or refresh the local virtual environment in .venv when needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.s2l-installed
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: venv model demo test test-unit lint format clean workloads

workloads: venv  ## regenerate both workload traces (seeded) into datasets/
	$(PY) -m bench.workloads.ann --out datasets/ann/traces.jsonl.xz
	$(PY) -m bench.workloads.crawler --out datasets/crawler/traces.jsonl

venv: $(STAMP)

$(STAMP): requirements-cpu.txt requirements-workloads.txt requirements-nodeps.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the CPU set into $(VENV) (first time: several minutes)"
	$(PIP) -r requirements-cpu.txt -r requirements-workloads.txt
	$(PIP) --no-deps -r requirements-nodeps.txt
	$(PIP) --no-deps -e .
	@touch $(STAMP)

model: venv
	$(VENV)/bin/s2l model prepare

demo: model
	$(VENV)/bin/s2l demo

test: model
	$(PY) -m pytest -q tests

test-unit: venv
	$(PY) -m pytest -q tests/unit

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV)
