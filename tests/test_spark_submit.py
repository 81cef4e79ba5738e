"""deploy/spark/psbench_job.py, the file a Spark user hands to spark-submit: its arguments, its
one-line refusals (an unauthenticated session beyond loopback, flags that are spark-submit's,
executors that cannot import psbench) without a JVM; and, in `make test-slow`, spark-submit (the
pyspark wheel's own) submits it for spark-mllib and spark-barrier with 2 workers to a standalone
cluster (a master and two workers on loopback, authenticated), whose run folders read back with a
local run's columns."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from psbench.bench import spark_submit
from psbench.core.errors import ConfigError
from psbench.systems.spark import session
from psbench.systems.spark.session import check_submitted_exposure

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "deploy" / "spark" / "psbench_job.py"
BASE = ["--workload", "mlp-digits", "--workers", "2", "--results-dir", "out"]


@pytest.mark.parametrize("argv, says", [
    (["--system", "ps", *BASE], "not a Spark system"),
    (["--system", "spark-mllib", "--workload", "mlp-digits", "--workers", "2"], "give --results-dir"),
    (["--system", "spark-mllib", *BASE, "--spark-master", "local[2]"], "give spark-submit --master"),
    (["--system", "spark-barrier", *BASE, "--driver-host", "10.0.0.1"], "spark.driver.host"),
    (["--system", "spark-mllib", *BASE, "--spark-conf", "spark.x=1"], "--conf spark.key=value"),
    (["--config", "bench/experiments/systems.toml", "--results-dir", "out"], "runs one run"),
    (["--system", "spark-mllib", *BASE, "--servers", "2"], "does not apply"),
])
def test_job_arguments_refused_in_one_line(argv: list[str], says: str):
    with pytest.raises(ConfigError) as err:
        spark_submit.parse_job_args(argv)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_job_arguments_are_psbench_runs():
    args, options = spark_submit.parse_job_args(["--system", "spark-barrier", *BASE, "--seed", "3", "--max-steps", "5",
                                                 "--insecure", "true"])
    assert (args.system, args.workers, args.seed, args.max_steps, str(args.results_dir)) == \
        ("spark-barrier", 2, 3, 5, "out")
    assert options.insecure is True


@pytest.mark.parametrize("conf, insecure, refused", [
    ({"spark.master": "spark://10.0.0.1:7077"}, False, "spark://10.0.0.1:7077"),
    ({"spark.master": "yarn"}, False, "yarn"),
    ({"spark.master": "k8s://https://10.0.0.1:6443"}, False, "k8s"),
    ({"spark.master": "local[2]", "spark.driver.bindAddress": "0.0.0.0"}, False, "driver"),
    ({"spark.master": "spark://127.0.0.1:7077", "spark.driver.host": "10.0.0.2"}, False, "driver"),
    ({"spark.master": "spark://10.0.0.1:7077", "spark.authenticate": "true", "spark.driver.host": "10.0.0.2"}, False, None),
    ({"spark.master": "spark://10.0.0.1:7077"}, True, None),
    ({"spark.master": "spark://127.0.0.1:7077,127.0.0.2:7077", "spark.driver.host": "127.0.0.1"}, False, None),
    ({"spark.master": "local[2]", "spark.driver.host": "127.0.0.1"}, False, None),
    ({"spark.master": "local[2]"}, False, "the machine's host name"),   # Spark's default driver address
])
def test_a_submitted_session_beyond_loopback_is_authenticated_or_refused(conf, insecure, refused):
    if refused is None:
        check_submitted_exposure(conf, insecure)
        return
    with pytest.raises(ConfigError) as err:
        check_submitted_exposure(conf, insecure)
    assert refused in str(err.value) and "spark.authenticate=true" in str(err.value) and "\n" not in str(err.value)


class FakeContext:
    """parallelize(...).flatMap(f).collect() run here, with `find_spec` of psbench answered by `importable`."""

    def __init__(self, importable: bool):
        self.importable = importable

    def parallelize(self, data, slices):
        items = list(data)
        assert slices == len(items)
        return SimpleNamespace(flatMap=lambda f: SimpleNamespace(collect=lambda: self._run(f, items)))

    def _run(self, f, items):
        import importlib.util

        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: (real(name, *a) if self.importable or name != "psbench" else None)
        try:
            return [out for item in items for out in f(item)]
        finally:
            importlib.util.find_spec = real


def test_executors_that_cannot_import_psbench_are_one_line():
    assert spark_submit.executor_import_error(FakeContext(importable=True), 2) is None
    line = spark_submit.executor_import_error(FakeContext(importable=False), 2)
    assert line.startswith("the executors cannot import psbench: ") and "pip install psbench" in line
    assert "spark.executorEnv.PYTHONPATH" in line and "\n" not in line


def test_the_job_refuses_before_any_session(monkeypatch, capsys):
    """An unauthenticated master beyond loopback: exit 2, one line, no session opened."""
    monkeypatch.setattr(spark_submit, "submitted_conf", lambda: {"spark.master": "spark://10.0.0.1:7077"})
    monkeypatch.setattr(spark_submit, "open_session", lambda *a: pytest.fail("a session was opened"))
    assert spark_submit.main(["--system", "spark-mllib", *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("psbench: error: the submitted job's master spark://10.0.0.1:7077")


def test_the_job_stops_when_executors_cannot_import_psbench(monkeypatch, capsys):
    stopped = []
    spark = SimpleNamespace(sparkContext=FakeContext(importable=False), stop=lambda: stopped.append(True))
    monkeypatch.setattr(spark_submit, "submitted_conf", lambda: {"spark.master": "local[2]", "spark.driver.host": "127.0.0.1"})
    monkeypatch.setattr(spark_submit, "open_session", lambda *a: spark)
    assert spark_submit.main(["--system", "spark-mllib", *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the executors cannot import psbench" in err[0]
    assert stopped == [True] and session.submitted_session() is None


def test_the_job_file_without_psbench_is_one_line(tmp_path: Path):
    """The driver's Python without psbench on its path (no site-packages: -S, no PYTHONPATH, another
    folder): one line, exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", str(JOB)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "the driver cannot import psbench" in done.stderr


def test_a_submitted_session_is_the_one_runs_use_and_a_second_master_is_refused():
    """get_session hands every run the submitted session on its master (its start recorded once,
    reused after); another master would need a second session: one line."""
    sc = SimpleNamespace(master="spark://127.0.0.1:7077")
    spark = SimpleNamespace(sparkContext=sc)
    session.use_submitted_session(spark, 2.5)
    try:
        first, then = (session.get_session("spark://127.0.0.1:7077", 2) for _ in range(2))
        assert first.spark is spark and (first.reused, first.start_s) == (False, 2.5)
        assert then.spark is spark and (then.reused, then.start_s) == (True, 0.0)
        with pytest.raises(ConfigError, match="runs on spark://127.0.0.1:7077; a run on local\\[2\\]"):
            session.get_session("local[2]", 2)
        assert not session.SparkSystem.calibrates_here()
    finally:
        session.use_submitted_session(None)
    assert session.SparkSystem.calibrates_here()


JOB_ARGS = ["--workload", "mlp-digits", "--workers", "2", "--max-steps", "12", "--emulate-device", "step_ms=20",
            "--no-progress"]


@pytest.mark.slow   # ~1.5 min: two spark-submit jobs
@pytest.mark.spark
@pytest.mark.skipif(session.pyspark_unavailable_reason() is not None, reason=f"{session.pyspark_unavailable_reason()}")
def test_spark_submit_runs_spark_mllib_and_spark_barrier_on_a_standalone_cluster(tmp_path: Path):
    """spark-submit (pyspark's bin/spark-submit) of the job file to a master and two workers on
    loopback, authenticated by the cluster's secret in a properties file (never on a command line):
    each run folder reads back with a local run's columns, its spec passes the schema, its manifest
    says the session was spark-submit's."""
    from psbench.bench.harness.results import load_suite
    from psbench.bench.harness.schema import check_spec
    from psbench.bench.lab.cluster.hosts import LocalHosts
    from psbench.bench.lab.spark_cluster import SparkCluster
    from psbench.core.tables import read_table
    from psbench.systems.common import child_env
    from secret_helpers import watch_cmdlines
    from suite_helpers import assert_local_columns, recorded_locally

    results = tmp_path / "results"
    env = child_env({"PYSPARK_PYTHON": sys.executable})
    with SparkCluster(LocalHosts(3), master=0, workers=[1, 2], cores=1) as sc:
        for system in ("spark-mllib", "spark-barrier"):
            argv = sc.submit_argv("127.0.0.1", tmp_path, ["--system", system, *JOB_ARGS, "--results-dir", str(results),
                                                          "--suite", "submitted"], {"spark.executor.memory": "512m"})
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            watch = watch_cmdlines(proc, {sc.token}, expect=("SparkSubmit", "CoarseGrainedExecutorBackend"), timeout=300)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
            assert watch.leaks == [] and watch.seen == {"SparkSubmit", "CoarseGrainedExecutorBackend"}, watch
    submitted, here = load_suite(results / "submitted"), recorded_locally(results, "spark-mllib")
    assert sorted(submitted.runs["system"]) == ["spark-barrier", "spark-mllib"]
    assert_local_columns(submitted, here)
    for run_id, manifest in submitted.manifests.items():
        check_spec(manifest["spec"], f"{run_id}/manifest.json", "spec.")
        extra = manifest["extra"]
        assert extra["spark_submitted"] is True and extra["spark_master"] == sc.url, run_id
        assert extra["spark_auth"] == "token" and extra["spark_network_crypto"] is True, run_id
        assert extra["spark_session_reused"] is False and extra["spark_session_start_s"] > 0, run_id
        steps = read_table(results / "submitted" / run_id, "steps")
        assert steps.groupby("worker")["step"].count().to_dict() == {0: 12, 1: 12}, run_id
        assert steps["loss"].notna().all(), run_id
