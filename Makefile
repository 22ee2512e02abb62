# tracedpush: `make test` and `make demo` are each self-sufficient on a fresh machine:
# they create .venv on first use and install (once; a stamp file skips reinstalls).
VENV ?= .venv
PY := $(VENV)/bin/python
# The vLLM 0.33 lane's overlay env (scripts/install_vllm033.sh): vllm 0.33.0 over $(VENV)
VENV033 ?= .venv-vllm033
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

.PHONY: help install test test-vllm033 check-gpu-install check demo model lint format fuzz soak dashboards clean distclean

help:
	@echo "make test      install (first time) and run the whole test suite"
	@echo "make demo      install, build the tiny model if absent, run push vs pull demo"
	@echo "make test-vllm033  the connector's vLLM-facing unit tests against vLLM 0.33 (part of test)"
	@echo "make check-gpu-install  pip resolves .[gpu,console,model,dev] (dry run; CI runs it)"
	@echo "make install   create $(VENV) and install tracedpush with the CPU vLLM stack"
	@echo "make model     build the tiny local Qwen2 model (no network)"
	@echo "make check     ruff check, ruff format --check, import-layer contracts (part of test)"
	@echo "make lint      ruff check + ruff format --check"
	@echo "make format    ruff format + ruff check --fix"
	@echo "make fuzz      property-based fuzzing of the proxy's request schema (5000 examples)"
	@echo "make soak      the long runs make test leaves out (pull-mode engine kills, the 2P1D prefill kill, pull-mode bench joins)"
	@echo "make dashboards  regenerate the Grafana dashboards (dashboards/*.json) from code"
	@echo "make clean     remove caches and run/trace outputs; distclean also removes $(VENV) $(VENV033)"
	@echo "Variables: VENV=$(VENV) VENV033=$(VENV033) EXTRAS=$(EXTRAS) PYTEST_ARGS= DEMO_ARGS= MODEL_DIR= FUZZ_EXAMPLES=$(FUZZ_EXAMPLES)"

install:
	@EXTRAS=$(EXTRAS) bash scripts/install.sh $(VENV)

# Two pytest phases (scripts/run_tests.sh): the unit and console tests on a worker per
# core, then the e2e and timing-sensitive (`serial`) tests alone. --durations: the slowest
# tests in every CI log, to keep `make test` under 25 minutes
test: install check
	bash scripts/run_tests.sh $(PY) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-vllm033 PYTEST_ARGS=

# The vLLM 0.33 lane: every unit test that touches vLLM's classes, run against vLLM 0.33.0's
# real Python package (the GPU wheel, installed without dependencies in an overlay on
# $(VENV): scripts/install_vllm033.sh). `make test` runs it after the suite (about 30 s;
# the first time 40 s more to build the overlay). TRACEDPUSH_VLLM_LANE tells the tests
# which vLLM they must find (tests/unit/test_vllm_seams.py).
VLLM033_TESTS := tests/unit/test_vllm_seams.py $(wildcard tests/unit/test_connector_*.py) \
	tests/unit/test_producer_watch.py $(wildcard tests/unit/test_span_builder*.py) \
	tests/unit/test_proxy_flows.py::test_idle_engine_connections_are_dropped_before_vllm_drops_them
test-vllm033: install
	@MAIN_VENV=$(abspath $(VENV)) bash scripts/install_vllm033.sh $(VENV033)
	TRACEDPUSH_VLLM_LANE=0.33 $(VENV033)/bin/python -m pytest $(VLLM033_TESTS) $(PYTEST_ARGS)

# The GPU install path resolves (README, "Install on a GPU box"): pip install --dry-run of
# .[gpu,console,model,dev], nothing installed; about a minute (wheel metadata). Not part of
# `make test` (marker gpu_install); .ci/run runs it after `make test`.
check-gpu-install: install
	$(PY) -m pytest -m gpu_install tests/unit/test_gpu_install.py $(PYTEST_ARGS)

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

# Long runs (pytest marker `soak`), left out of `make test` to keep it under 25 min.
soak: install
	$(PY) -m pytest -m soak -s $(PYTEST_ARGS)

# Grafana dashboards are generated (tracedpush/dashboards, grafana-foundation-sdk);
# tests/unit/test_dashboards.py fails when the committed JSON is stale.
dashboards: install
	$(PY) -m tracedpush.dashboards

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .hypothesis runs traces artifacts
	find . -path ./$(VENV) -prune -o -path ./$(VENV033) -prune -o -name __pycache__ -type d \
		-exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(VENV033)
