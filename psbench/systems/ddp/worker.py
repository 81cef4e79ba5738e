"""One DDP rank: `python -m psbench.systems.ddp.worker --job DIR --rank R --world N --master-addr A --master-port P`.
Gradients move by DistributedDataParallel's bucketed allreduce, overlapped with backward: gloo on a
CPU, NCCL on a GPU (the run's --device)."""
from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from psbench.systems.allreduce_common import backend_for, exit_now, paced_ddp, worker_main
from psbench.systems.common import StepClock


class DDPComm:
    def __init__(self, rank: int, world: int, master_addr: str, master_port: int, timeout_s: float,
                 listen_fd: int | None = None, store: dist.Store | None = None,
                 device: torch.device = torch.device("cpu")):
        timeout = timedelta(seconds=timeout_s)
        if store is None:  # `store`: one the ranks already share (psbench launch)
            # Rank 0 serves the rendezvous store on a socket its launcher bound to master_addr and
            # handed over (no free-port race; torch's own store would listen on every interface).
            store = dist.TCPStore(master_addr, master_port, world, is_master=listen_fd is not None,
                                  timeout=timeout, master_listen_fd=listen_fd)
        dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world, timeout=timeout)
        self.rank, self.size, self.device = rank, world, device

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             clock: StepClock) -> tuple[nn.Module, torch.optim.Optimizer]:
        # DDP broadcasts rank 0's parameters at construction and averages gradients in backward;
        # the optimizer already holds the same parameter tensors.
        return paced_ddp(model, clock), optimizer

    def apply(self, optimizer: torch.optim.Optimizer, clock: StepClock) -> None:
        with clock.update():  # DDP's allreduce finished inside backward
            optimizer.step()

    def barrier(self) -> None:
        dist.barrier()

    def allreduce_once(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)  # DDP's bucket allreduce: a sum, then its division by the world size
        tensor /= self.size

    def sum_floats(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)  # NCCL reduces device tensors only
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def shutdown(self) -> None:
        dist.destroy_process_group()


def build_parser(prog: str = "python -m psbench.systems.ddp.worker") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--job", type=Path, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--listen-fd", type=int, help="rank 0: listening socket for the rendezvous store")
    return p


def comm_factory(args: argparse.Namespace):
    """The communicator is made inside worker_main (its failures are reported like any other)."""
    return lambda device: DDPComm(args.rank, args.world, args.master_addr, args.master_port, args.timeout_s,
                                  args.listen_fd, device=device)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return worker_main(args.job, comm_factory(args), rank_hint=args.rank)


if __name__ == "__main__":
    exit_now(main())
