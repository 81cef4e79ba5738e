"""`ddp`: N real processes, torch DistributedDataParallel over gloo (ring allreduce of gradients)."""
from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

from psbench.core.accelerator import CPU, CUDA
from psbench.core.cpu import FORKED, WORKERS, Proc
from psbench.core.records import Recorder
from psbench.core.exposure import check_exposure, is_loopback
from psbench.core.spec import RunSpec
from psbench.core.supervisor import Supervisor
from psbench.systems.allreduce_launch import run_job, spawn_ranks
from psbench.systems.base import System, option
from psbench.systems.common import child_env, prepare
from psbench.core.errors import ConfigError

# torch's TCPStore and gloo take any connection: no token to give, only the explicit opt-in
DDP_REMEDY = ("torch's rendezvous store and gloo have no authentication: pass --insecure true to accept any "
              "client (recorded in the manifest)")


@dataclasses.dataclass(frozen=True)
class DDPOptions:
    master_addr: str = option("127.0.0.1", "address of rank 0's rendezvous store (the node with node_rank 0)")
    master_port: int = option(0, "port of the rendezvous store (rank 0 listens there); 0: a free port, single node only")
    nnodes: int = option(1, "hosts taking part; each runs workers/nnodes ranks (start psbench on each)")
    node_rank: int = option(0, "this host's index in 0..nnodes-1; node 0 holds rank 0 and records evals")
    timeout_s: float = option(1800.0, "stop every worker and fail after this many seconds")
    insecure: bool = option(False, "a master_addr beyond loopback: allow the rendezvous store and gloo (no "
                                   "authentication) to listen there; required there, and recorded")

    def __post_init__(self) -> None:
        check_exposure("ddp's rendezvous store (--master-addr)", self.master_addr, None, self.insecure, DDP_REMEDY)
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"option master_port must be in 0..65535, got {self.master_port}")
        if self.nnodes < 1:
            raise ConfigError(f"option nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"option node_rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and self.master_port == 0:
            raise ConfigError("option master_port must be given (not 0) when nnodes > 1: every node needs it")
        if self.timeout_s <= 0:
            raise ConfigError(f"option timeout_s must be > 0, got {self.timeout_s}")


def bind_store_socket(addr: str, port: int) -> socket.socket:
    """The rendezvous store's listening socket, bound to master_addr only (port 0: a free one)."""
    try:
        sock = socket.create_server((addr, port), backlog=128)
    except OSError as exc:
        raise ConfigError(f"cannot listen on master_addr:master_port {addr}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


class DDPSystem(System):
    name = "ddp"
    devices = (CPU, CUDA)  # gloo between CPUs, NCCL between GPUs, a GPU a rank
    budgets = ("seconds",)  # rank 0's training clock decides, every rank stops after the same step
    timer_evaluator = True  # --eval-every-s: snapshots on the training clock, evaluated off it
    Options = DDPOptions

    @staticmethod
    def local_workers(options: DDPOptions, workers: int) -> int:
        """The ranks this node starts (the CPU budget counts these)."""
        return max(1, workers // options.nnodes)

    @staticmethod
    def cpu_processes(options: DDPOptions, workers: int) -> list[Proc]:
        return [Proc(WORKERS, workers, rf"{FORKED}|psbench\.systems\.ddp\.worker")]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_gloo_available()):
            return "this torch build has no torch.distributed gloo backend"
        return None

    def run(self, spec: RunSpec, options: DDPOptions, recorder: Recorder, state_out: Path | None = None,
            worker_module: str = "psbench.systems.ddp.worker", worker_args: tuple[str, ...] = ()) -> None:
        """Train; rank 0's final flat weights, momentum and buffers go to `state_out` (npy) when given.
        `worker_module` (taking systems.ddp.worker's arguments plus `worker_args`) lets a
        Strategy-Switch run the same ranks with a stop criterion."""
        if spec.workers % options.nnodes:
            raise ConfigError(f"workers ({spec.workers}) must be a multiple of option nnodes ({options.nnodes})")
        prep = prepare(spec)  # validates the workload here, and gives the shard report
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        local = spec.workers // options.nnodes
        ranks = [options.node_rank * local + i for i in range(local)]
        recorder.extra["ddp_store"] = {"master_addr": options.master_addr,
                                       "auth": "loopback" if is_loopback(options.master_addr) else "insecure"}
        # gloo picks its interface from the hostname unless told; keep local runs on loopback.
        # loopback: gloo's and NCCL's own sockets (NCCL's bootstrap, on a GPU) stay on it too
        env = child_env({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"} if is_loopback(options.master_addr)
                        else None)
        listener = bind_store_socket(options.master_addr, options.master_port) if 0 in ranks else None
        port = listener.getsockname()[1] if listener else options.master_port

        def launch(job: Path, sup: Supervisor) -> None:
            spawn_ranks(sup, job, worker_module, ranks,
                        lambda rank: ["--job", str(job), "--rank", str(rank), "--world", str(spec.workers),
                                      "--master-addr", options.master_addr, "--master-port", str(port),
                                      "--timeout-s", str(options.timeout_s), *worker_args],
                        env, listener)
            if listener is not None:
                listener.close()  # rank 0 holds its own copy now

        try:
            run_job(self.name, spec, recorder, launch, options.timeout_s, ranks, state_out,
                    rank_of=lambda i: ranks[i])
        finally:
            if listener is not None:
                listener.close()
