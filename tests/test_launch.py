"""psbench launch started by torch's own torchrun on this machine (`--standalone`): the run folder
rank 0 gathers reads back (load_suite) with a local run's columns and trains as well. Slow: each
job starts its ranks and torchrun's agent (~10 s on 2 cores), and the local twin runs beside it."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import run_all
from psbench.bench.lab import netlab
from psbench.core.spec import RunSpec
from psbench.systems.horovod.adapter import HorovodSystem

pytestmark = pytest.mark.slow
HOROVOD = HorovodSystem.unavailable_reason()
NEEDS_HOROVOD = pytest.mark.skipif(HOROVOD is not None, reason=f"{HOROVOD}")
WORKLOAD, STEPS = "mlp-digits", 30


def torchrun(nproc: int, args: list[str], results: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    """Run `torchrun --standalone --nproc-per-node N -m psbench launch ARGS`; its wall time and output."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "psbench", "launch", "--workload", WORKLOAD, "--max-steps", str(STEPS),
            "--results-dir", str(results), "--suite", "launched", *args]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return time.monotonic() - began, done.stdout + done.stderr


def check_like_local(launched_dir: Path, local: RunSpec, tmp_path: Path, same_accuracy: bool) -> dict:
    """The launched suite against a local run of the same spec: one run, the same id, columns and
    row counts; its accuracy equal (deterministic ddp) or sane (ps: asynchronous). Its manifest."""
    run_all([local], tmp_path / "local", "local", progress=False, allow_oversubscribe=True)
    got, want = load_suite(launched_dir), load_suite(tmp_path / "local" / "local")
    assert list(got.runs["run_id"]) == [local.run_id]
    for table in ("runs", "steps", "evals", "events"):
        assert list(getattr(got, table).columns) == list(getattr(want, table).columns), table
    assert len(got.steps) == len(want.steps) == local.workers * STEPS
    acc, local_acc = float(got.runs["final_val_accuracy"][0]), float(want.runs["final_val_accuracy"][0])
    if same_accuracy:
        assert acc == pytest.approx(local_acc, abs=1e-9)
    assert acc > 0.3, acc   # chance is 0.1 on digits
    assert not [p for p in launched_dir.iterdir() if p.name.startswith(".")], "staging left behind"
    return got.manifests[local.run_id]


@pytest.mark.parametrize("system", ["ddp", pytest.param("horovod", marks=NEEDS_HOROVOD)])
def test_torchrun_every_rank_a_worker_two_ranks(tmp_path, system):
    """ddp, and horovod without horovodrun: accuracy equal to a local run's (both deterministic)."""
    wall, out = torchrun(2, ["--system", system], tmp_path / "r")
    manifest = check_like_local(tmp_path / "r" / "launched", RunSpec(system, WORKLOAD, workers=2, max_steps=STEPS),
                                tmp_path, same_accuracy=True)
    launch = manifest["extra"]["launch"]
    assert launch["engine"] == "torchrun" and launch["world"] == 2 and launch["store"] == "torchrun agent"
    assert launch["store_auth"] == "loopback"
    assert set(launch["clock"]["offsets_s"]) == {"0", "1"} and launch["clock"]["within_bound"] is True
    if system == "horovod":   # rank 0's rendezvous server, on loopback
        assert launch["horovod_rendezvous"].startswith("127.0.0.1:") and launch["hosts"] == ["127.0.0.1"]
    print(f"torchrun {system} 2 ranks: {wall:.1f} s wall; clock offsets {json.dumps(launch['clock']['offsets_s'])}")


def test_torchrun_ps_one_shard_two_workers(tmp_path):
    wall, out = torchrun(3, ["--system", "ps"], tmp_path / "r", env={"PSBENCH_PS_TOKEN": "launch-test-token"})
    manifest = check_like_local(tmp_path / "r" / "launched", RunSpec("ps", WORKLOAD, workers=2, max_steps=STEPS),
                                tmp_path, same_accuracy=False)
    launch = manifest["extra"]["launch"]
    assert launch["world"] == 3 and launch["store_auth"] == "token" and len(launch["shards"]) == 1
    assert set(launch["clock"]["offsets_s"]) == {"0", "1", "2"} and launch["clock"]["within_bound"] is True
    assert "launch-test-token" not in json.dumps(manifest)
    print(f"torchrun ps 1 shard + 2 workers: {wall:.1f} s wall; clock offsets {json.dumps(launch['clock']['offsets_s'])}")


def _two_hosts(system: str, nproc: int, tmp_path: Path, extra: list[str], hostnames: bool = False) -> tuple[float, dict]:
    """`torchrun --nnodes 2 --rdzv-endpoint <host 0>:port` on each of two namespace hosts (c10d
    rendezvous; host 0 told to serve it: its 198.18 address is not the machine's hostname's).
    `hostnames`: each host's /etc/hosts maps the machine's hostname to its lab address."""
    from psbench.bench.lab.netlab import NetLab
    from psbench.bench.lab.sshlab import write_hostname_at_lab_address
    from psbench.systems.common import child_env

    with NetLab(hosts=2) as lab, contextlib.ExitStack() as cleanup:
        if hostnames:
            for host in range(2):
                cleanup.callback(shutil.rmtree, write_hostname_at_lab_address(lab, host), True)
        env = {**child_env(), "GLOO_SOCKET_IFNAME": "veth0", "PSBENCH_PS_TOKEN": "two-hosts-token"}
        began, procs = time.monotonic(), []
        for node in range(2):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{lab.addr(0)}:29400", "--rdzv-id", "two-hosts",
                    "--rdzv-conf", f"is_host={str(node == 0).lower()},join_timeout=60", "--local-addr", lab.addr(node),
                    "-m", "psbench", "launch", "--system", system, "--workload", WORKLOAD, "--max-steps", str(STEPS),
                    "--results-dir", str(tmp_path / f"node{node}"), "--suite", "launched", *extra]
            procs.append(lab.exec(node, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=240)[0] for p in procs]
        wall = time.monotonic() - began
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    # rank 0 (on whichever host the rendezvous put it) wrote the one run; the other host kept nothing
    written = sorted(tmp_path.glob("node*/launched/*/manifest.json"))
    assert len(written) == 1 and not list(tmp_path.glob("node*/launched/.*")), list(tmp_path.rglob("*"))
    return wall, json.loads(written[0].read_text())


REASON = netlab.unavailable_reason()


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=f"netlab: {REASON}")
def test_torchrun_across_two_namespace_hosts(tmp_path):
    wall_ddp, ddp = _two_hosts("ddp", 1, tmp_path / "ddp", ["--insecure", "true"])
    wall_ps, ps = _two_hosts("ps", 2, tmp_path / "ps", [])   # 4 ranks: 1 shard + 3 workers
    for manifest, world in ((ddp, 2), (ps, 4)):
        launch = manifest["extra"]["launch"]
        assert launch["world"] == world and launch["master_addr"].startswith("198.18.")
        assert launch["clock"]["within_bound"] is True and len(launch["clock"]["offsets_s"]) == world
        run = load_suite(next(tmp_path.glob(f"{manifest['spec']['system']}/node*/launched")))
        assert float(run.runs["final_val_accuracy"][0]) > 0.3
    assert ps["extra"]["launch"]["shards"][0].startswith("198.18.")
    print(f"two namespace hosts: ddp 2 ranks {wall_ddp:.1f} s, ps 1+3 ranks {wall_ps:.1f} s wall")


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None or HOROVOD is not None, reason=f"netlab: {REASON}; horovod: {HOROVOD}")
def test_torchrun_horovod_across_two_namespace_hosts(tmp_path):
    """2 ranks a host: Horovod's local and cross communicators both span two ranks. The hosts'
    hostnames resolve to their own addresses, as on a cluster (launch/horovod.py check_hostnames)."""
    wall, manifest = _two_hosts("horovod", 2, tmp_path, ["--insecure", "true"], hostnames=True)
    launch = manifest["extra"]["launch"]
    assert launch["world"] == 4 and launch["master_addr"].startswith("198.18.") and launch["store_auth"] == "insecure"
    assert len(launch["hosts"]) == 2 and all(h.startswith("198.18.") for h in launch["hosts"])
    assert launch["horovod_rendezvous"].partition(":")[0] in launch["hosts"]
    assert launch["clock"]["within_bound"] is True and len(launch["clock"]["offsets_s"]) == 4
    run = load_suite(next(tmp_path.glob("node*/launched")))
    assert float(run.runs["final_val_accuracy"][0]) > 0.3 and len(run.steps) == 4 * STEPS
    print(f"two namespace hosts: horovod 2+2 ranks {wall:.1f} s wall")


def test_ranks_from_open_mpi_variables_rank_0_serving_the_store(tmp_path):
    """The variables mpirun sets, given by hand to two processes (mpirun itself is not installed
    here): no torchrun agent, so rank 0 serves the store on MASTER_ADDR:MASTER_PORT."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "psbench", "launch", "--system", "ddp", "--workload", WORKLOAD, "--max-steps",
            str(STEPS), "--results-dir", str(tmp_path / "r"), "--suite", "launched"]
    began = time.monotonic()
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=Path(__file__).resolve().parent.parent,
                              env={**{k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")},
                                   "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                                   "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port)}) for r in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    wall = time.monotonic() - began
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    run = load_suite(tmp_path / "r" / "launched")
    launch = run.manifests[run.runs["run_id"][0]]["extra"]["launch"]
    assert launch["engine"] == "mpi" and launch["store"] == "rank 0" and launch["world"] == 2
    assert float(run.runs["final_val_accuracy"][0]) > 0.3 and len(run.steps) == 2 * STEPS
    print(f"Open MPI variables, ddp 2 ranks: {wall:.1f} s wall")


@pytest.mark.parametrize("system", ["ddp", pytest.param("horovod", marks=NEEDS_HOROVOD)])
def test_a_failing_rank_says_why_in_one_line_and_leaves_no_run(tmp_path, system):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "psbench",
            "launch", "--system", system, "--workload", WORKLOAD, "--max-steps", str(STEPS),
            "--results-dir", str(tmp_path / "r"), "--suite", "launched"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, "PSBENCH_INJECT_FAULT": "1:5"})
    assert done.returncode != 0
    assert f"psbench: run failed: {system} worker rank 1 failed: RuntimeError: injected fault at step 5" in done.stderr
    assert not list((tmp_path / "r" / "launched").glob("*/manifest.json"))
