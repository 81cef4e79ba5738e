# psbench: `make bench` reproduces the comparison; `make test` runs the test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.psbench-installed
RESULTS ?= results

.PHONY: setup test bench bench-quick regress soak clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes, so a second `make setup` takes seconds.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[spark]'
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/psbench bench --results-dir $(RESULTS)

bench-quick: setup
	$(BIN)/psbench bench --quick --results-dir $(RESULTS)

# Throughput ratios vs bench/baselines/regress.json; non-zero exit on a regression beyond tolerance.
regress: setup
	$(BIN)/psbench regress --quick

# 8 workers x 10k push-pull ops against 2 shards on loopback: ops/s, p50/p99, shard memory growth.
soak: setup
	$(BIN)/python -m pytest -q -s tests/soak_ps.py

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
