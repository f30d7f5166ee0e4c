# sdar-jax: every target sets up .venv on first use (plain pip; torch only for the tests).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RUNTIME_STAMP := $(VENV)/.runtime-installed
DEV_STAMP     := $(VENV)/.dev-installed
WORKDIR ?= runs/demo
PYTEST_ARGS ?=

.PHONY: demo test test-fast bench fmt clean-venv help

help:
	@echo "make demo   - the embedded offline SDAR run (configs/default.py), sets up .venv"
	@echo "make test   - the whole test suite (slow end-to-end tests included), sets up .venv"
	@echo "make test-fast - the suite without tests marked slow"
	@echo "make bench  - forward / sampling / train-step / env benchmarks (print figures)"
	@echo "make fmt    - format the tree (ruff, settings in pyproject.toml)"

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

$(RUNTIME_STAMP): requirements.txt pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -r requirements.txt
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $@

$(DEV_STAMP): requirements.txt requirements-dev.txt $(RUNTIME_STAMP)
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	touch $@

demo: $(RUNTIME_STAMP)
	$(PY) -m sdar_jax.train --config=configs/default.py --workdir=$(WORKDIR)

test: $(DEV_STAMP)
	$(PY) -m pytest tests -q -ra $(PYTEST_ARGS)

test-fast: $(DEV_STAMP)
	$(PY) -m pytest tests -q -ra -m "not slow" $(PYTEST_ARGS)

bench: $(DEV_STAMP)
	$(PY) bench/forward.py
	$(PY) bench/sampling.py
	$(PY) bench/train_step.py
	$(PY) bench/envs.py

fmt: $(DEV_STAMP)
	$(VENV)/bin/ruff format .

clean-venv:
	rm -rf $(VENV)
