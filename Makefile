# Two set-up commands for a fresh machine: `make reproduce` and `make test`.
# Each creates .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
OUT ?= results
# make bench BENCH_ARGS=--quick: the short run (about 10 minutes on 2 cores)
BENCH_ARGS ?=

.PHONY: reproduce test bench lint

$(VENV)/.paper: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[paper]'
	touch $@

$(VENV)/.dev: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.paper

reproduce: $(VENV)/.paper
	$(VENV)/bin/taylorattr reproduce --out $(OUT)

test: $(VENV)/.dev
	$(PY) -m pytest

$(VENV)/.bench: $(VENV)/.dev
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

bench: $(VENV)/.bench
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests benchmarks
