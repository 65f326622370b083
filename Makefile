# Two commands for a newcomer: `make demo` (a private federated run) and `make test` (the suite).
# Both create the virtual environment and install what they need on first use. `make test` is the default tier;
# `make test-integration` the slow end-to-end tier (tests marked `integration`); `make test-all` both in one run.
# `make docs` builds the documentation site into site/ in strict mode (a broken link or reference fails it).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test test-integration test-all bench data install docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,ray,flower,parquet,docs]'
	touch $@

install: $(VENV)/.installed

data: install
	bash scripts/get_fashion_mnist.sh $(PY)

demo: install
	$(VENV)/bin/dpfl demo

test: install data
	$(PY) -m pytest

test-integration: install data
	$(PY) -m pytest -m integration

test-all: install data
	$(PY) -m pytest -m ''

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: install
	$(PY) benchmarks/engine.py

clean:
	rm -rf $(VENV) .pytest_cache site
