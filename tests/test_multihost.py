"""Cross-host runs: the PS (2 servers, 4 workers) and DDP (3 nodes) on network-namespace hosts, by
hand and from cluster files; the cluster file format on 127.0.0.1; ssh command building."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from psbench.bench.lab import netlab
from psbench.bench.lab.cluster import file as cluster_file
from psbench.bench.lab.cluster import hosts as cluster_hosts
from psbench.bench.lab.cluster import roles as cluster_roles
from psbench.bench.lab.cluster import run as cluster_run
from psbench.bench.lab.netlab import NetLab, Role
from psbench.core.errors import ConfigError
from psbench.core.tables import read_table

REASON = netlab.unavailable_reason()
PY = sys.executable


def lab_namespaces(lab: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"psb-{lab}-")]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(tmp_path: Path, text: str, name: str = "cluster.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---- by hand: NetLab.run_cluster with psbench role commands ------------------------------------

@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
def test_ps_two_servers_four_workers_on_six_hosts_by_hand(tmp_path: Path):
    """Each server and worker in its own namespace host; workers reach the shards only by their
    198.18 addresses. BSP makes the four workers really train together (every step waits for all)."""
    steps, port = 60, 7000
    # servers bound beyond loopback require a shared token (in every role's environment)
    common = ["--workload", "mlp-digits", "--workers", "4"]
    token = {"PSBENCH_PS_TOKEN": "multihost-test"}
    with NetLab(hosts=6) as lab:
        lab_id = lab.lab
        roles = [Role(f"server{j}", j, [PY, "-m", "psbench", "ps-server", "--bind", f"{{h{j}}}:{port}", "--shard-id",
                                         str(j), "--servers", "2", "--consistency", "bsp", *common],
                      daemon=True, ready_port=port, env=token) for j in range(2)]
        servers = f"{{h0}}:{port},{{h1}}:{port}"
        roles += [Role(f"worker{k}", 2 + k, [PY, "-m", "psbench", "ps-worker", "--servers", servers, "--worker-id", str(k),
                                              *common, "--max-steps", str(steps), "--init",
                                              "--out", str(tmp_path / f"w{k}.json")], env=token) for k in range(4)]
        results = lab.run_cluster(roles, timeout=240)
        assert len(lab_namespaces(lab_id)) == 7
    assert lab_namespaces(lab_id) == []
    for k in range(4):
        r = results[f"worker{k}"]
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads((tmp_path / f"w{k}.json").read_text())
        rows = out["rows"]
        assert out["worker"] == k and rows["step"] == list(range(steps))
        assert set(rows["staleness"]) == {0}                 # BSP: every update on fresh parameters
        assert min(rows["bytes"]) > 0
        first, last = np.mean(rows["loss"][:5]), np.mean(rows["loss"][-5:])
        assert last < 0.75 * first, f"worker {k}: loss {first:.3f} -> {last:.3f}"
    for j in range(2):  # servers were running until the workers finished, then stopped
        assert results[f"server{j}"].returncode is None


# ---- cluster files ------------------------------------------------------------------------------

@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
def test_ddp_cluster_file_three_namespace_hosts(tmp_path: Path, results_dir: Path):
    path = write(tmp_path, """
        launcher = "netns"
        suite = "multihost"
        port = 29500
        [run]
        system = "ddp"
        workload = "mlp-digits"
        max_steps = 60
        [run.options]
        insecure = true
        [[hosts]]
        name = "n0"
        roles = ["worker"]
        [[hosts]]
        name = "n1"
        roles = ["worker"]
        cap_mbit = 200
        [[hosts]]
        name = "n2"
        roles = ["worker"]
    """)
    before = set(netlab.list_namespaces())
    result = cluster_run.run_file(cluster_file.load(path), results_dir)
    assert set(netlab.list_namespaces()) <= before          # the lab is gone (another's may end meanwhile)
    run_dir = results_dir / "multihost" / result.run_id
    manifest = json.loads((run_dir / "manifest.json").read_text())
    hosts = manifest["extra"]["cluster"]["hosts"]
    assert [h["address"].startswith("198.18.") for h in hosts] == [True] * 3
    assert manifest["spec"]["options"] == {"insecure": True, "launcher": "netns", "caps": "n1=200"}
    steps = read_table(run_dir, "steps")
    assert steps.groupby("worker")["step"].count().to_dict() == {0: 60, 1: 60, 2: 60}
    evals = read_table(run_dir, "evals")
    assert evals[evals.split == "val"]["accuracy"].iloc[-1] > 0.7
    assert result.summary["samples_per_s"] > 0


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
def test_failing_role_fails_the_run_and_removes_the_lab(tmp_path: Path, results_dir: Path, monkeypatch):
    monkeypatch.setenv("PSBENCH_INJECT_FAULT", "1:3")   # rank 1 raises at its step 3
    path = write(tmp_path, """
        launcher = "netns"
        [run]
        system = "ddp"
        workload = "mlp-digits"
        max_steps = 30
        [run.options]
        insecure = true
        [[hosts]]
        roles = ["worker"]
        [[hosts]]
        roles = ["worker"]
        [[hosts]]
        roles = ["worker"]
    """)
    before = set(netlab.list_namespaces())
    with pytest.raises(RuntimeError, match=r"^h1 node1: ddp worker rank 1 failed: RuntimeError: injected fault at "
                                           r"step 3 \(PSBENCH_INJECT_FAULT\) \(log: \S*/cluster/failed/[^/]*\.log\)$") as failed:
        cluster_run.run_file(cluster_file.load(path), results_dir)
    kept = Path(failed.value.args[0].rpartition("(log: ")[2][:-1]).read_text()
    # node1's log, then the traceback chain its own `psbench run` kept (in a folder removed since)
    assert "--- node1 on h1 (exit code 1), its log:" in kept and "\n--- ddp-mlp-digits-w3-s0-" in kept
    assert kept.count("Traceback (most recent call last)") >= 2
    assert set(netlab.list_namespaces()) <= before  # nothing of this lab is left (another lab may end meanwhile)
    assert not (results_dir / "cluster").exists() or not any((results_dir / "cluster").glob("*/manifest.json"))


def loopback_ps_file(tmp_path: Path, suite: str, max_steps: int, roles_of_a: list[str], options: str = "") -> Path:
    """A PS cluster file on 127.0.0.1: host a with `roles_of_a`, host b with one worker."""
    return write(tmp_path, f"""
        launcher = "local"
        suite = "{suite}"
        port = {free_port()}
        [run]
        system = "ps"
        workload = "mlp-digits"
        max_steps = {max_steps}
        [run.options]
        {options}
        [[hosts]]
        name = "a"
        roles = {json.dumps(roles_of_a)}
        [[hosts]]
        name = "b"
        roles = ["worker"]
    """)


def test_ps_cluster_file_on_loopback(tmp_path: Path, results_dir: Path):
    """launcher = "local": the same role commands on 127.0.0.1; records merge into one run."""
    path = loopback_ps_file(tmp_path, "local", 40, ["ps-server", "worker"], 'consistency = "bsp"')
    from psbench.bench.cli import main

    assert main(["run", "--cluster", str(path), "--results-dir", str(results_dir)]) == 0
    (run_dir,) = [p.parent for p in (results_dir / "local").glob("*/manifest.json")]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["spec"]["options"] == {"consistency": "bsp", "servers": 1, "launcher": "local", "caps": "none"}
    steps = read_table(run_dir, "steps")
    assert steps.groupby("worker")["step"].count().to_dict() == {0: 40, 1: 40}
    assert (steps["t_wall"] >= 0).all() and steps["t_wall"].max() <= manifest["summary"]["train_s"] + 1e-6
    evals = read_table(run_dir, "evals")
    val = evals[evals.split == "val"]["accuracy"].tolist()
    assert len(val) == 2 and val[-1] > val[0] + 0.3       # the servers' final model was fetched and evaluated
    assert len(manifest["extra"]["ps"]["shards"]) == 1
    # resume: a second call finds the run complete and runs nothing
    assert cluster_run.run_file(cluster_file.load(path), results_dir) is None


def test_a_role_that_fails_on_a_cluster_host_is_one_line_and_its_log_is_kept(tmp_path: Path, results_dir: Path,
                                                                              monkeypatch, capsys):
    """`psbench: run failed: <host> <role>: <first cause>`, as a local run's failure, with the role's
    whole log under the suite's failed/ folder, and no run folder."""
    from psbench.bench.cli import main

    real = cluster_roles._plan_roles

    def worker0_fails(*args, **kwargs):
        roles = real(*args, **kwargs)
        next(r for r in roles if r.name == "worker0").argv += ["--fail-at-step", "1"]
        return roles

    monkeypatch.setattr(cluster_roles, "_plan_roles", worker0_fails)
    path = loopback_ps_file(tmp_path, "c", 20, ["ps-server"])
    assert main(["run", "--cluster", str(path), "--results-dir", str(results_dir), "--no-progress"]) == 1
    (log,) = (results_dir / "c" / "failed").glob("*.log")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"psbench: run failed: b worker0: injected failure in worker 0 at step 1 (log: {log})"
    text = log.read_text()   # the role's own log, whole, after the one line
    assert "--- worker0 on b (exit code 1), its log:\npsbench: run failed: injected failure in worker 0 at step 1" in text
    assert [p.name for p in (results_dir / "c").iterdir()] == ["failed"]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client here")
def test_an_ssh_host_that_cannot_be_reached_is_one_line_and_its_log_is_kept(tmp_path: Path, results_dir: Path, capsys):
    """Nothing listens on the host's ssh port: `<host>: ssh to <address> failed: <ssh's own error>`."""
    from psbench.bench.cli import main

    config = tmp_path / "ssh_config"   # a port nothing listens on, and no file of this machine's user read
    config.write_text(f"Host *\n  Port {free_port()}\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n")
    path = write(tmp_path, SSH_HOSTS.format(address="127.0.0.1").replace('"10.1.0.1"', '"127.0.0.1"') +
                 f'[ssh]\nconfig = "{config}"\n')
    assert main(["run", "--cluster", str(path), "--results-dir", str(results_dir), "--no-progress"]) == 1
    (log,) = (results_dir / "cluster" / "failed").glob("*.log")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(rf"psbench: run failed: ps: ssh to 127\.0\.0\.1 failed: ssh: connect to host 127\.0\.0\.1 "
                        rf"port \d+: Connection refused \(log: {re.escape(str(log))}\)", line), line
    assert [p.name for p in (results_dir / "cluster").iterdir()] == ["failed"]


class _Exited:
    """A role's process as _wait polls it: running (None) or exited with a code."""

    def __init__(self, code: int | None):
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


def test_the_role_that_broke_a_collective_is_the_first_cause_not_its_peers(tmp_path: Path, monkeypatch):
    """node0 lost its peer and its log ended first; node1 raised the error that broke the collective:
    node1 is named. With only a peer's loss seen while another role runs, _wait waits for it a while."""
    import os
    import time

    cf = parse('[run.options]\ninsecure = true\n[[hosts]]\nroles = ["worker"]\n[[hosts]]\nroles = ["worker"]\n',
               system="ddp")
    roles = cluster_roles.plan_roles(cf, ["198.18.0.1", "198.18.0.2"], "python", str(tmp_path))
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    logs[0].write_text("psbench: run failed: ddp worker rank 0 failed: RuntimeError: [gloo/pair.cc:537] Read error "
                       "[198.18.0.2]:5032: Connection reset by peer\n")
    logs[1].write_text("psbench: run failed: ddp worker rank 1 failed: RuntimeError: injected fault at step 3\n")
    os.utime(logs[0], (1.0, 1.0))
    deadline = time.monotonic() + 60
    with pytest.raises(cluster_roles.RoleFailed, match=r"^h1 node1: ddp worker rank 1 failed: RuntimeError: injected fault at "
                                                 r"step 3\n--- node1 on h1 \(exit code 1\)") as both:
        cluster_run._wait(cf, [(roles[0], _Exited(1), logs[0]), (roles[1], _Exited(1), logs[1])], [], deadline)
    assert "--- node0 on h0 (exit code 1), its log:" in str(both.value)
    monkeypatch.setattr(cluster_run, "PEERS_FAIL_S", 0.3)
    t0 = time.monotonic()
    with pytest.raises(cluster_roles.RoleFailed, match=r"^h0 node0: ddp worker rank 0 failed: .*Connection reset by peer"):
        cluster_run._wait(cf, [(roles[0], _Exited(1), logs[0]), (roles[1], _Exited(None), logs[1])], [], deadline)
    assert time.monotonic() - t0 >= 0.3


# ---- the file format and the commands it builds (no processes) ----------------------------------

BASE = """
    launcher = "{launcher}"
    [run]
    system = "{system}"
    workload = "mlp-digits"
    max_steps = 5
"""


def parse(text: str, launcher: str = "local", system: str = "ps"):
    import tomllib

    return cluster_file.parse(tomllib.loads(textwrap.dedent(BASE.format(launcher=launcher, system=system)) +
                                       textwrap.dedent(text)))


def test_roles_and_counts_come_from_the_hosts():
    cf = parse("""
        [[hosts]]
        roles = ["ps-server"]
        [[hosts]]
        roles = ["ps-server", "worker"]
        [[hosts]]
        roles = ["worker", "worker"]
    """)
    assert cf.spec.workers == 3 and cf.spec.options["servers"] == 2
    roles = cluster_roles.plan_roles(cf, ["198.18.0.1", "198.18.0.2", "198.18.0.3"], "python", "/s", "tok")
    assert [(r.name, r.host, r.stage) for r in roles] == [
        ("ps-server0", 0, "server"), ("ps-server1", 1, "server"), ("worker0", 1, "worker"),
        ("worker1", 2, "worker"), ("worker2", 2, "worker"), ("ps-fetch", 1, "finish")]
    assert roles[1].argv[roles[1].argv.index("--bind") + 1] == "198.18.0.2:29501"
    assert "198.18.0.1:29500,198.18.0.2:29501" in roles[2].argv
    assert all(r.env == {"PSBENCH_PS_TOKEN": "tok"} for r in roles)   # the token never in argv
    assert all("tok" not in r.argv for r in roles)


@pytest.mark.parametrize("launcher, backend", [("local", "LocalHosts"), ("netns", "NetnsHosts"), ("ssh", "SshHosts")])
def test_every_launcher_is_a_hosts_backend(launcher: str, backend: str):
    """The runner sees only the Hosts interface: each launcher's backend implements all of it (an
    abstract method left out could not be built); only ssh's roles neither share this file system
    nor run this interpreter."""
    address = '\naddress = "10.1.0.1"' if launcher == "ssh" else ""
    cf = parse(f'[[hosts]]{address}\nroles = ["ps-server", "worker"]\n', launcher=launcher)
    hosts = cluster_hosts.hosts_for(cf, "job")
    assert isinstance(hosts, cluster_hosts.Hosts) and type(hosts).__name__ == backend
    local = Path("/tmp/x")
    shared = launcher != "ssh"
    assert (hosts.scratch(local) == str(local)) == shared and (hosts.python == sys.executable) == shared
    if launcher != "netns":   # a lab's addresses come when it is up
        assert hosts.addr(0) == {"local": "127.0.0.1", "ssh": "10.1.0.1"}[launcher]


def test_ddp_nodes_get_rank_and_master():
    cf = parse("""
        [run.options]
        insecure = true
        [[hosts]]
        roles = ["worker", "worker"]
        [[hosts]]
        roles = []
        [[hosts]]
        roles = ["worker", "worker"]
    """, launcher="netns", system="ddp")
    assert cf.spec.workers == 4
    roles = cluster_roles.plan_roles(cf, ["198.18.0.1", "198.18.0.2", "198.18.0.3"], "python", "/s")
    assert [(r.name, r.host) for r in roles] == [("node0", 0), ("node1", 2)]
    argv = roles[1].argv
    for flag, value in [("--master-addr", "198.18.0.1"), ("--nnodes", "2"), ("--node-rank", "1"), ("--workers", "4")]:
        assert argv[argv.index(flag) + 1] == value
    assert roles[0].env == {"GLOO_SOCKET_IFNAME": "veth0"}
    assert argv[argv.index("--insecure") + 1] == "True"


@pytest.mark.parametrize("launcher", ["netns", "ssh"])
def test_ddp_across_hosts_needs_insecure(launcher: str):
    """The nodes' rendezvous store and gloo listen on a host address without authentication."""
    hosts = '[[hosts]]\naddress = "198.18.0.1"\nroles = ["worker"]\n[[hosts]]\naddress = "198.18.0.2"\nroles = ["worker"]\n'
    with pytest.raises(ConfigError, match="set insecure = true in \\[run.options\\]"):
        parse(hosts, launcher=launcher, system="ddp")
    assert parse('[run.options]\ninsecure = true\n' + hosts, launcher=launcher, system="ddp").spec.options["insecure"]
    parse(hosts, launcher="local", system="ddp")  # 127.0.0.1: nothing to opt in to


@pytest.mark.parametrize("text, message", [
    ('[[hosts]]\nroles = ["worker"]\n', "at least one host with the role \"ps-server\""),
    ('[[hosts]]\nroles = ["ps-server"]\n', "no host has the role \"worker\""),
    ('[[hosts]]\nroles = ["scheduler"]\n', "allows a list of ps-server, worker"),
    ('[[hosts]]\nroles = ["ps-server", "worker"]\ncap_mbit = 100\n', "cap_mbit needs launcher = \"netns\""),
    ('[[hosts]]\nroles = ["ps-server", "worker"]\nport = 3\n', "unknown key"),
    ('[run.options]\nconsistency = "eventual"\n[[hosts]]\nroles = ["ps-server", "worker"]\n', "consistency"),
])
def test_bad_cluster_files_are_one_clear_error(text: str, message: str):
    with pytest.raises(ConfigError, match=message):
        parse(text)


def test_ddp_options_that_come_from_the_hosts_are_refused():
    with pytest.raises(ConfigError, match="master_addr come from the hosts"):
        parse('[run.options]\nmaster_addr = "1.2.3.4"\n[[hosts]]\nroles = ["worker"]\n', system="ddp")
    with pytest.raises(ConfigError, match="same number of worker roles"):
        parse('[[hosts]]\nroles = ["worker"]\n[[hosts]]\nroles = ["worker", "worker"]\n', system="ddp")


INJECTED = "-oProxyCommand=touch pwned"
SSH_HOSTS = """
    launcher = "ssh"
    [run]
    system = "ps"
    workload = "mlp-digits"
    [[hosts]]
    name = "ps"
    address = "10.1.0.1"
    roles = ["ps-server"]
    [[hosts]]
    name = "w"
    address = "{address}"
    roles = ["worker"]
"""


def tomllib_loads(text: str) -> dict:
    import tomllib

    return tomllib.loads(textwrap.dedent(text))


def test_ssh_launcher_dry_run_builds_the_commands(tmp_path: Path, capsys):
    path = write(tmp_path, SSH_HOSTS.format(address="10.1.0.2") +
                 '[ssh]\nuser = "bench"\nworkdir = "/opt/psbench dir"\npython = ".venv/bin/python"\n')
    cf = cluster_file.load(path)
    roles = cluster_roles.plan_roles(cf, ["10.1.0.1", "10.1.0.2"], cf.ssh.python, ".psbench-cluster", "t0k")
    argv = cluster_hosts.ssh_argv(cf, roles[1])
    assert argv[:7] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", "bench@10.1.0.2"]
    # the token is read from the session's stdin, never part of the command (ps shows it on both ends)
    assert argv[7].startswith("cd '/opt/psbench dir' && IFS= read -r PSBENCH_PS_TOKEN && export PSBENCH_PS_TOKEN && "
                              ": || exit 1; exec .venv/bin/python -m psbench ps-worker --servers 10.1.0.1:29500 "
                              "--worker-id 0")
    assert not any("t0k" in a for a in argv) and cluster_hosts.ssh_stdin(roles[1].env) == b"t0k\n"
    # running it for real is tests/test_ssh_launcher.py (sshd in namespace hosts); never 10.x here
    from psbench.bench.cli import main

    assert main(["run", "--cluster", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("ssh -o BatchMode=yes -o ConnectTimeout=10 -- bench@") == 3 and "bench@10.1.0.1" in out
    with pytest.raises(ConfigError, match="needs an address for every host"):
        parse('[[hosts]]\nroles = ["ps-server", "worker"]\n', launcher="ssh")


# ---- no host address becomes an option of ssh or scp ----------------------------------------------

@pytest.mark.parametrize("dry_run", [True, False])
def test_an_address_that_is_an_ssh_option_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys, dry_run):
    """ssh would read the address as an option and run the proxy command here: refused where the
    file is read, with one line naming the file, the host and what is allowed, before anything runs."""
    from psbench.bench.cli import main

    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, SSH_HOSTS.format(address=INJECTED))
    rc = main(["run", "--cluster", str(path), "--results-dir", str(tmp_path / "results"), *(["--dry-run"] * dry_run)])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == "" and INJECTED not in captured.out
    (line,) = captured.err.strip().splitlines()
    assert line == (f"psbench: error: {path}: hosts[1] (w) address '{INJECTED}' is not a host address; allowed: "
                    "a hostname (RFC 1123: labels of letters, digits and '-', none starting or ending with '-', "
                    "joined by '.') or an IP address")
    assert not list(tmp_path.rglob("pwned*")) and not (tmp_path / "results").exists()


@pytest.mark.parametrize("address, ok", [
    ("10.0.0.1", True), ("fd00::1", True), ("node-1.example.org", True), ("h1", True), ("h1.", True),
    (INJECTED, False), ("-h1", False), ("h1-", False), ("a..b", False), ("a b", False), ("h1;id", False),
    ("h1:22", False), ("x" * 64, False), ("", False), ("$(id)", False), ("user@h1", False),
])
def test_host_addresses_are_hostnames_or_ip_literals(address: str, ok: bool):
    text = SSH_HOSTS.format(address=address)
    if ok:
        assert cluster_file.parse(tomllib_loads(text)).hosts[1].address == address
    else:
        with pytest.raises(ConfigError, match=r"hosts\[1\] \(w\) address .* is not a host address; allowed: "):
            cluster_file.parse(tomllib_loads(text))


@pytest.mark.parametrize("key, value, message", [
    ("ssh.user", INJECTED, r"\[ssh\] user '-oProxyCommand=touch pwned'; allowed: letters, digits"),
    ("hosts.name", "../../etc", r"hosts\[1\] name '../../etc'; allowed: letters, digits"),
    ("hosts.name", "-w", r"hosts\[1\] name '-w'; allowed: letters, digits"),
])
def test_ssh_user_and_host_names_are_plain_names(key: str, value: str, message: str):
    raw = tomllib_loads(SSH_HOSTS.format(address="10.1.0.2"))
    if key == "ssh.user":
        raw["ssh"] = {"user": value}
    else:
        raw["hosts"][1]["name"] = value
    with pytest.raises(ConfigError, match=message):
        cluster_file.parse(raw)


def test_every_ssh_and_scp_ends_its_options_before_the_destination(tmp_path: Path, monkeypatch):
    """Defence in depth: "--" before each destination (role commands, the hosts' folders, the copy
    back), so an address that got past the check would still be a host name to ssh."""
    cf = cluster_file.parse(tomllib_loads(SSH_HOSTS.format(address="10.1.0.2") + '[ssh]\nuser = "bench"\n'))
    role = cluster_roles.plan_roles(cf, ["10.1.0.1", "10.1.0.2"], "python", ".s", "tok")[1]
    assert cluster_hosts.ssh_argv(cf, role, guard=True)[5:7] == ["--", "bench@10.1.0.2"]
    seen: list[list[str]] = []
    monkeypatch.setattr(cluster_hosts.subprocess, "run",
                        lambda argv, **kw: seen.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""))
    hosts = cluster_hosts.SshHosts(cf, "job")
    with hosts:
        hosts.fetch(role, tmp_path)
    mkdirs, fetch, removes = seen[:2], seen[2], seen[3:]
    assert [a[5:7] for a in mkdirs + removes] == [["--", "bench@10.1.0.1"], ["--", "bench@10.1.0.2"]] * 2
    assert fetch[0] == "scp" and fetch[-3:] == ["--", f"bench@10.1.0.2:{cf.ssh.workdir}/{role.out}", str(tmp_path / "w")]
    assert cf.ssh.copy_back("fd00::2", "/x", "d")[-2] == "bench@[fd00::2]:/x"   # IPv6: scp's brackets


@pytest.mark.skipif(shutil.which("ssh") is None or shutil.which("scp") is None, reason="no ssh client here")
def test_the_ssh_client_takes_an_option_after_dashdash_as_a_host(tmp_path: Path):
    """The real OpenSSH client with our argv, the check bypassed: after "--" the injected address is
    a (bad) host name, so its proxy command never runs; `ssh -G` shows "--" ends the options."""
    cf = cluster_file.parse(tomllib_loads(SSH_HOSTS.format(address="10.1.0.2")))
    env = {**os.environ, "HOME": str(tmp_path)}   # no ~/.ssh of this machine's user is read
    for argv in (cf.ssh.command(INJECTED, "true"), cf.ssh.copy_back(INJECTED, "/x", str(tmp_path / "in"))):
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode != 0 and not list(tmp_path.rglob("pwned*")), (argv, proc.stderr)
    shown = subprocess.run(["ssh", "-G", *cf.ssh.command("10.1.0.2", "cd /x && true")[1:]], env=env,
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0 and "hostname 10.1.0.2" in shown.stdout.splitlines(), shown.stderr


# ---- the bandwidth experiment (quick variant) ----------------------------------------------------

@pytest.mark.slow  # ~90 s: `make test-slow` (CI runs it)
@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
def test_bandwidth_cap_makes_the_ps_server_link_the_bottleneck(tmp_path: Path):
    """PS (1 server, 4 workers) vs DDP (4 ranks), every link capped at 100 Mbit/s and uncapped,
    measured side by side: under the cap the ring is several times faster, uncapped it is not."""
    from psbench.bench.cli import main

    before = set(netlab.list_namespaces())
    assert main(["netlab", "bench", "--quick", "--results-dir", str(tmp_path)]) == 0
    assert set(netlab.list_namespaces()) <= before  # nothing of this lab is left (another lab may end meanwhile)
    table = pd.read_csv(tmp_path / "netlab" / "bandwidth.csv")
    assert (tmp_path / "netlab" / "bandwidth.png").stat().st_size > 10_000
    ratio = {("capped" if c == c else "uncapped"): r
             for c, r in zip(table[table.system == "ps"]["cap_mbit"], table[table.system == "ps"]["ddp_over_this"])}
    print(f"\nDDP/PS samples/s: 100 Mbit/s {ratio['capped']:.2f}, uncapped {ratio['uncapped']:.2f}")
    assert ratio["capped"] > 2.0
    assert ratio["capped"] > 1.5 * ratio["uncapped"]
    # one run folder per (system, cap), readable by the report
    assert len(list((tmp_path / "netlab").glob("*/manifest.json"))) == 4
    # the analytic model, given the measured compute time and the capped link's measured goodput,
    # predicts the bandwidth-bound PS run within its stated error
    import os

    from psbench.bench.sim.analytic import DEFAULT_ERROR_BOUND, AnalyticInputs, measure_single
    from psbench.bench.sim.analytic_check import validate_netlab
    from psbench.bench.sim.model_size import model_bytes

    single = measure_single("mlp-wide-synthetic", 64, 20)
    inputs = AnalyticInputs(single["step_s"], 0.0, model_bytes("mlp-wide-synthetic"), 1e9, 1e-4, cores=os.cpu_count() or 1)
    rows = {r["system"]: r for r in validate_netlab(table, inputs).rows}
    print(f"model error at 100 Mbit/s: PS BSP {rows['ps']['error']:.1%}, DDP ring {rows['ddp']['error']:.1%}")
    assert rows["ps"]["error"] <= DEFAULT_ERROR_BOUND
