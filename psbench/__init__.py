"""psbench: benchmarking distributed deep learning (parameter server vs allreduce vs Spark).

One import namespace over the design card's folders, so nothing installs generic top-level names.
This folder holds the core and a relative link to each of the others, so an import path is a file
path (psbench/systems/ps/server.py is psbench.systems.ps.server):

    psbench.core       core/ (this folder): RunSpec, Recorder and record schemas, ConfigError,
                       atomic writes, the process supervisor; imports nothing of the layers above
    psbench.workloads  workloads/: datasets, models, sharding
    psbench.systems    systems/: one adapter per system behind systems/base.py
    psbench.bench      bench/: the harness, reports, host lab, scale model, regression, and the CLI

Dependencies run one way: core <- workloads <- systems <- bench (harness <- report/lab/sim/regress
<- cli). tests/test_architecture.py checks it, and that a static tool resolves every import.
"""
