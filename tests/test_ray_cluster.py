"""ray-ps on a Ray cluster the user runs (`--ray-address`): the option's parsing and exposure check,
the unchanged default and the CPU plan (fast); and, slow, a real two-node Ray cluster on two
namespace hosts of the lab (`ray start --head` on one, `ray start --address` on the other, Ray's
token authentication on), joined by a `psbench run` under asp and bsp: actors on both nodes,
records with a local run's columns, the cluster up and free of psbench actors afterwards, and
nothing left once the test stops it. `ray stop` is never used: it stops every Ray on the machine."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import declared_processes
from psbench.bench.lab import netlab
from psbench.core.cpu import LAUNCHER
from psbench.core.errors import ConfigError
from psbench.systems import get_system
from psbench.systems.base import parse_options
from psbench.systems.common import child_env
from psbench.systems.ray_ps.adapter import RayPSOptions, RayPSSystem
from psbench.systems.ray_ps.cluster import RAY_REMEDY, SPREAD
from suite_helpers import assert_local_columns, recorded_locally

RAY = RayPSSystem.unavailable_reason() is None
ray_only = pytest.mark.skipif(not RAY, reason="ray not installed: run `make setup` (the `ray` extra)")
GCS_PORT = 6379
# Logical CPUs per node: room for all 3 actors on the head, where Ray's default scheduling puts them
# (measured: DEFAULT 3 on the head, SPREAD 2 and 1), so that only SPREAD passes the placement asserts.
NODE_CPUS = "6"
ACTORS = ("ray::ShardActor", "ray::WorkerActor")


def _options(raw: dict) -> RayPSOptions:
    return parse_options(get_system("ray-ps").Options, raw, "ray-ps")


def test_ray_address_parsing_and_its_default(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert _options({}).ray_address == "" and not _options({}).insecure  # a private Ray on loopback
    assert _options({"ray_address": "auto"}).ray_address == "auto"
    assert _options({"ray_address": "127.0.0.2:6379"}).ray_address == "127.0.0.2:6379"
    for bad in ("198.18.0.1", "ray://198.18.0.1:10001", "host:port"):
        with pytest.raises(ConfigError, match="ray_address|host:port"):
            _options({"ray_address": bad})


def test_a_cluster_beyond_loopback_needs_ray_token_auth_or_insecure(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ConfigError) as refused:
        _options({"ray_address": "198.18.0.1:6379"})
    assert str(refused.value) == ("ray-ps --ray-address 198.18.0.1:6379 binds 198.18.0.1, which is reachable from "
                                  f"other hosts: {RAY_REMEDY}")
    assert _options({"ray_address": "198.18.0.1:6379", "insecure": "true"}).insecure
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert _options({"ray_address": "198.18.0.1:6379"}).ray_address == "198.18.0.1:6379"


@ray_only
def test_auto_is_checked_as_the_address_it_finds(monkeypatch):
    """`auto` resolves to what Ray finds (here RAY_ADDRESS) and that address is refused beyond
    loopback as a given one is, before this process connects to anything."""
    from psbench.systems.ray_ps.cluster import ray_session

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # ray_session sets it: restored after
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "198.18.0.9:6379")
    with pytest.raises(ConfigError, match="198.18.0.9:6379 binds 198.18.0.9"):
        with ray_session("auto", 3, insecure=False):
            pytest.fail("joined a cluster beyond loopback without auth or --insecure")
    import ray

    assert not ray.is_initialized()


def test_the_cli_refuses_a_non_loopback_ray_address_in_one_line(tmp_path, monkeypatch, capsys):
    from psbench.bench.cli import main as cli_main

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    rc = cli_main(["run", "--system", "ray-ps", "--workload", "mlp-digits", "-np", "2", "--ray-address",
                   "198.18.0.1:6379", "--results-dir", str(tmp_path), "--suite", "s"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "--insecure true" in err[0] and "RAY_AUTH_MODE=token" in err[0]
    assert not any(tmp_path.rglob("manifest.json"))


def test_the_cpu_plan_counts_no_cluster_process_here():
    """A joined cluster's actors and daemons are its nodes': only this driver is planned here; the
    default plan (a private Ray) is unchanged."""
    cls = get_system("ray-ps")
    joined, _ = declared_processes(cls, RayPSOptions(ray_address="127.0.0.1:6379"), 2)
    assert [(p.role, p.count) for p in joined] == [(LAUNCHER, 1)]
    local, _ = declared_processes(cls, RayPSOptions(), 2)
    assert {p.role: p.count for p in local} == {"workers": 2, "ray shard": 1, "ray daemons": 1, LAUNCHER: 1}


# ---- a two-node cluster on namespace hosts (slow) -------------------------------------------------

def _ray_cli() -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts"]


def _stop_namespace(lab: netlab.NetLab, host: int) -> dict[int, float]:
    """SIGKILL every process in the host's namespace (the node's Ray); returns them, pid: start time."""
    stopped = {}
    for pid in netlab.namespace_pids(lab.ns(host)):
        try:
            stopped[pid] = psutil.Process(pid).create_time()
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return stopped


def _still_running(processes: dict[int, float]) -> list[int]:
    alive = []
    for pid, created in processes.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _processes_with(text: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if text in line and proc.pid != os.getpid():
            found.append(line[:120])
    return found


def _actors_left(lab: netlab.NetLab) -> list[str]:
    left = []
    for host in range(lab.hosts):
        for pid in netlab.namespace_pids(lab.ns(host)):
            try:
                title = " ".join(psutil.Process(pid).cmdline())
            except psutil.NoSuchProcess:
                continue
            left += [title[:80]] if title.startswith(ACTORS) else []
    return left


@pytest.mark.slow
@ray_only
@pytest.mark.skipif(netlab.unavailable_reason() is not None, reason=f"no network lab: {netlab.unavailable_reason()}")
def test_ray_ps_joins_a_two_node_cluster_on_namespace_hosts(tmp_path):
    token = tmp_path / "ray-token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = child_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    results = tmp_path / "results"
    ray_temp = Path(tempfile.mkdtemp(prefix="psbr-"))  # short: Ray's socket paths must fit 107 bytes
    lab = netlab.NetLab(hosts=2).up()
    try:
        head = lab.run(0, _ray_cli() + ["start", "--head", "--node-ip-address", "{h0}", "--port", str(GCS_PORT),
                                        "--num-cpus", NODE_CPUS, "--include-dashboard", "false", "--disable-usage-stats",
                                        "--temp-dir", str(ray_temp / "h0")], env=env, timeout=120)
        assert head.returncode == 0, head.stderr[-2000:]
        node = lab.run(1, _ray_cli() + ["start", "--address", f"{{h0}}:{GCS_PORT}", "--node-ip-address", "{h1}",
                                        "--num-cpus", NODE_CPUS, "--disable-usage-stats",
                                        "--temp-dir", str(ray_temp / "h1")], env=env, timeout=120)
        assert node.returncode == 0, node.stderr[-2000:]
        address = f"{lab.addr(0)}:{GCS_PORT}"
        for consistency in ("asp", "bsp"):
            run = lab.run(0, [sys.executable, "-m", "psbench", "run", "--system", "ray-ps", "--workload",
                              "mlp-digits", "-np", "2", "--consistency", consistency, "--ray-address", address,
                              "--results-dir", str(results), "--suite", "joined"], env=env, timeout=300)
            assert run.returncode == 0, run.stderr[-3000:]
        joined, here = load_suite(results / "joined"), recorded_locally(results, "ray-ps", {"consistency": "asp"})
        assert sorted(joined.runs["opt_consistency"]) == ["asp", "bsp"]
        assert_local_columns(joined, here)
        assert (joined.runs["final_val_accuracy"] > 0.8).all()
        for run_id, manifest in joined.manifests.items():
            ray_info = manifest["extra"]["ray"]
            cluster = ray_info["cluster"]
            assert cluster == {**cluster, "joined": True, "address": address, "nodes": 2, "auth": "ray-token",
                               "node_ips": sorted([lab.addr(0), lab.addr(1)]), "scheduling": SPREAD}
            assert cluster["ray_version"] == ray_info["version"]
            placed = {n["node_ip"] for n in ray_info["shard_nodes"] + ray_info["worker_nodes"]}
            assert placed == {lab.addr(0), lab.addr(1)}, run_id  # the actors spread over both nodes
            assert len({n["node_id"] for n in ray_info["worker_nodes"]}) == 2, run_id  # one worker on each
            plan = manifest["extra"]["conditions"]["cpu_plan"]
            assert set(plan) == {LAUNCHER}, plan  # the cluster's processes are not planned here

        # the cluster is still up, with both nodes, and none of the run's actors is left
        check = ("import ray; ray.init(address='%s'); "
                 "print(sum(1 for n in ray.nodes() if n['Alive'])); ray.shutdown()" % address)
        alive = lab.run(0, [sys.executable, "-c", check], env=env, timeout=120)
        assert alive.returncode == 0 and alive.stdout.split()[-1] == "2", alive.stderr[-2000:]
        deadline = time.monotonic() + 30
        while _actors_left(lab) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _actors_left(lab) == []
        assert _processes_with(str(ray_temp / "h0")) and _processes_with(str(ray_temp / "h1"))
    finally:
        stopped = {**_stop_namespace(lab, 1), **_stop_namespace(lab, 0)}
        lab.down()
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert len(stopped) >= 4  # at least each node's gcs_server or raylet and its helpers were found
    deadline = time.monotonic() + 10
    while (_still_running(stopped) or _processes_with(str(ray_temp))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _still_running(stopped) == [] and _processes_with(str(ray_temp)) == []
    assert not any(ns.startswith(lab.ns(0).rpartition("-")[0] + "-") for ns in netlab.list_namespaces())
