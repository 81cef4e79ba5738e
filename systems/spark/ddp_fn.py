"""The function TorchDistributor runs in each of its N processes (torchrun ranks): plain torch DDP
over gloo on the worker's shard. It lives in its own importable module so cloudpickle ships it by
reference; the ranks import this checkout through PYTHONPATH (systems.common.child_env)."""
from __future__ import annotations

import os
import pickle
import time
from typing import Any


def train(payload: dict[str, Any]) -> None:
    """Train; rank 0 writes {rows, snapshots, times} to payload['result_path'] (atomically). Every
    rank returns None: TorchDistributor has each rank write its return value to one shared file."""
    t_enter = time.time()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bench.spec import RunSpec
    from systems.common import configure_threads, flat_params, forward_backward, make_optimizer, prepare
    from systems.spark.partitions import common_steps, injected_failure

    configure_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = RunSpec.from_dict(payload["spec"])
    prep = prepare(spec)
    model = prep.build_model()  # same seed on every rank (DDP also broadcasts rank 0's weights)
    ddp = DistributedDataParallel(model)
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(model, prep.workload, prep.lr)
    total, every = common_steps(prep), prep.eval_every()
    n_params = sum(p.numel() for p in model.parameters())
    dist.barrier()
    t_ready = time.time()
    rows, snapshots = [], []
    for step, x, y in prep.batches(rank):
        if step >= total:
            break
        injected_failure(step, payload["fail_at_step"], rank, world)
        t0 = time.perf_counter()
        loss = forward_backward(ddp, loss_fn, x, y)  # backward allreduces the gradients (gloo)
        optimizer.step()
        rows.append({"worker": rank, "step": step, "t_epoch": time.time(), "n_samples": len(y), "loss": loss,
                     "bytes": 2 * n_params * 4 * (world - 1) // world, "step_s": time.perf_counter() - t0})
        if rank == 0 and ((step + 1) % every == 0 or step + 1 == total):
            snapshots.append((step + 1, time.time(), flat_params(model)))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    dist.destroy_process_group()
    if rank == 0:
        result = {"rows": [r for part in gathered for r in part], "snapshots": snapshots,
                  "t_enter": t_enter, "t_ready": t_ready}
        tmp = payload["result_path"] + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(result, f)
        os.replace(tmp, payload["result_path"])
