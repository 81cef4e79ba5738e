"""`ddp`: real torch.distributed processes over gloo on 127.0.0.1."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from allreduce_helpers import (check_accuracy, check_equals_concat_batch, check_records, fault_env,
                               kill_launcher_and_expect_gone, leftover_workers,
                               train, train_on_loopback)
from psbench.core.spec import RunSpec
from psbench.systems.allreduce_launch import WorkerFailed
from psbench.systems.base import parse_options
from psbench.systems.ddp.adapter import DDPOptions, DDPSystem
from psbench.core.errors import ConfigError
from psbench.systems.common import child_env

WORKER = "psbench.systems.ddp.worker"


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """One full run (mlp-digits, 2 workers, 5 epochs) shared by the checks below."""
    return train_on_loopback(DDPSystem, RunSpec("ddp", "mlp-digits", workers=2, seed=0), DDPOptions(), WORKER,
                             tmp_path_factory.mktemp("ddp-state"))


def test_two_workers_reach_accuracy(two_workers):
    check_accuracy(two_workers)


def test_records_steps_and_evals(two_workers):
    check_records(two_workers)


def test_weights_equal_single_process_on_concatenated_batch(two_workers):
    check_equals_concat_batch(two_workers)


def test_worker_exception_is_one_error_naming_the_rank_and_leaves_no_orphans(monkeypatch, tmp_path):
    monkeypatch.setenv(*fault_env(rank=1, step=3))
    since = time.time()
    with pytest.raises(WorkerFailed, match=r"^ddp worker rank 1 failed: RuntimeError: injected fault at step 3"):
        train(DDPSystem, RunSpec("ddp", "mlp-digits", workers=2, max_steps=20), DDPOptions(), tmp_path)
    assert leftover_workers(WORKER, since) == []


def test_timeout_stops_every_worker(tmp_path):
    since = time.time()
    with pytest.raises(WorkerFailed, match=r"ddp run timed out after 1 s"):
        train(DDPSystem, RunSpec("ddp", "mlp-digits", workers=2), DDPOptions(timeout_s=1), tmp_path)
    assert leftover_workers(WORKER, since) == []


@pytest.mark.parametrize("raw, message", [
    ({"nnodes": "2"}, "master_port must be given"),
    ({"nnodes": "2", "node_rank": "2", "master_port": "29500"}, "node_rank must be in 0..1"),
    ({"master_port": "70000"}, "master_port must be in 0..65535"),
    ({"timeout_s": "0"}, "timeout_s must be > 0"),
    ({"workers_per_node": "2"}, "has no option"),
])
def test_bad_options_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_options(DDPOptions, raw, "ddp")


def test_workers_must_divide_over_nodes(tmp_path):
    with pytest.raises(ConfigError, match=r"workers \(3\) must be a multiple of option nnodes \(2\)"):
        DDPSystem().run(RunSpec("ddp", "mlp-digits", workers=3), DDPOptions(nnodes=2, master_port=29500),
                        None)  # type: ignore[arg-type]


def test_ranks_are_forked_by_one_zygote_and_leave_when_their_launcher_is_killed(tmp_path):
    """The ranks come from one warm zygote (one torch import for all); only rank 0 holds the
    rendezvous socket; SIGKILL on the launcher leaves no rank or zygote behind."""
    launcher = subprocess.Popen([sys.executable, "-m", "psbench", "run", "--system", "ddp", "-np", "2",
                                 "--workload", "mlp-digits", "--emulate-device", "step_ms=50", "--epochs", "1000",
                                 "--results-dir", str(tmp_path), "--no-progress"],
                                env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            forked = [p for p in psutil.Process(launcher.pid).children(recursive=True)
                      if "psbench.core.zygote" in " ".join(p.cmdline())]
            if len(forked) == 3 and any(p.net_connections("tcp") for p in forked):   # zygote + 2 ranks, training
                break
            time.sleep(0.2)
        assert len(forked) == 3, [p.cmdline() for p in forked]
        zygote = [p for p in forked if p.ppid() == launcher.pid]
        ranks = [p for p in forked if p.ppid() != launcher.pid]
        assert len(zygote) == 1 and all(r.ppid() == zygote[0].pid for r in ranks)
        def listens(proc: psutil.Process) -> set[int]:
            return {c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}

        (store_port,) = listens(zygote[0])   # the socket bound by the launcher, passed through
        assert [store_port in listens(r) for r in ranks].count(True) == 1, "only rank 0 holds the store's socket"
        kill_launcher_and_expect_gone(launcher, forked)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return a.address
    return None


def test_a_master_addr_beyond_loopback_needs_insecure_and_the_manifest_records_it(tmp_path, capsys):
    """torch's TCPStore and gloo take any connection: bound beyond loopback, a run refuses to start
    (one line, exit 2) unless --insecure true says so, and then its manifest says it ran so."""
    import json

    from psbench.bench.cli import main

    args = ["run", "--system", "ddp", "-np", "2", "--workload", "mlp-digits", "--max-steps", "5",
            "--results-dir", str(tmp_path), "--suite", "s", "--no-progress"]
    assert main([*args, "--master-addr", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["psbench: error: ddp's rendezvous store (--master-addr) binds 0.0.0.0, which is reachable from "
                   "other hosts: torch's rendezvous store and gloo have no authentication: pass --insecure true to "
                   "accept any client (recorded in the manifest)"]
    assert not (tmp_path / "s").exists()
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no IPv4 address beyond loopback to bind the store to")
    assert main([*args, "--master-addr", address, "--insecure", "true"]) == 0
    [manifest] = [json.loads(p.read_text()) for p in (tmp_path / "s").glob("*/manifest.json")]
    assert manifest["spec"]["options"]["insecure"] == "true"
    assert manifest["extra"]["ddp_store"] == {"master_addr": address, "auth": "insecure"}
