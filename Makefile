# psbench: `make bench` reproduces the comparison; `make test` runs the test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.psbench-installed
RESULTS ?= results

.PHONY: setup test test-slow bench bench-quick regress soak clean horovod test-horovod microbench docker-image test-docker \
        gpu-check

# Horovod's build (a few minutes on 2 cores, once: the wheel is cached) is set-up, so `make bench`'s
# time is its suites'. Where it cannot be built, its runs and tests are skipped with a note.
HOROVOD_STAMP := $(VENV)/.psbench-horovod
setup: $(STAMP) $(HOROVOD_STAMP)

# Re-installs only when pyproject.toml changes, so a second `make setup` takes seconds. Ray is
# optional (the ray-ps peer system): where it cannot be installed, its runs and tests are skipped.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[spark,fuzz,mlflow,tensorboard,mllog,dev]'
	$(BIN)/python -m pip install -q -e '.[ray]' || echo "psbench: ray could not be installed; ray-ps runs will be skipped"
	touch $(STAMP)

$(HOROVOD_STAMP): $(STAMP)
	$(MAKE) --no-print-directory horovod || \
	  echo "psbench: horovod could not be built; its runs and tests will be skipped (see systems/horovod/README.md)"

# The docker tests (marked `docker`, left out by pyproject's addopts) run in `make test-docker`.
# --durations: CI's log lists the slowest tests, so the 12-minute bound is watched where it is kept.
test: setup
	$(BIN)/python -m pytest -q --durations=20

# The tests of a minute or more each (marked slow; CI runs them after `make test`).
test-slow: setup
	$(BIN)/python -m pytest -q --durations=10 -m 'slow and not docker'

bench: setup
	$(BIN)/psbench bench --results-dir $(RESULTS)
	$(BIN)/psbench simulate --from $(RESULTS) --out $(RESULTS)/simulate

bench-quick: setup
	$(BIN)/psbench bench --quick --results-dir $(RESULTS)

# Throughput ratios of this checkout against the baseline's commit (git_sha in
# bench/regress/baselines/regress.json), both measured here side by side, 4 interleaved repeats a side
# (5 by default: one fewer keeps CI under 40 minutes); non-zero exit on a regression. The peers
# (ps against ray-ps and rpc-ps, 4 workers on these 2 cores: oversubscribed, +-19 % and +-54 %) are
# left out: half of the check's time, a PS slow-down already fails the ps.* ratios, and rpc-ps's
# spread could not catch one; `psbench regress --quick --against` runs them too.
REGRESS_GATED := --only harness_overhead --only ps --only ps_wire --only micro
regress: setup
	$(BIN)/psbench regress --quick --against --repeats 4 $(REGRESS_GATED)

# The GPU paths on this machine's CUDA devices, a few hundred steps each: single, ddp with NCCL, ps with
# one shard; a table of samples/s and the step's time columns. Exit 3 where torch sees no CUDA device
# (psbench/bench/gpu_check.py). Horovod's build is not needed for it.
gpu-check: $(STAMP)
	$(BIN)/psbench gpu-check

# Micro-benchmarks under pytest-benchmark (tests/microbench): saves the run's JSON in .benchmarks/
# and, when an earlier save exists, compares with it and fails on a slowdown beyond MICROBENCH_FAIL.
MICROBENCH_FAIL ?= min:30%
microbench: setup
	@compare=""; if ls .benchmarks/*/*.json >/dev/null 2>&1; then \
	  compare="--benchmark-compare --benchmark-compare-fail=$(MICROBENCH_FAIL)"; fi; \
	$(BIN)/python -m pytest tests/microbench -q --benchmark-enable --benchmark-only --benchmark-autosave \
	  --benchmark-columns=min,median,iqr,rounds --benchmark-sort=name $$compare

# Real Horovod 0.28.1 built against the pinned torch (patch in systems/horovod/patches/); the
# wheel is cached in .cache/horovod, so a second `make horovod` only reinstalls it. Runtime deps
# are Horovod's install_requires (the wheel itself goes in with --no-deps so torch stays pinned).
HOROVOD_CACHE ?= .cache/horovod
horovod: $(STAMP)
	@wheel=$$(bash systems/horovod/build_wheel.sh $(BIN)/python $(HOROVOD_CACHE)) && \
	  echo "installing $$wheel" && \
	  $(BIN)/python -m pip install -q --no-deps --force-reinstall "$$wheel" && \
	  $(BIN)/python -m pip install -q cloudpickle psutil pyyaml packaging cffi && \
	  $(BIN)/python -c 'import horovod, horovod.torch; print("horovod", horovod.__version__, "imports")' && \
	  touch $(HOROVOD_STAMP)

# The Horovod tests; in `make test` they are an explicit skip while Horovod is not installed.
test-horovod: setup
	$(BIN)/python -m pytest -q -m horovod -rs

# 8 workers x 10k push-pull ops against 2 shards on loopback: ops/s, p50/p99, shard memory growth.
soak: setup
	$(BIN)/python -m pytest -q -s -m slow tests/soak_ps.py

# The image, built offline: dockerd started if none answers (docker/daemon.json: networks in
# 198.19.0.0/16), a Debian base made with debootstrap (docker/base-image.sh), every wheel built on
# the host (docker/wheelhouse.sh), `docker build --network none`. Each step is skipped when done.
DOCKER_BASE  ?= psbench-base:bookworm
DOCKER_IMAGE ?= psbench:latest
docker-image: setup
	bash docker/dockerd.sh
	bash docker/base-image.sh $(DOCKER_BASE)
	bash docker/wheelhouse.sh $(BIN)/python
	docker build -q --network none --build-arg BASE=$(DOCKER_BASE) -f docker/Dockerfile -t $(DOCKER_IMAGE) .
	docker image prune -f --filter label=psbench.image=1 >/dev/null

# Builds the image and runs the compose PS job (clean, a worker killed under asp and under bsp) and
# the Spark profile for real; needs root (dockerd) and docker/ci-setup.sh's packages.
test-docker: setup
	$(BIN)/python -m pytest -q -s -rs -m docker tests/test_docker_run.py

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
