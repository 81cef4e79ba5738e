"""The function TorchDistributor runs in each of its N processes (torchrun ranks): plain torch DDP
over gloo on the worker's shard (NCCL on a GPU a rank, with --device cuda). It lives in its own importable module so cloudpickle ships it by
reference; the ranks import this checkout through PYTHONPATH (systems.common.child_env)."""
from __future__ import annotations

import os
import time
from typing import Any


def train(payload: dict[str, Any]) -> bytes | None:
    """Train; rank 0 writes {rows, snapshots, times} to payload['result_path'] (atomically), or, when
    that is None (ranks in Spark tasks on other hosts), returns them as .npz bytes, which Spark
    brings back to the driver as TorchDistributor.run's result. Other ranks return None."""
    t_enter = time.time()
    exit_without_teardown()
    import torch
    import torch.distributed as dist

    from psbench.core.accelerator import torch_device
    from psbench.core.spec import RunSpec
    from psbench.systems.allreduce_common import backend_for, paced_ddp
    from psbench.systems.common import StepClock, compute_step, configure_threads, flat_params, make_optimizer, prepare
    from psbench.systems.spark.partitions import common_steps, injected_failure

    configure_threads(1)
    spec = RunSpec.from_dict(payload["spec"])
    device = torch_device(spec.device, int(os.environ.get("LOCAL_RANK", 0)))  # torchrun sets LOCAL_RANK
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device))
    rank, world = dist.get_rank(), dist.get_world_size()
    prep = prepare(spec)
    model = prep.build_model().to(device)  # same seed on every rank (DDP also broadcasts rank 0's weights)
    clock = StepClock(prep.pacer(rank), device=device)
    ddp = paced_ddp(model, clock)
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(model, prep.workload, prep.lr)
    total, every = common_steps(prep), prep.eval_every()
    n_params = sum(p.numel() for p in model.parameters())
    dist.barrier()
    t_ready = time.time()
    rows, snapshots = [], []
    for step, x, y in prep.batches(rank, clock, device):
        if step >= total:
            break
        injected_failure(step, payload["fail_at_step"], rank, world)
        loss = compute_step(ddp, loss_fn, x, y, clock, step)  # backward allreduces the gradients (gloo)
        with clock.update():
            optimizer.step()
        t = clock.split()
        rows.append({"worker": rank, "step": step, "t_epoch": time.time(), "n_samples": len(y), "loss": loss,
                     "bytes": 2 * n_params * 4 * (world - 1) // world, "step_s": time.perf_counter() - clock.start,
                     "compute_s": t.compute_s, "emulated_s": t.emulated_s, "comm_s": t.comm_s, "update_s": t.update_s,
                     "data_s": t.data_s})
        if rank == 0 and ((step + 1) % every == 0 or step + 1 == total):
            snapshots.append((step + 1, time.time(), flat_params(model)))
    # Every rank ran the same step count: gather the rows as one float64 tensor (no pickled objects).
    mine = torch.tensor([[r[k] for k in ROW_FIELDS] for r in rows], dtype=torch.float64,
                        device=device).reshape(-1, len(ROW_FIELDS))  # NCCL gathers device tensors only
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    dist.destroy_process_group()
    if rank == 0:
        table = torch.cat(gathered).cpu().numpy()
        if payload["result_path"] is None:
            return result_bytes(table, snapshots, t_enter, t_ready)
        write_result(payload["result_path"], table, snapshots, t_enter, t_ready)
    return None


def exit_without_teardown() -> None:
    """Once TorchDistributor's script has run and saved this rank's output, leave without interpreter
    teardown. Teardown of torch's native threads can abort ('terminate called without an active
    exception', SIGABRT) after the rank's work is done; torchrun then reports that node failed and
    the agent on the other node waits 300 s in its exit barrier: a finished run seen as a hang. The
    exit status stays honest: 1 if the script ended with an uncaught exception."""
    import atexit
    import sys

    failed: list[bool] = []
    previous_hook = sys.excepthook

    def record_failure(*exc_info) -> None:
        failed.append(True)
        previous_hook(*exc_info)

    def leave() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)

    sys.excepthook = record_failure
    atexit.register(leave)


ROW_FIELDS = ("worker", "step", "t_epoch", "n_samples", "loss", "bytes", "step_s", "compute_s", "emulated_s", "comm_s",
              "update_s", "data_s")
_INT_FIELDS = {"worker", "step", "n_samples", "bytes"}


def _arrays(rows, snapshots: list, t_enter: float, t_ready: float) -> dict:
    import numpy as np

    return {"rows": np.asarray(rows, dtype=np.float64),
              "snapshot_steps": np.array([s[0] for s in snapshots], dtype=np.int64),
              "snapshot_times": np.array([s[1] for s in snapshots], dtype=np.float64),
              "snapshot_weights": np.stack([s[2] for s in snapshots]) if snapshots else np.zeros((0, 0), np.float32),
              "times": np.array([t_enter, t_ready], dtype=np.float64)}


def write_result(path: str, rows, snapshots: list, t_enter: float, t_ready: float) -> None:
    """Rank 0's result as one .npz (rows, snapshot weights, times), renamed into place."""
    import numpy as np

    tmp = path + ".tmp.npz"
    np.savez(tmp, **_arrays(rows, snapshots, t_enter, t_ready))
    os.replace(tmp, path)


def result_bytes(rows, snapshots: list, t_enter: float, t_ready: float) -> bytes:
    """The same .npz as write_result, as bytes (arrays only: nothing pickled)."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **_arrays(rows, snapshots, t_enter, t_ready))
    return buf.getvalue()


def read_result(source: str | bytes) -> dict[str, Any]:
    """A result written by write_result (a path) or returned by result_bytes."""
    import io

    import numpy as np

    with np.load(io.BytesIO(source) if isinstance(source, bytes) else source, allow_pickle=False) as f:
        rows = [{k: (int(v) if k in _INT_FIELDS else float(v)) for k, v in zip(ROW_FIELDS, row)} for row in f["rows"]]
        snapshots = list(zip(f["snapshot_steps"].tolist(), f["snapshot_times"].tolist(), list(f["snapshot_weights"])))
        t_enter, t_ready = f["times"].tolist()
    return {"rows": rows, "snapshots": snapshots, "t_enter": t_enter, "t_ready": t_ready}
