"""psbench.bench.lab.compose_job (the finisher of a PS job run elsewhere) and the rule that a server, a Spark
driver or a Spark daemon bound beyond loopback needs a token. The job runs here on loopback as
plain processes (the same commands as docker/docker-compose.yml, no Docker)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from psbench.core.tables import read_table

from psbench.bench.lab.compose_job import Tracker, Watch
from psbench.core.exposure import check_exposure, is_loopback, read_token
from psbench.systems.spark import daemon
from psbench.systems.spark.session import SparkOptions, check_driver_exposure
from psbench.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_tracker_waiting_is_not_silence():
    t = Tracker(n_workers=3, lost_after_s=10)
    # t=100: worker 0 waits on a bsp step since 95, worker 1 last spoke at 95, worker 2 not seen
    s = t.update({"finished": [], "waiting": [0], "idle_s": {"0": 5.0, "1": 5.0}}, now=100.0)
    assert s.lost == set() and s.never_seen == {2}
    # t=106: worker 0 still waiting (quiet from 106 on), worker 1 silent for 11s: lost
    s = t.update({"finished": [], "waiting": [0], "idle_s": {"0": 11.0, "1": 11.0, "2": 0.1}}, now=106.0)
    assert s.lost == {1} and s.never_seen == set()
    # t=112: worker 0's wait ended in an error at ~106 and it exited: quiet 6s, not lost yet
    s = t.update({"finished": [], "waiting": [], "idle_s": {"0": 17.0, "1": 17.0, "2": 0.1}}, now=112.0)
    assert s.lost == {1}
    s = t.update({"finished": [2], "waiting": [], "idle_s": {"0": 22.0, "1": 22.0, "2": 0.1}}, now=117.0)
    assert s.lost == {0, 1} and s.settled(3)


class _Shard:
    """Shard 0's stats as a job with worker 1 silent for 20 s and worker 0 finished shows them."""

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stats(self):
        return [{"finished": [0], "waiting": [], "idle_s": {"0": 0.0, "1": 20.0}}]


@pytest.mark.parametrize("consistency", ["asp", "ssp:1"])
def test_a_lost_worker_fails_the_job_unless_its_loss_is_tolerated(monkeypatch, consistency):
    from psbench.systems.ps import worker

    monkeypatch.setattr(worker, "KVWorker", _Shard)
    with pytest.raises(RuntimeError, match=r"^a lost worker stops the job \(--tolerate-worker-loss finishes without "
                                           r"it\); worker\(s\) \[1\] silent for over 10s$"):
        Watch(["127.0.0.1:1"], 2, consistency.split(":")[0], "t", lost_after_s=10).until_settled()
    state = Watch(["127.0.0.1:1"], 2, consistency.split(":")[0], "t", lost_after_s=10,
                  tolerate_loss=True).until_settled()
    assert state.finished == {0} and state.lost == {1}


def test_is_loopback():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "198.18.0.1", "ps-server", "*", ""))


def test_exposed_server_needs_a_token_or_insecure():
    check_exposure("x", "127.0.0.1", None, False)
    check_exposure("x", "0.0.0.0", "secret", False)
    check_exposure("x", "0.0.0.0", None, True)
    with pytest.raises(ConfigError, match="reachable from other hosts: give a token"):
        check_exposure("x", "0.0.0.0", None, False)


def test_a_token_comes_from_a_file_of_its_owners_or_the_environment(tmp_path, monkeypatch):
    """Never from a command-line value: every local user can read those (ps)."""
    monkeypatch.setenv("PSBENCH_PS_TOKEN", "from-env")
    assert read_token(None) == "from-env"
    path = tmp_path / "token"
    path.write_text("from-file\nignored\n")
    path.chmod(0o600)
    assert read_token(str(path)) == "from-file"
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=f"token file {path} is readable by other users \\(mode 640\\): chmod 600"):
        read_token(str(path))
    path.write_text("\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="is empty"):
        read_token(str(path))
    with pytest.raises(ConfigError, match="No such file"):
        read_token(str(tmp_path / "missing"))
    # the flag that took the token itself is refused, not taken for --token-file (one line, exit 2)
    for args in (["ps-server", "--workers", "1", "--lr", "0.1"],
                 ["ps-worker", "--servers", "127.0.0.1:1", "--worker-id", "0", "--workload", "mlp-digits"]):
        proc = subprocess.run([sys.executable, "-m", "psbench", *args, "--token", "s3cret"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            "psbench: error: --token takes no value on the command line, where any local user can read it (ps): "
            "use --token-file FILE (mode 600) or env PSBENCH_PS_TOKEN"], proc.stderr


def test_ps_server_cli_refuses_a_non_loopback_bind_without_token():
    env = {k: v for k, v in os.environ.items() if k != "PSBENCH_PS_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "psbench", "ps-server", "--bind", "0.0.0.0:0", "--workers", "1",
                           "--workload", "mlp-digits"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "psbench: error: ps-server --bind 0.0.0.0:0 binds 0.0.0.0, which is reachable from other hosts"), proc.stderr


def test_spark_driver_beyond_loopback_needs_a_token():
    opts = SparkOptions(driver_host="spark-driver", driver_bind="0.0.0.0")
    conf = opts.driver_conf(None)
    assert conf["spark.driver.host"] == "spark-driver" and conf["spark.driver.bindAddress"] == "0.0.0.0"
    with pytest.raises(ConfigError, match="PSBENCH_SPARK_TOKEN"):
        check_driver_exposure(conf, insecure=False)
    check_driver_exposure(conf, insecure=True)
    with_token = opts.driver_conf("s3cret")
    # the secret itself never goes into the conf pyspark puts on spark-submit's command line
    assert with_token["spark.authenticate"] == "true" and "s3cret" not in with_token.values()
    # ... and authenticated means encrypted (unless spark_conf says otherwise); no secret, no crypto
    assert with_token["spark.network.crypto.enabled"] == "true" and "spark.network.crypto.enabled" not in conf
    assert SparkOptions(spark_conf="spark.authenticate=true").driver_conf(None)["spark.network.crypto.enabled"] == "true"
    assert SparkOptions(spark_conf="spark.network.crypto.enabled=false").driver_conf("s")[
        "spark.network.crypto.enabled"] == "false"
    check_driver_exposure(with_token, insecure=False)
    check_driver_exposure(SparkOptions().driver_conf(None), insecure=False)  # the default: 127.0.0.1
    # spark_conf still has the last word, and is checked the same way
    overridden = SparkOptions(spark_conf="spark.driver.bindAddress=0.0.0.0").driver_conf(None)
    with pytest.raises(ConfigError):
        check_driver_exposure(overridden, insecure=False)


def test_spark_daemon_command():
    with pytest.raises(ConfigError, match="PSBENCH_SPARK_TOKEN"):
        daemon.command(["worker", "spark://spark-master:7077"], {})
    with pytest.raises(ConfigError, match="one of master, worker"):
        daemon.command(["driver"], {})
    argv, env = daemon.command(["master", "--host", "spark-master", "--port", "7077"], {"PSBENCH_SPARK_TOKEN": "t"})
    assert argv[0].endswith("spark-class") and argv[1:] == [daemon.CLASSES["master"], "--host", "spark-master",
                                                             "--port", "7077"]
    assert env["SPARK_DAEMON_JAVA_OPTS"] == "-Dspark.authenticate=true -Dspark.network.crypto.enabled=true"
    assert env["_SPARK_AUTH_SECRET"] == "t"
    assert not any("t" == a or "secret" in a for a in argv)
    argv, env = daemon.command(["worker", "--insecure", "spark://m:7077"], {})
    assert argv[1:] == [daemon.CLASSES["worker"], "spark://m:7077"] and "SPARK_DAEMON_JAVA_OPTS" not in env
    daemon.command(["master", "--host", "127.0.0.1"], {})  # loopback needs nothing


def test_compose_job_on_loopback(tmp_path):
    """The compose file's PS job as local processes: a server, two workers with ids from the
    server, the finisher; every process exits by itself and one run folder is written."""
    from psbench.systems.common import child_env

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = ["--workers", "2", "--workload", "mlp-digits", "--max-steps", "30", "--seed", "0"]
    scratch, results = tmp_path / "scratch", tmp_path / "results"
    env = child_env({"PSBENCH_PS_TOKEN": "t0k3n"})
    py = [sys.executable, "-m"]
    server = subprocess.Popen(py + ["psbench", "ps-server", "--bind", f"127.0.0.1:{port}", "--workers", "2",
                                    "--workload", "mlp-digits", "--consistency", "asp"], env=env)
    finisher = subprocess.Popen(py + ["psbench", "ps-job", "--servers", f"127.0.0.1:{port}", *job,
                                      "--consistency", "asp", "--scratch", str(scratch), "--results-dir", str(results),
                                      "--suite", "compose"], env=env, stdout=subprocess.PIPE, text=True)
    workers = [subprocess.Popen(py + ["psbench", "ps-worker", "--servers", f"127.0.0.1:{port}", "--worker-id", "auto",
                                      "--init", *job, "--out", f"{scratch}/worker{{worker}}.json"], env=env)
               for _ in range(2)]
    procs = [server, finisher, *workers]
    try:
        out, _ = finisher.communicate(timeout=300)
        assert finisher.returncode == 0
        assert [p.wait(timeout=60) for p in (server, *workers)] == [0, 0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    run = next(results.glob("compose/*/manifest.json")).parent
    assert out.strip().endswith(str(run))
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["spec"]["options"] == {"consistency": "asp", "servers": 1, "launcher": "compose"}
    assert manifest["extra"]["compose"] == {"servers": [f"127.0.0.1:{port}"], "finished": [0, 1], "lost": [],
                                            "auth": "token"}
    steps = read_table(run, "steps")
    assert steps.groupby("worker").size().to_dict() == {0: 30, 1: 30}
    assert manifest["extra"]["ps"]["shards"][0]["applied"] == 60
    assert (run / "shards.json").is_file() and len(read_table(run, "evals")) == 4
    assert list(scratch.iterdir()) == []  # the workers' files and the fetched parameters are cleaned up


def test_ps_job_failure_is_one_line(tmp_path):
    """No worker ever reaches the server: exit 1 and one line naming them (no traceback)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PSBENCH_PS_TOKEN": "t"}
    server = subprocess.Popen([sys.executable, "-m", "psbench", "ps-server", "--bind", f"127.0.0.1:{port}",
                               "--workers", "2", "--workload", "mlp-digits"], env=env)
    try:
        proc = subprocess.run([sys.executable, "-m", "psbench", "ps-job", "--servers", f"127.0.0.1:{port}",
                               "--workers", "2", "--workload", "mlp-digits", "--scratch", str(tmp_path / "s"),
                               "--results-dir", str(tmp_path / "r"), "--startup-timeout-s", "3"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert server.wait(timeout=30) == 0  # told to shut down even though the job failed
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "psbench: run failed: worker(s) [0, 1] never reached the server in 3s (started with --workers 2?)"]
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").rglob("manifest.json"))
