# Two set-up commands for a fresh machine: `make reproduce` and `make test`.
# Each creates .venv when it is missing, with the versions pinned in constraints.txt
# (`make lock` refreshes them: docs/getting_started.md, "What is bitwise, what holds within
# a tolerance").
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c constraints.txt
OUT ?= results
# make bench BENCH_ARGS=--quick: the short run (about 10 minutes on 2 cores)
BENCH_ARGS ?=

# make test-quick: the development loop, without the tests marked slow (subprocess runs of
# reproduce and torchrun, model zoos); `make test` and CI run everything.
.PHONY: reproduce test test-quick test-newest bench bench-gpu lint lock docs

$(VENV)/.paper: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) -e '.[paper]'
	touch $@

$(VENV)/.dev: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) -e '.[dev]'
	touch $@ $(VENV)/.paper

reproduce: $(VENV)/.paper
	$(VENV)/bin/taylorattr reproduce --out $(OUT)

test: $(VENV)/.dev
	$(PY) -m pytest

test-quick: $(VENV)/.dev
	$(PY) -m pytest -m "not slow"

$(VENV)/.bench: $(VENV)/.dev
	$(PIP) -e '.[dev,bench]'
	touch $@

bench: $(VENV)/.bench
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

# make bench-gpu: the ratio table against Captum on one CUDA GPU (under 5 minutes);
# refuses with a message where CUDA is not available. BENCH_GPU_ARGS=--json out.json
bench-gpu: $(VENV)/.dev
	$(PY) benchmarks/bench_gpu.py $(BENCH_GPU_ARGS)

# ruff, then the type checker over the public API ([tool.mypy] in pyproject.toml)
lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(VENV)/bin/mypy

# The documentation site (Sphinx: docs/conf.py) -> docs/_build/html, warnings as errors; the
# gallery's examples run and make their figures during the build (tests/test_docs.py runs
# them, and every code block of the site's pages, in `make test`).
docs: $(VENV)/.dev
	MPLBACKEND=Agg $(VENV)/bin/sphinx-build -W --keep-going -q -b html docs docs/_build/html

# The golden, determinism and resume tests against the newest versions pyproject's ranges
# allow (a scratch venv without the lock): drift is seen before a user's plain
# `pip install -e .` meets it. Prints which versions differ from constraints.txt.
NEWEST_VENV := .newest-venv
test-newest:
	test -x $(NEWEST_VENV)/bin/python || $(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade -e '.[dev]'
	$(NEWEST_VENV)/bin/python -m pip freeze --exclude-editable | grep -iv '^taylorattr' \
	  | diff <(sed '/^#/d' constraints.txt) - && echo "newest allowed = constraints.txt" || true
	$(NEWEST_VENV)/bin/python -m pytest tests/test_report.py tests/test_determinism.py \
	  tests/test_resume.py tests/test_distributed_reproduce.py tests/test_metrics.py

# The newest versions pyproject's ranges allow, in a scratch venv, frozen into
# constraints.txt; then regenerate tests/data/reproduce_tiny_v0.1.json
# (tests/regenerate_golden.py) and say in the commit what moved.
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q -e '.[dev]'
	{ sed -n '/^#/p' constraints.txt; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | grep -iv '^taylorattr'; } \
	  > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)
