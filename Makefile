# make test: create .venv, install the project with its pinned stack, run the whole test suite.
# make demo: the pipeline on the synthetic default data (the Prefect/MLflow stack arrives with its issue).
# make stop: stop what `make demo` started.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PGT := $(VENV)/bin/pgt
STATE ?= .state
PYTEST_ARGS ?=

.PHONY: install test demo stop bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	$(PGT) synth --users 50 --days 120 --seed 0 --out $(STATE)/demo/synthetic.parquet
	$(PGT) preprocess --input $(STATE)/demo/synthetic.parquet --format positionfixes --out $(STATE)/demo/sequences
	$(PGT) manifest $(STATE)/demo/sequences

stop:
	@echo "make stop: nothing is running (the demo starts no services yet)"

bench: install
	$(PY) benchmarks/preprocess.py

clean:
	rm -rf $(STATE) .pytest_cache
