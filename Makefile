# Both entry points bootstrap .venv on a fresh machine, then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tests mostly wait on processes and locks: three workers keep both cores busy. worksteal: a
# worker that runs out takes half of the longest queue, where the default (load) leaves a batch
# queued on one worker (the LAN tests, say) to run alone at the end.
PYTEST_ARGS ?= -n 3 --dist worksteal
# More arguments after those: .ci/run deselects with it (-m) under all but one Python.
PYTEST_MORE ?=

.PHONY: demo test docs bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/anywool demo $(ARGS)

# The wheels of anywool's dependencies, every extra, and pytest: tests/packaging installs the
# wheel it builds in a fresh venv from these, as the test run itself has no network.
WHEELHOUSE := $(VENV)/wheelhouse

$(WHEELHOUSE)/.filled: pyproject.toml $(STAMP)
	$(BIN)/python -m pip wheel --quiet -w $(WHEELHOUSE) '.[trio,lan,etcd,otel]' pytest
	rm -f $(WHEELHOUSE)/anywool-*.whl
	touch $@

# The sources are compiled to bytecode first (as for bench, below): where PYTHONDONTWRITEBYTECODE
# is set, every interpreter the suite starts (each pool's template, each CLI run, each example)
# would otherwise compile what it imports of anywool and of the tests again, about a fifth of the
# CPU time of a test that starts a pool.
test: $(STAMP) $(WHEELHOUSE)/.filled
	$(BIN)/python -m compileall -q src tests
	ANYWOOL_WHEELHOUSE=$(abspath $(WHEELHOUSE)) $(BIN)/python -m pytest $(PYTEST_ARGS) $(PYTEST_MORE)

$(VENV)/.docs-installed: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

# The documentation site (MkDocs), warnings as errors, into site/.
docs: $(VENV)/.docs-installed
	$(BIN)/python -m mkdocs build --strict --quiet

$(VENV)/.bench-installed: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

# Every figure also goes to $(BENCH_JSON)/<script>.json. The sources are compiled to bytecode
# first, as an installed wheel's are: else, where PYTHONDONTWRITEBYTECODE is set, every worker
# compiles anywool at start-up.
BENCH_JSON ?= .bench

bench: $(VENV)/.bench-installed
	mkdir -p $(BENCH_JSON)
	$(BIN)/python -m compileall -q src benchmarks
	$(BIN)/python benchmarks/peers.py --json $(BENCH_JSON)/peers.json $(ARGS)
	$(BIN)/python benchmarks/workloads.py --json $(BENCH_JSON)/workloads.json $(ARGS)
	$(BIN)/python benchmarks/run.py --json $(BENCH_JSON)/run.json $(ARGS)
	$(BIN)/python benchmarks/lifecycle.py --json $(BENCH_JSON)/lifecycle.json $(ARGS)
	$(BIN)/python benchmarks/observability.py --json $(BENCH_JSON)/observability.json $(ARGS)
	$(BIN)/python benchmarks/discovery.py --json $(BENCH_JSON)/discovery.json $(ARGS)
	$(BIN)/python benchmarks/lan.py --json $(BENCH_JSON)/lan.json
	$(BIN)/python benchmarks/etcd.py --json $(BENCH_JSON)/etcd.json $(ARGS)

clean:
	rm -rf $(VENV)
