"""Faults with real processes and real SIGKILLs: a lost ASP/SSP worker, a lost BSP worker, a killed
server shard restarted from its checkpoint, run-time worker ids (`register`), and no orphans."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import psutil
import pytest

from psbench.bench import cli
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.common import child_env, prepare
from psbench.systems.ps import checkpoint, protocol
from psbench.systems.ps.adapter import PSOptions, run_ps_phase
from psbench.systems.ps.launch import Cluster, Faults, LaunchError
from psbench.systems.ps.worker import ADMIN, KVWorker
from psbench.core.errors import ConfigError

TOKEN = "faults"
SHAPES = [(4, 3), (3,)]


def no_children() -> list:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def events(recorder: Recorder, kind: str) -> list[dict]:
    return [{**e, "detail": json.loads(e["detail"])} for e in recorder.events if e["kind"] == kind]


def faults_of(recorder: Recorder) -> dict:
    return recorder.extra["ps"]["phases"][-1]["faults"]


# ---- workers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("consistency", ["asp", "ssp:1"])
def test_killed_worker_is_recorded_and_training_goes_on(consistency):
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, max_steps=40)
    recorder = Recorder(spec)
    # ssp: without the liveness timeout the survivor would wait for the dead worker until the
    # 8 s step timeout and the run would fail; with it, the bound stops counting the dead worker.
    options = PSOptions(consistency=consistency, kill_worker_at="1:6", worker_timeout_s=1.0, step_timeout_s=8.0,
                        tolerate_worker_loss=True)
    result = run_ps_phase(prepare(spec), options, recorder)
    assert result.steps == {0: 40, 1: 6}
    [killed] = events(recorder, "worker_killed")
    [lost] = events(recorder, "worker_lost")
    assert (killed["worker"], killed["step"]) == (1, 6)
    assert (lost["worker"], lost["step"], lost["detail"]["exit"]) == (1, 6, "killed by SIGKILL")
    assert lost["t_wall"] >= killed["t_wall"] >= 0
    rows = [r for r in recorder.steps if r["worker"] == 1]
    assert [r["step"] for r in rows] == list(range(6))  # its rows up to its death came with its progress reports
    assert faults_of(recorder)["lost_workers"] == {"1": "killed by SIGKILL"}
    assert recorder.summary()["lost_workers"] == [1]
    assert recorder.extra["ps"]["phases"][-1]["wire"] == "plain"  # loopback: not encrypted (tests/test_ps_curve.py)
    shard = result.server_stats[0]
    assert shard["applied"] == 46
    if consistency.startswith("ssp"):
        assert shard["lost_workers"] == [1] and shard["max_gap"] <= 1
    assert not no_children()


def test_killed_asp_worker_fails_the_run_unless_its_loss_is_tolerated(tmp_path, capsys):
    """Tolerance is a fault experiment's explicit option: without it a lost worker is a failed run,
    one line and no run folder (with it: the test above; its summary names the lost worker)."""
    run = ["run", "--system", "ps", "-np", "2", "--workload", "mlp-digits", "--max-steps", "40", "--consistency",
           "asp", "--kill-worker-at", "1:6", "--results-dir", str(tmp_path), "--suite", "faults", "--no-progress"]
    assert cli.main(run) == 1
    failed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("psbench: run failed:")]
    assert len(failed) == 1 and failed[0].startswith(
        "psbench: run failed: ps worker 1 failed (killed by SIGKILL) near step 6; the run stops (option "
        "tolerate_worker_loss=true goes on without it)"), failed
    assert not list(tmp_path.glob("faults/*/manifest.json"))
    assert not no_children()


def test_a_worker_lost_before_training_fails_at_once_even_when_tolerated():
    """Tolerance lets a run go on without a worker that trained; one that died while loading leaves
    no run: the launcher says so at once, not after the ready timeout as 'timed out waiting'."""
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, max_steps=5)
    with Cluster(1, 2, TOKEN, ready_timeout_s=60, faults=Faults(tolerate_worker_loss=True)) as cluster:
        addresses = cluster.start_servers(["--lr", "0.1"])
        with pytest.raises(LaunchError) as info:
            cluster.start_workers(["--spec-json", json.dumps(spec.to_dict())], addresses, {1: ["--no-such-flag"]})
    first = str(info.value).splitlines()[0]
    assert first.startswith("ps worker 1 failed (exit code 2); before training began, so the run stops."), first
    assert not no_children()


def test_killed_bsp_worker_ends_the_run_with_one_error_naming_it():
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, max_steps=200)
    with pytest.raises(LaunchError) as info:
        run_ps_phase(prepare(spec), PSOptions(consistency="bsp", kill_worker_at="1:5", step_timeout_s=5.0),
                     Recorder(spec))
    first = str(info.value).splitlines()[0]
    assert re.match(r"ps worker 1 failed \(killed by SIGKILL\) near step 5; under bsp", first), first
    assert not no_children()


def test_bsp_step_times_out_naming_the_silent_worker():
    """Without a launcher watching (by hand, docker), the shard's step timeout is what ends the wait."""
    with Cluster(1, 2, TOKEN) as cluster:
        [address] = cluster.start_servers(["--lr", "0.1", "--consistency", "bsp", "--step-timeout-s", "1.5"])
        with KVWorker([address], ADMIN, SHAPES, TOKEN) as admin, KVWorker([address], 0, SHAPES, TOKEN) as w0:
            admin.init([np.ones(s, np.float32) for s in SHAPES])
            with pytest.raises(protocol.PSError, match=r"bsp: timed out after 2s waiting for worker\(s\) \[1\]"):
                w0.push_pull([np.ones(s, np.float32) for s in SHAPES], 0)
            assert [a.tolist() for a in admin.state()] == [np.ones(s).tolist() for s in SHAPES]  # nothing applied
            admin.shutdown()
    assert not no_children()


def test_fault_options_are_validated():
    for bad in ("1", "a:2", "1:-3"):
        with pytest.raises(ConfigError, match="kill_worker_at"):
            PSOptions(kill_worker_at=bad)
    for bad in ("0", "0:x", "0:-1s", "0:0"):
        with pytest.raises(ConfigError, match="kill_server_at"):
            PSOptions(kill_server_at=bad)
    with pytest.raises(ConfigError, match="checkpoint interval"):
        PSOptions(checkpoint_every="often")
    with pytest.raises(ConfigError, match="shard 2 does not exist"):
        PSOptions(servers=2, kill_server_at="2:10")


# ---- servers ------------------------------------------------------------------------------------

def test_killed_shard_restarts_from_its_checkpoint_and_workers_carry_on(tmp_path):
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, max_steps=40)
    recorder = Recorder(spec)
    options = PSOptions(consistency="asp", servers=2, checkpoint_dir=str(tmp_path), checkpoint_every="10",
                        kill_server_at="1:25", retry_s=0.5)
    result = run_ps_phase(prepare(spec), options, recorder)
    assert result.steps == {0: 40, 1: 40}
    [restart] = [e["detail"] for e in events(recorder, "server_restarted")]
    assert restart["shard"] == 1 and restart["version_before"] == 25 and restart["restored_version"] == 20
    assert restart["lost_updates"] == 5 < 10  # at most one checkpoint interval
    assert restart["recovery_s"] > 0
    assert faults_of(recorder)["lost_updates"] == 5
    assert len(events(recorder, "server_lost")) == 1
    s0, s1 = result.server_stats
    assert s0["version"] == 80 and s1["restored_version"] == 20
    # 24 replies came from the old process; the push it applied as update 25 never got its reply and
    # was retried, so the new process applied the other 56 pushes on top of version 20.
    assert s1["version"] == 20 + 80 - 24
    assert np.isfinite(result.params).all()
    header = json.loads(checkpoint.header_path(tmp_path, 1).read_text())
    assert header["version"] % 10 == 0 and header["version"] >= 70
    assert len(list(tmp_path.glob("shard-1-v*.npy"))) == 1  # older data files are removed
    assert not no_children()


def test_a_retried_push_is_not_applied_twice_after_a_restart(tmp_path):
    """Killed at a checkpoint version: the checkpoint holds the last push, its retry is answered
    without applying it again (the request id is in the checkpoint), and nothing is lost."""
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, max_steps=30)
    recorder = Recorder(spec)
    options = PSOptions(consistency="asp", checkpoint_dir=str(tmp_path), checkpoint_every="10",
                        kill_server_at="0:20", retry_s=0.5)
    result = run_ps_phase(prepare(spec), options, recorder)
    [restart] = [e["detail"] for e in events(recorder, "server_restarted")]
    assert restart["lost_updates"] == 0 and restart["restored_version"] == 20
    assert result.server_stats[0]["version"] == 60
    assert result.server_stats[0]["duplicates"] >= 1
    assert not no_children()


def test_checkpoint_round_trip_and_checksum(tmp_path):
    params = {0: np.arange(12, dtype=np.float32).reshape(4, 3), 1: np.ones(3, np.float32)}
    momentum = {0: np.full((4, 3), 0.5, np.float32), 1: np.zeros(3, np.float32)}
    checkpoint.save(tmp_path, 0, 7, [0, 1], params, momentum, {"policy": {"live": [0]}})
    state = checkpoint.load(tmp_path, 0)
    assert state.version == 7 and state.header["policy"] == {"live": [0]}
    for k in params:
        np.testing.assert_array_equal(state.params[k], params[k])
        np.testing.assert_array_equal(state.momentum[k], momentum[k])
    data = tmp_path / state.header["file"]
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match="checksum"):
        checkpoint.load(tmp_path, 0)


# ---- run-time worker ids ------------------------------------------------------------------------

def test_register_hands_out_each_id_once_then_refuses():
    with Cluster(1, 2, TOKEN) as cluster:
        [address] = cluster.start_servers(["--lr", "0.1"])
        with KVWorker([address], ADMIN, [], TOKEN) as kv:
            assert kv.register("a") == 0
            assert kv.register("b") == 1
            assert kv.register("a") == 0  # a retried registration keeps its id
            with pytest.raises(protocol.PSError, match="all 2 worker ids are taken"):
                kv.register("c")
        with KVWorker([address], 1, [], TOKEN) as kv:
            with pytest.raises(protocol.PSError, match="register comes from worker -1"):
                kv.register("d")
        with KVWorker([address], ADMIN, [], TOKEN) as kv:
            with pytest.raises(protocol.PSError, match="nonce"):
                kv._round({0: kv._msg("register", 0)})
            kv.shutdown()
    assert not no_children()


def test_ps_worker_auto_id_by_hand(tmp_path):
    """The docker path: ps-server, then workers with --worker-id auto writing {worker}-named files."""
    env = child_env({"PSBENCH_PS_TOKEN": TOKEN})
    server = subprocess.Popen([sys.executable, "-m", "psbench.systems.ps.server", "--bind", "127.0.0.1:0",
                               "--workers", "2", "--workload", "mlp-digits", "--checkpoint-dir", str(tmp_path / "ck"),
                               "--checkpoint-every", "5"],
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        address = re.search(r"listening on (\S+)", line).group(1)
        workers = [subprocess.Popen([sys.executable, "-m", "psbench.systems.ps.worker", "--servers", address,
                                     "--worker-id", "auto", "--workers", "2", "--workload", "mlp-digits", "--init",
                                     "--max-steps", "5", "--out", str(tmp_path / "w{worker}.json")],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(2)]
        outs = [w.communicate(timeout=120) for w in workers]
        assert all(w.returncode == 0 for w in workers), outs
        for i in range(2):
            rows = json.loads((tmp_path / f"w{i}.json").read_text())
            assert rows["worker"] == i and rows["rows"]["step"] == list(range(5))
        # 2 workers x 5 steps: the shard checkpointed every 5 updates, the last one at 10, which
        # holds exactly the parameters it serves now
        saved = checkpoint.load(tmp_path / "ck", 0)
        assert saved.version == 10 and len(saved.header["registered"]) == 2
        shapes = [tuple(p.shape) for p in prepare(RunSpec("ps", "mlp-digits", workers=2)).build_model().parameters()]
        with KVWorker([address], ADMIN, shapes, TOKEN) as kv:
            assert all(np.array_equal(saved.params[k], a) for k, a in enumerate(kv.state()))
            with pytest.raises(protocol.PSError, match="all 2 worker ids are taken"):
                kv.register("third")
            kv.shutdown()
        server.wait(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_ps_server_accepts_an_explicit_all_interfaces_bind():
    """Parse only (tests never listen beyond loopback); the adapter's own launches keep the guard."""
    from psbench.bench.cli import build_parser
    from psbench.core.exposure import split_address

    args = build_parser().parse_args(["ps-server", "--bind", "0.0.0.0:5555", "--workers", "2", "--lr", "0.1"])
    assert split_address(args.bind) == ("0.0.0.0", 5555)
    with pytest.raises(ConfigError, match="not allowed"):
        PSOptions(host="0.0.0.0")
