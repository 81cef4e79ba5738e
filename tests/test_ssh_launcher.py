"""The ssh launcher executes: a cluster file with launcher = "ssh" runs a PS job (a server host, two
worker hosts) through sshd in network-namespace hosts, launched from a fourth host, and the
records travel back by scp into one run folder, the job's token never in any process's command line
on the way. --dry-run keeps only printing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psbench.bench.lab import netlab, sshlab
from psbench.bench.lab.netlab import NetLab
from psbench.bench.lab.sshlab import SshLab
from psbench.core.tables import read_table
from secret_helpers import watch_cmdlines

REASON = netlab.unavailable_reason() or sshlab.unavailable_reason()
# slow: sshd hosts in namespaces (the first test 14 s in CI): `make test-slow` (CI runs it), keeping `make test` under 12 min
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.skipif(REASON is not None, reason=f"ssh lab: {REASON}")]
ROOT = Path(__file__).resolve().parent.parent
ROLES = ("ps-server", "ps-worker", "ps-fetch")  # every remote role's command line was scanned


def ssh_cluster_file(path: Path, lab: NetLab, config: Path, steps: int) -> Path:
    from psbench.bench.lab.hosts_figures import ps_file

    path.write_text(ps_file("ssh", [lab.addr(h) for h in (1, 2, 3)], str(config), steps))
    return path


def remote_processes(lab: NetLab, hosts: range) -> list[str]:
    """psbench processes still alive in the given hosts' namespaces (sshd itself excluded)."""
    left = []
    for h in hosts:
        for pid in netlab.namespace_pids(lab.ns(h)):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "psbench" in cmd and "sshd" not in cmd:
                left.append(cmd)
    return left


def test_ssh_launcher_runs_a_ps_job_on_sshd_hosts_and_copies_the_records_back(tmp_path: Path):
    results = tmp_path / "results"
    with NetLab(hosts=4) as lab, SshLab(lab, hosts=[1, 2, 3]) as ssh:
        path = ssh_cluster_file(tmp_path / "cluster.toml", lab, ssh.kit.config, steps=40)
        # the launcher runs on host 0, which has no sshd and reaches the others only over the lab
        dry = lab.run(0, [sys.executable, "-m", "psbench", "run", "--cluster", str(path), "--dry-run"], timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.count(f"-F {ssh.kit.config}") == 4 and not list(results.glob("*"))
        proc = lab.exec(0, [sys.executable, "-m", "psbench", "run", "--cluster", str(path), "--results-dir",
                            str(results), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the launcher makes the job's token; the roles get it in their environment (sent over
        # ssh's stdin): learn it there, and look for it in every command line while the job runs
        watch = watch_cmdlines(proc, env_name="PSBENCH_PS_TOKEN", timeout=300, expect=ROLES,
                               pids=lambda: [p for h in (1, 2, 3) for p in netlab.namespace_pids(lab.ns(h))])
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out[-2000:] + err[-3000:]
        assert len(watch.secrets) == 1 and watch.seen == set(ROLES), watch
        assert watch.leaks == []
        assert len(watch.holders) >= 3  # the server and the workers on their hosts (and their shells)
        assert remote_processes(lab, range(1, 4)) == []   # servers shut down, workers exited
        assert not list(ROOT.glob(".psbench-cluster/*"))  # the hosts' job folders were removed
    (run_dir,) = [p.parent for p in (results / "ps-ssh").glob("*/manifest.json")]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["spec"]["options"]["launcher"] == "ssh"
    hosts = manifest["extra"]["cluster"]["hosts"]
    assert [h["address"] for h in hosts] == [f"198.18.{lab.lab}.{i}" for i in (2, 3, 4)]
    steps = read_table(run_dir, "steps")
    assert steps.groupby("worker")["step"].count().to_dict() == {0: 40, 1: 40}
    assert set(steps["staleness"]) == {0}                       # bsp across the hosts
    val = read_table(run_dir, "evals").query("split == 'val'")["accuracy"].tolist()
    assert len(val) == 2 and val[-1] > val[0] + 0.3             # the final model came back by scp
    assert len(manifest["extra"]["ps"]["shards"]) == 1


def test_a_worker_that_fails_on_an_sshd_host_is_one_line_and_its_log_is_kept(tmp_path: Path):
    """The host's python makes worker1 fail at its step 2: the launcher says `<host> <role>: <first
    cause>` in one line, as a local run does, keeps the role's whole log under the suite's failed/,
    and leaves no run folder, no remote process and no job folder behind."""
    results = tmp_path / "results"
    python = tmp_path / "python"   # the hosts' interpreter: this one, worker 1 told to fail
    python.write_text(f'#!/bin/sh\ncase " $* " in *" ps-worker "*" --worker-id 1 "*) '
                      f'exec {sys.executable} "$@" --fail-at-step 2;; esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    with NetLab(hosts=4) as lab, SshLab(lab, hosts=[1, 2, 3]) as ssh:
        path = ssh_cluster_file(tmp_path / "cluster.toml", lab, ssh.kit.config, steps=40)
        path.write_text(path.read_text().replace(f'python = "{sys.executable}"', f'python = "{python}"'))
        proc = lab.run(0, [sys.executable, "-m", "psbench", "run", "--cluster", str(path), "--results-dir",
                           str(results), "--no-progress"], timeout=300)
        assert remote_processes(lab, range(1, 4)) == []
        assert not list(ROOT.glob(".psbench-cluster/*"))
    (log,) = (results / "ps-ssh" / "failed").glob("*.log")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"psbench: run failed: w2 worker1: injected failure in worker 1 at step 2 (log: {log})"], proc.stderr
    text = log.read_text()
    assert "--- worker1 on w2 (exit code 1), its log:\npsbench: run failed: injected failure in worker 1 at step 2" in text
    assert [p.name for p in (results / "ps-ssh").iterdir()] == ["failed"]


def test_stopping_the_ssh_launcher_stops_the_remote_roles(tmp_path: Path):
    """A guarded role dies with its ssh connection: kill the launcher's ssh, the remote server ends."""
    from psbench.bench.lab.cluster import file as cluster_file
    from psbench.bench.lab.cluster import hosts as cluster_hosts
    from psbench.bench.lab.cluster import roles as cluster_roles

    with NetLab(hosts=2) as lab, SshLab(lab, hosts=[1]) as ssh:
        cf = cluster_file.parse({"launcher": "ssh", "run": {"system": "ps", "workload": "mlp-digits"},
                            "ssh": {"config": str(ssh.kit.config), "workdir": "/"},
                            "hosts": [{"name": "a", "address": lab.addr(1), "roles": ["ps-server", "worker"]}]})
        role = cluster_roles.PlannedRole("sleeper", 0, ["sleep", "300"], "server")
        proc = lab.exec(0, cluster_hosts.ssh_argv(cf, role, guard=True), stdin=subprocess.PIPE)
        for _ in range(100):
            if any("sleep 300" in c for c in _cmdlines(lab, 1)):
                break
            subprocess.run(["sleep", "0.1"])
        assert any("sleep 300" in c for c in _cmdlines(lab, 1))
        proc.kill()
        proc.wait()
        for _ in range(50):
            if not any("sleep 300" in c for c in _cmdlines(lab, 1)):
                break
            subprocess.run(["sleep", "0.1"])
        assert not any("sleep 300" in c for c in _cmdlines(lab, 1))


def _cmdlines(lab: NetLab, host: int) -> list[str]:
    out = []
    for pid in netlab.namespace_pids(lab.ns(host)):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return out
