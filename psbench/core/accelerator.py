"""Where a run's model and mini-batches live (`--device`): the host's CPU, a CUDA GPU, or `auto`.

`auto` is resolved once, at plan time, to what torch sees here; a run's spec and manifest then carry
the resolved device, so a reader sees what ran. torch is imported only when a device is resolved or
used: `psbench --help` and `psbench list` stay torch-free.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from psbench.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

CPU, CUDA, AUTO = "cpu", "cuda", "auto"
DEVICES = (CPU, CUDA, AUTO)
RESOLVED = (CPU, CUDA)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def cuda_missing_reason() -> str:
    """Why torch sees no CUDA device here, in a few words."""
    import torch

    if not torch.version.cuda:
        return f"this torch ({torch.__version__}) is built without CUDA"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"


def resolve(requested: str) -> str:
    """`cpu` or `cuda`: what a run asked for, `auto` made concrete. `cuda` where torch sees no CUDA
    device is refused here, before any process starts."""
    if requested not in DEVICES:
        raise ConfigError(f"--device {requested}: allowed: {', '.join(DEVICES)}")
    if requested == AUTO:
        return CUDA if cuda_available() else CPU
    if requested == CUDA and not cuda_available():
        raise ConfigError(f"--device cuda: {cuda_missing_reason()}; allowed here: cpu, auto (resolves to cpu)")
    return requested


def torch_device(device: str, local_rank: int = 0) -> "torch.device":
    """The torch device of a resolved `device` for the process of local rank `local_rank` (one GPU
    per process on a host, as torchrun places them: cuda:local_rank modulo the GPUs seen)."""
    import torch

    if device == CPU:
        return torch.device("cpu")
    if device != CUDA:
        raise ConfigError(f"device '{device}' is not resolved; allowed: {', '.join(RESOLVED)}")
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


def synchronize(device: "torch.device") -> None:
    """Wait for the device's queued work: a CUDA kernel returns before it has run, so a step's time
    parts are taken after this. Nothing on a CPU."""
    if device.type == CUDA:
        import torch

        torch.cuda.synchronize(device)


def timed_copy(out: "torch.Tensor", tensor: "torch.Tensor", device: "torch.device") -> float:
    """Copy `tensor` into `out` across host and GPU, waiting for it; the seconds it took. Where the two
    are one tensor (a CPU run: the host buffer is the model's own) nothing is copied: 0."""
    if out is tensor:
        return 0.0
    began = time.perf_counter()
    out.copy_(tensor)
    synchronize(device)
    return time.perf_counter() - began
