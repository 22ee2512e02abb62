# tracedpush: `make test` and `make demo` are each self-sufficient on a fresh machine:
# they create .venv on first use and install (once; a stamp file skips reinstalls).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_ARGS ?=
PYTEST_ARGS ?=
# pyproject extras; on a GPU box: make install EXTRAS=gpu,console,model,dev
EXTRAS ?= cpu,console,model,dev
# Where the tiny model lives; empty means tracedpush's default
# ($$TRACEDPUSH_MODEL_DIR, else ~/.cache/tracedpush/models/tiny-qwen2).
MODEL_DIR ?=
ifneq ($(MODEL_DIR),)
export TRACEDPUSH_MODEL_DIR := $(abspath $(MODEL_DIR))
endif

.PHONY: help install test check demo model lint format fuzz soak dashboards clean distclean

help:
	@echo "make test      install (first time) and run the whole test suite"
	@echo "make demo      install, build the tiny model if absent, run push vs pull demo"
	@echo "make install   create $(VENV) and install tracedpush with the CPU vLLM stack"
	@echo "make model     build the tiny local Qwen2 model (no network)"
	@echo "make check     ruff check, ruff format --check, import-layer contracts (part of test)"
	@echo "make lint      ruff check + ruff format --check"
	@echo "make format    ruff format + ruff check --fix"
	@echo "make fuzz      property-based fuzzing of the proxy's request schema (5000 examples)"
	@echo "make soak      the long fault runs make test leaves out (pull-mode engine kills)"
	@echo "make dashboards  regenerate the Grafana dashboards (dashboards/*.json) from code"
	@echo "make clean     remove caches and run/trace outputs; distclean also removes $(VENV)"
	@echo "Variables: VENV=$(VENV) EXTRAS=$(EXTRAS) PYTEST_ARGS= DEMO_ARGS= MODEL_DIR= FUZZ_EXAMPLES=$(FUZZ_EXAMPLES)"

install:
	@EXTRAS=$(EXTRAS) bash scripts/install.sh $(VENV)

test: install check
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff, plus the import-layer contracts in pyproject.toml ([tool.importlinter])
check: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

model: install
	$(VENV)/bin/tracedpush model build

demo: model
	$(VENV)/bin/tracedpush demo $(DEMO_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The proxy's request-schema fuzz test with more examples than `make test` runs (300).
FUZZ_EXAMPLES ?= 5000
fuzz: install
	TRACEDPUSH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/unit/test_proxy_fuzz.py \
		--hypothesis-show-statistics $(PYTEST_ARGS)

# Long fault runs (pytest marker `soak`), left out of `make test` to keep it under 25 min.
soak: install
	$(PY) -m pytest -m soak -s $(PYTEST_ARGS)

# Grafana dashboards are generated (tracedpush/dashboards, grafana-foundation-sdk);
# tests/unit/test_dashboards.py fails when the committed JSON is stale.
dashboards: install
	$(PY) -m tracedpush.dashboards

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .hypothesis runs traces artifacts
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
