"""Spark standalone across hosts: a master and two workers (Spark's own daemons) on network-namespace
hosts, the driver on a third host; spark-mllib, spark-barrier and spark-torch (local_mode=false:
the DDP ranks run in the executors, on the worker hosts) each train and write a run folder. An
executor killed mid-run ends the run with one clear error, never a hang. Also on loopback."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from psbench.bench.lab import netlab
from psbench.bench.lab.cluster import LocalHosts, NetnsHosts
from psbench.bench.lab.netlab import NetLab
from psbench.bench.lab.spark_cluster import SparkCluster
from psbench.core.tables import read_table
from psbench.systems.common import child_env
from psbench.systems.spark.session import pyspark_unavailable_reason

REASON = netlab.unavailable_reason() or pyspark_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.spark,
              pytest.mark.skipif(REASON is not None, reason=f"spark standalone on netns: {REASON}")]

DRIVER = 3
RUNS = [("spark-mllib", []), ("spark-barrier", []), ("spark-torch", ["--local-mode", "false"])]
# One driver process runs the systems in turn (the session, started once, is reused).
DRIVER_SCRIPT = """
import sys
from psbench.bench.cli import main
runs = [("spark-mllib", []), ("spark-barrier", []), ("spark-torch", ["--local-mode", "false"])]
for system, extra in runs:
    if system in sys.argv[1].split(","):
        rc = main(["run", "--system", system, *extra, *sys.argv[2:]])
        if rc:
            sys.exit(rc)
"""


def driver_argv(sc: SparkCluster, driver_addr: str, systems: str, results: Path, steps: int) -> list[str]:
    return [sys.executable, "-c", DRIVER_SCRIPT, systems, "--workload", "mlp-digits", "-np", "2",
            "--max-steps", str(steps), "--emulate-device", "step_ms=20", *sc.driver_args(driver_addr),
            "--spark-conf", "spark.executor.memory=512m", "--results-dir", str(results), "--suite", "standalone",
            "--no-progress", "--no-resume"]


@pytest.fixture(scope="module")
def cluster():
    with NetLab(hosts=4) as lab, \
            SparkCluster(NetnsHosts(lab=lab), master=0, workers=[1, 2], interface="veth0") as sc:
        yield lab, sc


def test_three_spark_systems_train_on_a_standalone_cluster_across_hosts(cluster, tmp_path: Path):
    lab, sc = cluster
    assert sc.url == f"spark://{lab.addr(0)}:7077"
    results = tmp_path / "results"
    run = lab.run(DRIVER, driver_argv(sc, lab.addr(DRIVER), "spark-mllib,spark-barrier,spark-torch", results, 12),
                  timeout=300, env=child_env(sc.driver_env()))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    manifests = {json.loads(p.read_text())["spec"]["system"]: p.parent
                 for p in (results / "standalone").glob("*/manifest.json")}
    assert sorted(manifests) == ["spark-barrier", "spark-mllib", "spark-torch"]
    for system, run_dir in manifests.items():
        extra = json.loads((run_dir / "manifest.json").read_text())["extra"]
        assert extra["spark_master"] == sc.url and extra["spark_driver"] == lab.addr(DRIVER), system
        assert extra["spark_auth"] == "token", system
        steps = read_table(run_dir, "steps")
        assert steps.groupby("worker")["step"].count().to_dict() == {0: 12, 1: 12}, system
        assert steps["loss"].notna().all(), system
    assert json.loads((manifests["spark-torch"] / "manifest.json").read_text())["extra"]["torch_local_mode"] is False
    # the executors ran on the worker hosts (their work folders hold the app's executor logs)
    assert len(list(sc.dir.glob("worker*/app-*/*/stderr"))) >= 2


def test_an_executor_killed_mid_run_is_one_clear_error_not_a_hang(cluster, tmp_path: Path):
    lab, sc = cluster
    proc = lab.exec(DRIVER, driver_argv(sc, lab.addr(DRIVER), "spark-barrier", tmp_path / "r", 3000),
                    env=child_env(sc.driver_env()), stdout=__import__("subprocess").PIPE,
                    stderr=__import__("subprocess").PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(sc.executor_pids()) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(sc.executor_pids()) == 2, "the executors did not start"
    time.sleep(8)                                 # the barrier stage is training by now
    assert proc.poll() is None, "the run ended before the executor could be killed"
    victim = sc.executor_pids()[0]
    import os
    import signal

    os.kill(victim, signal.SIGKILL)
    t_kill = time.monotonic()
    out, err = proc.communicate(timeout=150)      # a hang fails here
    waited = time.monotonic() - t_kill
    print(f"\nexecutor killed; the driver ended {waited:.1f}s later: {err.strip().splitlines()[-1:]}")
    assert proc.returncode == 1, out[-1000:] + err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("psbench: run failed:")]
    assert len(lines) == 1, err[-2000:]
    assert not list((tmp_path / "r").glob("*/*/manifest.json"))   # nothing half-written


def test_standalone_cluster_on_loopback(tmp_path: Path):
    """The same cluster on 127.0.0.1: the driver stays in this namespace, everything on loopback."""
    from psbench.bench.cli import main

    with SparkCluster(LocalHosts(3), master=0, workers=[1, 2]) as sc:
        assert sc.url.startswith("spark://127.0.0.1:")
        import subprocess

        run = subprocess.run(driver_argv(sc, "127.0.0.1", "spark-mllib", tmp_path / "results", 8),
                             env=child_env(sc.driver_env()), capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
    (manifest,) = (tmp_path / "results" / "standalone").glob("*/manifest.json")
    extra = json.loads(manifest.read_text())["extra"]
    assert extra["spark_master"] == sc.url
    assert main is not None
