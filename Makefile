# make test: create .venv, install the project with its pinned stack, run the whole test suite (in TEST_WORKERS
#            processes, 3 by default).
# make test-fast: the fast tier, every test that starts no subprocess, Ray, server or flow and is not slow
#            (the heavy marker, set by tests/conftest.py), in about a minute on 2 cores.
# make test-durations: the whole suite, writing each module's seconds to tests/module_seconds.json, from which
#            `make test` gives out the longest modules first (commit it when modules come or grow).
# make lint: ruff over the project (its settings in pyproject.toml).
# make demo: start the local stack (MLflow server, Prefect server and worker), deploy prefect.yaml, run the
#            demo deployment on the synthetic default, print its metrics and the UI addresses.
# make stop: stop what `make demo` started.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PGT := $(VENV)/bin/pgt
STATE ?= .state
PYTEST_ARGS ?=
# pytest-xdist processes of `make test`; each test file runs whole in one of them (0: in this process). One more than
# the 2 cores CI has: a test process spends much of its time waiting on the commands, servers and Ray nodes it
# starts, and a third fills those waits, where a fourth adds more contention than it fills (README, Tests)
TEST_WORKERS ?= 3
# a test process that dies (a native crash, an os._exit) fails its test by name and ends the run: xdist's
# replacement of a crashed process under --dist loadfile can wait forever, or start the same test again and again
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --max-worker-restart=0

.PHONY: install lint test test-fast test-durations demo stop bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest $(XDIST) -m "not heavy" $(PYTEST_ARGS)

test-durations: install
	$(PY) -m pytest $(XDIST) --module-seconds tests/module_seconds.json $(PYTEST_ARGS)

demo: install
	PGT_VENV_BIN=$(abspath $(VENV))/bin scripts/demo.sh

stop:
	scripts/stop-stack.sh

bench: install
	$(PY) benchmarks/preprocess.py
	$(PY) benchmarks/train.py
	$(PY) benchmarks/ddp.py
	$(PY) benchmarks/sweep.py

clean:
	rm -rf $(STATE) .pytest_cache
