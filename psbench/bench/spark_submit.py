"""The body of deploy/spark/psbench_job.py, the file a Spark user hands to spark-submit as it is:

    spark-submit --master spark://HOST:7077 [--conf ...] deploy/spark/psbench_job.py \\
        --system spark-mllib --workload mlp-digits --workers 2 --results-dir DIR [psbench run's flags]

One run of a Spark system, through the harness as `psbench run` does it (plan, record, the same
manifest and records, the run folder written atomically into DIR), on the session spark-submit's
settings make (master, driver addresses, authentication secret: all spark-submit's; psbench only
adds its run settings, session.run_settings, where spark-submit did not set them). The systems use
that session (session.use_submitted_session) and start no other; a plan measures no CPU figures
here (that needs a local session of its own): cached ones, else none, as the manifest says.

Before any connection: a master or driver beyond loopback needs spark.authenticate (with its
secret in a --properties-file) or --insecure true, else one line and exit 2. Then one task per
worker imports psbench on the executors; where that fails, one line names how to ship it
(a checkout on spark.executorEnv.PYTHONPATH, or psbench installed in their Python) and the
job exits 2."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

from psbench.core.errors import ConfigError

SYSTEMS = ("spark-mllib", "spark-barrier", "spark-torch", "spark-mllib-native")
# psbench run's flags that are spark-submit's in a submitted job, and what to give spark-submit instead
SUBMIT_OWNS = {"spark_master": "--master", "driver_host": "--conf spark.driver.host=ADDR",
               "driver_bind": "--conf spark.driver.bindAddress=ADDR", "spark_conf": "--conf spark.key=value"}
# Not --py-files: psbench reads its data files (device profiles, log4j settings) from the file system,
# not from inside a zip.
SHIP_HINT = ("put a checkout every host holds at the same path on --conf spark.executorEnv.PYTHONPATH=/path/to/checkout, "
             "or pip install psbench into the executors' Python (spark.pyspark.python)")


def parse_job_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Any]:
    """The job's arguments (psbench run's, for one Spark run) and the system's options; ConfigError
    for what a submitted job cannot take."""
    from psbench.bench.cli import options_from_args, build_parser
    from psbench.systems import get_system
    from psbench.systems.base import parse_options

    args = build_parser("run").parse_args(["run", *argv])
    if args.config or args.cluster:
        raise ConfigError("a submitted job runs one run: give --system and --workload, not --config or --cluster")
    if args.system not in SYSTEMS:
        raise ConfigError(f"--system '{args.system}' is not a Spark system; a submitted job runs {', '.join(SYSTEMS)}")
    if "--results-dir" not in argv:
        raise ConfigError("give --results-dir DIR: where the run folder goes (on the driver's host; with "
                          "--deploy-mode cluster a folder every host can write)")
    given = options_from_args(args, args.system)
    owned = [name for name in SUBMIT_OWNS if name in given]
    if owned:
        name = owned[0]
        raise ConfigError(f"--{name.replace('_', '-')} is spark-submit's in a submitted job: give spark-submit "
                          f"{SUBMIT_OWNS[name]}")
    return args, parse_options(get_system(args.system).Options, given, args.system)


def executor_import_error(sc: Any, tasks: int) -> str | None:
    """One task per worker tries to import psbench on the executors: None if every one did, else
    one line naming where it failed and how to ship it."""
    def probe(_: Any) -> list[str]:  # defined here: pickled by value, so it needs no psbench to run
        import importlib.util
        import os
        import socket
        import sys
        if importlib.util.find_spec("psbench") is not None:
            return []
        return [f"{socket.gethostname()} (python {sys.executable}, PYTHONPATH={os.environ.get('PYTHONPATH', '')})"]

    failed = sc.parallelize(range(tasks), tasks).flatMap(probe).collect()
    if failed:
        return f"the executors cannot import psbench: {failed[0]}; {SHIP_HINT}"
    return None


def submitted_conf() -> dict[str, str]:
    """spark-submit's settings for this job, read from its JVM before any session connects."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def open_session(conf: dict[str, str], workers: int, barrier_timeout_s: int) -> Any:
    """The job's session: spark-submit's settings, plus psbench's run settings where it set none."""
    from pyspark.sql import SparkSession

    from psbench.systems.spark.session import run_settings

    builder = SparkSession.builder
    for key, value in run_settings(workers, barrier_timeout_s).items():
        if key not in conf:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(argv: Sequence[str]) -> int:
    from psbench.bench.cli import main as cli_main
    from psbench.systems.spark.session import check_submitted_exposure, use_submitted_session

    args, options = parse_job_args(argv)
    conf = submitted_conf()
    check_submitted_exposure(conf, options.insecure)
    start = time.perf_counter()
    spark = open_session(conf, args.workers, getattr(options, "barrier_timeout_s", 300))
    try:
        reason = executor_import_error(spark.sparkContext, args.workers)
        if reason:
            raise ConfigError(reason)
        use_submitted_session(spark, time.perf_counter() - start)  # executors up: as get_session's start
        return cli_main(["run", *argv, "--spark-master", spark.sparkContext.master])
    finally:
        use_submitted_session(None)
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"psbench: error: {exc}", file=sys.stderr)
        return 2
