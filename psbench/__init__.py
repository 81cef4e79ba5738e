"""psbench: benchmarking distributed deep learning (parameter server vs allreduce vs Spark).

One import namespace, so nothing installs generic top-level names. The code lies where its import
path says (psbench.systems.ps.server is psbench/systems/ps/server.py); the design card's top-level
folders bench/, systems/ and workloads/ are relative links to these folders:

    psbench.core       psbench/core/: RunSpec, Recorder and record schemas, ConfigError,
                       atomic writes, the process supervisor; imports nothing of the layers above
    psbench.workloads  psbench/workloads/: datasets, models, sharding
    psbench.systems    psbench/systems/: one adapter per system behind systems/base.py
    psbench.bench      psbench/bench/: the harness, reports, host lab, scale model, regression, and the CLI

Dependencies run one way: core <- workloads <- systems <- bench (harness <- report/lab/sim/regress
<- cli). tests/test_architecture.py checks it, and that a static tool resolves every import.
"""
