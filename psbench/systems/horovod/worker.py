"""One Horovod rank, started by `horovodrun --gloo -np N -H ... python -m psbench.systems.horovod.worker --job DIR`.
Gradients move by hvd.DistributedOptimizer's allreduce (average), started from per-parameter hooks."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn

from psbench.systems.allreduce_common import exit_now, worker_main
from psbench.systems.common import StepClock


class HorovodComm:
    def __init__(self, device: torch.device) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        self.device = device  # the host: this Horovod is built for gloo on host tensors (HorovodSystem.devices)
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self._n = 0

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             clock: StepClock) -> tuple[nn.Module, torch.optim.Optimizer]:
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self._pace(model, clock)  # before Horovod's own hooks, so each of them runs after ours
        return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)

    def _pace(self, model: nn.Module, clock: StepClock) -> None:
        """The pacing contract for Horovod: DistributedOptimizer starts a parameter's allreduce from
        a hook on its gradient accumulator as soon as backward has produced it. A hook of ours on
        the same accumulator, registered first, runs just before: it waits until the emulated
        backward has produced that gradient too, so the allreduce overlaps the rest of the
        emulated backward only (without it, Horovod's allreduce ran during the whole sleep)."""
        params = [p for p in model.parameters() if p.requires_grad]
        clock.n_elements = sum(p.numel() for p in params)
        self._accumulators = []  # kept alive: the hooks live on these autograd nodes
        for p in params:
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]  # how Horovod finds it too
            accumulator.register_hook(lambda *_, n=p.numel(): clock.gradients_ready(n))
            self._accumulators.append(accumulator)

    def apply(self, optimizer: torch.optim.Optimizer, clock: StepClock) -> None:
        optimizer.synchronize()  # wait for the allreduces started in backward: communication
        with optimizer.skip_synchronize(), clock.update():
            optimizer.step()

    def _name(self, what: str) -> str:
        self._n += 1  # collective names must match across ranks: same call order, same counter
        return f"psbench.{what}.{self._n}"

    def barrier(self) -> None:
        self.hvd.allreduce(torch.zeros(1), name=self._name("barrier"), op=self.hvd.Sum)

    def allreduce_once(self, tensor: torch.Tensor) -> None:
        self.hvd.allreduce_(tensor, name=self._name("alone"), op=self.hvd.Average)

    def sum_floats(self, values: list[float]) -> list[float]:
        t = self.hvd.allreduce(torch.tensor(values, dtype=torch.float64), name=self._name("sum"), op=self.hvd.Sum)
        return t.tolist()

    def shutdown(self) -> None:
        self.hvd.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m psbench.systems.horovod.worker")
    p.add_argument("--job", type=Path, required=True)
    args = p.parse_args(argv)
    # across hosts the job folder is per host: ROOT/{host}, host as horovodrun named it (remote.py)
    args.job = Path(str(args.job).replace("{host}", os.environ.get("HOROVOD_HOSTNAME", "localhost")))
    # horovodrun sets HOROVOD_RANK before hvd.init(); it names the rank of an early failure.
    return worker_main(args.job, HorovodComm, rank_hint=int(os.environ.get("HOROVOD_RANK", -1)))


if __name__ == "__main__":
    exit_now(main())
