"""`rpc-ps`: a parameter server on torch.distributed.rpc, the way PyTorch's tutorials build one:
S server processes hold the shards, N trainer processes compute gradients on their data shards and
send them by RPC, each reply carrying the shard's fresh parameters (systems/rpc_ps/process.py).

The launcher here starts the S + N processes, supervises them (the allreduce systems' supervisor:
first failure named, timeout, no orphans), and reads their records back. Everything binds
127.0.0.1: the rendezvous store on a socket bound here, TensorPipe with TP_SOCKET_IFNAME=lo.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from psbench.core.cpu import WORKERS, Proc
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.supervisor import Supervisor
from psbench.systems.base import System
from psbench.systems.allreduce_launch import new_job, spawn_ranks, supervise
from psbench.systems.common import Prepared, child_env, prepare
from psbench.systems.ddp.adapter import bind_store_socket
from psbench.systems.peer_common import PeerOptions, WorkerReport, record_run, shard_plans

LOOPBACK_ENV = {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


class RpcPSSystem(System):
    name = "rpc-ps"
    no_cuda_reason = "its trainers send host tensors over TensorPipe; no device map is set up"
    Options = PeerOptions

    @staticmethod
    def cpu_processes(options: PeerOptions, workers: int) -> list[Proc]:
        """Ranks 0..S-1 are the shards, the rest the trainers (process.py); each runs TensorPipe's
        agent threads beside its Python."""
        shards = "|".join(str(rank) for rank in range(options.servers))
        return [Proc("rpc shard", options.servers, rf"rpc_ps\.process .*--rank ({shards})(\s|$)"),
                Proc(WORKERS, workers, r"rpc_ps\.process")]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        import torch.distributed.rpc as rpc

        return None if rpc.is_available() else "this torch build has no torch.distributed.rpc"

    def run(self, spec: RunSpec, options: PeerOptions, recorder: Recorder) -> None:
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        train(prep, options, recorder)


def train(prep: Prepared, options: PeerOptions, recorder: Recorder) -> np.ndarray:
    """Run one rpc-ps training; returns the servers' final flat parameters."""
    spec = prep.spec
    shard_plans(prep, options)  # a ConfigError (more shards than tensors) before any process starts
    servers, world = options.servers, options.servers + spec.workers
    job = new_job(spec)
    (job / "options.json").write_text(json.dumps(dataclasses.asdict(options)))
    listener = bind_store_socket("127.0.0.1", 0)
    sup = Supervisor()
    try:
        env = child_env(LOOPBACK_ENV)
        port = listener.getsockname()[1]
        # Fresh interpreters, not the zygote: torch RPC ran 4-5x slower in ranks forked after
        # torch's import (4 trainers, mlp-digits, no device: ~3.8k vs ~17k samples/s; cause not found).
        spawn_ranks(sup, job, "psbench.systems.rpc_ps.process", range(world),
                    lambda rank: ["--job", str(job), "--rank", str(rank), "--world", str(world), "--port", str(port)],
                    env, listener, warm=False)
        listener.close()  # rank 0 holds its own copy now
        supervise("rpc-ps", sup, job, options.timeout_s)
        reports, t0, t_end = _read_trainers(job, spec.workers)
        final = np.concatenate([np.load(job / f"shard{j}.npy", allow_pickle=False) for j in range(servers)])
        shards = [json.loads((job / f"shard{j}.json").read_text()) for j in range(servers)]
    finally:
        listener.close()
        sup.stop()
        shutil.rmtree(job, ignore_errors=True)
    record_run(prep, recorder, reports, t0, t_end, final, options.consistency)
    import torch

    recorder.extra["rpc"] = {"torch": torch.__version__, "consistency": options.consistency, "shards": shards}
    return final


def _read_trainers(job: Path, n: int) -> tuple[list[WorkerReport], float, float]:
    """Each trainer's rows and worker 0's snapshots; the run's clock spans the trainers' (they start
    together: RPC initialisation is a rendezvous of every process)."""
    reports, starts, ends = [], [], []
    for i in range(n):
        meta = json.loads((job / f"trainer{i}.json").read_text())
        snapshots = np.load(job / f"trainer{i}.snapshots.npy", allow_pickle=False)
        reports.append(WorkerReport(i, meta["rows"], meta["snapshot_steps"], meta["snapshot_t"], list(snapshots),
                                    np.load(job / f"trainer{i}.buffers.npy", allow_pickle=False)))
        starts.append(meta["t0"])
        ends.append(meta["t_end"])
    return reports, min(starts), max(ends)
