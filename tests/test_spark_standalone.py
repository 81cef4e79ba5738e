"""Spark standalone across hosts: a master and two workers (Spark's own daemons) on network-namespace
hosts, the driver on a third host; spark-mllib, spark-barrier and spark-torch (local_mode=false:
the DDP ranks run in the executors, on the worker hosts) each train and write a run folder. An
executor killed mid-run ends the run with one clear error, never a trace or a hang: inside a
barrier job, inside a collect (spark-mllib's treeAggregate), between two jobs. Also on loopback.
The cluster's authentication secret is in no process's command line while they run.

The kill points are exact: the option `hold` pauses the run at a point (a task inside a step's
job, or the driver between jobs) and creates a marker file; the test kills an executor once the
marker is there."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psbench.bench.lab import netlab
from psbench.bench.lab.cluster.hosts import LocalHosts, NetnsHosts
from psbench.bench.lab.netlab import NetLab
from psbench.bench.lab.spark_cluster import SparkCluster
from psbench.core.tables import read_table
from psbench.systems.common import child_env
from psbench.systems.spark.session import pyspark_unavailable_reason
from secret_helpers import watch_cmdlines

REASON = netlab.unavailable_reason() or pyspark_unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.spark,  # ~3.5 min: `make test-slow`
              pytest.mark.skipif(REASON is not None, reason=f"spark standalone on netns: {REASON}")]

DRIVER = 3
KILL_BOUND_S = 60  # from an executor's kill to the driver's exit, at most (a hang fails the test)
# every process that takes the secret was scanned: master, worker, executor, the driver's JVM
SPARK_PROCESSES = ("deploy.master.Master", "deploy.worker.Worker", "CoarseGrainedExecutorBackend", "SparkSubmit")
# One driver process runs the given systems in turn (the session, started once, is reused): each is
# "system", "system:max_steps" or "system:max_steps:hold" (the option hold, see the module's text).
DRIVER_SCRIPT = """
import sys
from psbench.bench.cli import main
extra = {"spark-torch": ["--local-mode", "false"]}
for item in sys.argv[1].split(","):
    system, _, rest = item.partition(":")
    steps, _, hold = rest.partition(":")
    long = ["--epochs", "1000"] if steps else []   # enough epochs that max_steps is the limit
    rc = main(["run", "--system", system, *extra.get(system, []), *(["--hold", hold] if hold else []),
               *sys.argv[2:], "--max-steps", steps or "12", *long])
    if rc:
        sys.exit(rc)
"""


def driver_argv(sc: SparkCluster, driver_addr: str, runs: str, results: Path) -> list[str]:
    return [sys.executable, "-c", DRIVER_SCRIPT, runs, "--workload", "mlp-digits", "-np", "2",
            "--emulate-device", "step_ms=20", *sc.driver_args(driver_addr),
            "--spark-conf", "spark.executor.memory=512m", "--results-dir", str(results), "--suite", "standalone",
            "--no-progress", "--no-resume"]


def kill_at_marker(sc: SparkCluster, proc: subprocess.Popen, marker: Path, wait_s: float) -> tuple[str, str, float]:
    """Once the run's hold has created `marker`, SIGKILL one executor JVM of the run; the driver's
    (stdout, stderr) and the seconds from the kill to its exit (it must exit within KILL_BOUND_S)."""
    deadline = time.monotonic() + wait_s
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    executors = sc.executor_pids()
    assert marker.exists() and executors and proc.poll() is None, \
        f"the run did not reach its hold ({proc.poll()}): {proc.stderr.read()[-3000:] if proc.poll() is not None else ''}"
    os.kill(executors[0], signal.SIGKILL)
    t_kill = time.monotonic()
    try:
        out, err = proc.communicate(timeout=KILL_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the driver hung: still running {KILL_BOUND_S}s after the executor's kill:\n{err[-3000:]}")
    return out, err, time.monotonic() - t_kill


def assert_one_line_failure(returncode: int, out: str, err: str, results: Path) -> None:
    """Exit 1, exactly one `psbench: run failed:` line naming the lost executor, no Python or Java
    stack trace on the console, and the whole story in the run's failure log."""
    assert returncode == 1, out[-1000:] + err[-2000:]
    failed = [line for line in err.splitlines() if line.startswith("psbench: run failed:")]
    assert len(failed) == 1, err[-3000:]
    assert "Traceback" not in err and not re.search(r"^\s+at [\w.$]+\(", err, re.M), err[-3000:]
    assert "executor" in failed[0] and "lost" in failed[0], failed[0]
    (log,) = (results / "standalone" / "failed").glob("*.log")
    assert f"(log: {log})" in failed[0] and "Traceback" in log.read_text()


def manifests(results: Path) -> dict[str, Path]:
    return {json.loads(p.read_text())["spec"]["system"]: p.parent for p in (results / "standalone").glob("*/manifest.json")}


def test_spark_systems_train_on_a_standalone_cluster_across_hosts_and_an_executor_loss_is_one_clear_error(tmp_path: Path):
    """Three systems train; then, during a long spark-barrier run, one executor JVM is killed: the
    driver ends with one `psbench: run failed:` line (task failures are not retried: maxFailures=1),
    within a bound, and writes no run folder for it."""
    results = tmp_path / "results"
    with NetLab(hosts=4) as lab, \
            SparkCluster(NetnsHosts(lab=lab), master=0, workers=[1, 2], interface="veth0") as sc:
        assert sc.url == f"spark://{lab.addr(0)}:7077"
        marker = tmp_path / "barrier-hold"
        runs = f"spark-mllib,spark-barrier,spark-torch,spark-barrier:5000:task:20:{marker}"
        proc = lab.exec(DRIVER, driver_argv(sc, lab.addr(DRIVER), runs, results), env=child_env(sc.driver_env()),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watch = watch_cmdlines(proc, {sc.token}, expect=SPARK_PROCESSES, timeout=400, every_s=0.5,
                               until=lambda: len(manifests(results)) >= 3)
        assert proc.poll() is None and len(manifests(results)) == 3, proc.stderr.read()[-3000:] if proc.poll() else ""
        assert watch.leaks == [] and watch.seen == set(SPARK_PROCESSES), watch
        # inside a job: the long barrier run's last task pauses at step 20, its peer waits in allGather
        out, err, waited = kill_at_marker(sc, proc, marker, wait_s=120)
        assert sc.dir is not None
        executor_logs = list(sc.dir.glob("worker*/app-*/*/stderr"))
    print(f"\nexecutor killed; the driver ended {waited:.1f}s later: {err.strip().splitlines()[-1:]}")
    assert_one_line_failure(proc.returncode, out, err, results)
    found = manifests(results)
    assert sorted(found) == ["spark-barrier", "spark-mllib", "spark-torch"]   # none for the killed run
    for system, run_dir in found.items():
        extra = json.loads((run_dir / "manifest.json").read_text())["extra"]
        assert extra["spark_master"] == sc.url and extra["spark_driver"] == lab.addr(DRIVER), system
        assert extra["spark_auth"] == "token" and extra["spark_network_crypto"] is True, system
        steps = read_table(run_dir, "steps")
        assert steps.groupby("worker")["step"].count().to_dict() == {0: 12, 1: 12}, system
        assert steps["loss"].notna().all(), system
    assert json.loads((found["spark-torch"] / "manifest.json").read_text())["extra"]["torch_local_mode"] is False
    assert len(executor_logs) >= 2   # the executors ran on the two worker hosts, in their own folders


@pytest.mark.parametrize("point", ["task", "driver"])
def test_an_executor_lost_inside_a_collect_or_between_jobs_is_one_clear_error(point: str, tmp_path: Path):
    """spark-mllib (one job per step) on a loopback cluster of two workers: an executor killed while
    the driver waits in a step's treeAggregate collect ('task': a task pauses inside the job), or
    while the driver is between two jobs ('driver'), ends the run with one line naming the lost
    executor. Spark alone would run the lost tasks again on the other executor and carry on."""
    results, marker = tmp_path / "results", tmp_path / "hold"
    with SparkCluster(LocalHosts(3), master=0, workers=[1, 2], cores=1) as sc:
        proc = subprocess.Popen(driver_argv(sc, "127.0.0.1", f"spark-mllib:200:{point}:4:{marker}", results),
                                env=child_env(sc.driver_env()), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err, waited = kill_at_marker(sc, proc, marker, wait_s=180)
    print(f"\nexecutor killed at the {point} hold; the driver ended {waited:.1f}s later: {err.strip().splitlines()[-1:]}")
    assert_one_line_failure(proc.returncode, out, err, results)
    assert not manifests(results)


def test_standalone_cluster_on_loopback(tmp_path: Path):
    """The same cluster on 127.0.0.1 (one worker, two slots): the driver stays in this namespace.
    The driver starts with no CPU figures, as on a fresh machine (docker's driver): its calibration
    runs spark-mllib in local mode in the same JVM first, with the token set, and the cluster run
    after it must still authenticate with the cluster's secret."""
    with SparkCluster(LocalHosts(2), master=0, workers=[1], cores=2) as sc:
        assert sc.url.startswith("spark://127.0.0.1:")
        env = child_env({**sc.driver_env(), "PSBENCH_CPU_FIGURES": str(tmp_path / "no-figures-yet")})
        run = subprocess.Popen(driver_argv(sc, "127.0.0.1", "spark-mllib:30", tmp_path / "results"),
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watch = watch_cmdlines(run, {sc.token}, expect=SPARK_PROCESSES, timeout=240)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err[-3000:]
        assert watch.leaks == [] and watch.seen == set(SPARK_PROCESSES), watch
    (run_dir,) = manifests(tmp_path / "results").values()
    extra = json.loads((run_dir / "manifest.json").read_text())["extra"]
    assert extra["spark_master"] == sc.url and extra["spark_network_crypto"] is True  # the secret turns it on
    assert len(read_table(run_dir, "steps")) == 60
