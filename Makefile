# Two commands do all the set-up: `make demo` (the main job) and `make test` (the test suite).
# Both create or refresh the local virtual environment in .venv when needed; `make test` also
# installs the Debian libraries the prefill-decode tests load (`make pd-deps`, apt-get as root).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.s2l-installed
PIP := $(PY) -m pip install -q --disable-pip-version-check

# What `s2l serve --pd` (and tests/e2e/test_pd.py) loads beyond the CPU set: shared object:Debian package
PD_LIBS := libibverbs.so.1:libibverbs1 libnl-3.so.200:libnl-3-200 libnl-route-3.so.200:libnl-route-3-200

.PHONY: venv pd-deps crawler-site model demo test test-unit lint format clean workloads

workloads: venv crawler-site  ## regenerate both workload traces (seeded) into datasets/
	$(PY) -m bench.workloads.ann --out datasets/ann/traces.jsonl.xz
	$(PY) -m bench.workloads.crawler --out datasets/crawler/traces.jsonl

venv: $(STAMP)

# The site the crawler workload crawls: Debian's python3.11-doc, downloaded (not installed) and
# extracted once into the cache (where bench/workloads/site.py looks for it).
SITE_DIR ?= $(or $(S2L_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/stream2llm-sglang)/crawler/python3.11-doc
crawler-site:
	@test -f "$(SITE_DIR)/usr/share/doc/python3.11/html/index.html" || { \
	  mkdir -p "$(SITE_DIR)" && cd "$(SITE_DIR)" && \
	  { apt-get download python3.11-doc || { apt-get update && apt-get download python3.11-doc; }; } && \
	  dpkg -x python3.11-doc_*.deb . ; }

# The prefill-decode prerequisites: the `.[pd]` PyPI packages (pinned in requirements-cpu.txt, so
# normally already there) and the Debian libraries the Mooncake wheel loads even for TCP
# (apt-get, as root or with sudo; `apt-get update` only if the install fails). Idempotent.
pd-deps: $(STAMP)
	@$(PY) -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('sglang_router', 'mooncake')))" \
	  || $(PIP) -c requirements-cpu.txt sglang-router mooncake-transfer-engine-non-cuda
	@missing=""; for pair in $(PD_LIBS); do \
	  $(PY) -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$${pair%%:*}" 2>/dev/null || missing="$$missing $${pair##*:}"; \
	done; \
	[ -z "$$missing" ] && exit 0; \
	install="apt-get install -y --no-install-recommends$$missing"; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; \
	else echo "the PD deployment needs the Debian packages$$missing; as root, run: $$install" >&2; exit 1; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "the PD deployment needs the Debian packages$$missing (no apt-get here: install their libraries)" >&2; exit 1; fi; \
	echo "+ $${sudo:+sudo }$$install"; \
	$$sudo env DEBIAN_FRONTEND=noninteractive $$install </dev/null \
	  || { echo "+ $${sudo:+sudo }apt-get update"; $$sudo env DEBIAN_FRONTEND=noninteractive apt-get update </dev/null \
	       && $$sudo env DEBIAN_FRONTEND=noninteractive $$install </dev/null; } \
	  || { echo "could not install$$missing; run: $${sudo:+sudo }$$install" >&2; exit 1; }

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

test: model pd-deps
	$(PY) -m pytest -q tests

test-unit: venv
	$(PY) -m pytest -q tests/unit

lint: venv
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV)
