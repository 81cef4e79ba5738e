"""Worker-side loop shared by the allreduce systems (DDP over gloo, Horovod).

The two systems differ only in a small `Comm` object (how gradients move, a barrier, a sum of a
few floats); everything else (data, steps, clock, evaluation, records, final state) is here.

Files a worker writes into its job directory (read back by systems/allreduce_launch.py; no pickle):
  rank{r}.steps.csv   one row per step: worker, step, t_wall, n_samples, loss, bytes, and its time:
                      compute_s, emulated_s, comm_s (communication + waiting; split by the launcher)
  rank{r}.meta.json   clock (t_start/t_end epoch seconds, paused_s), steps done; rank 0: evals
  weights.npy / momentum.npy   rank 0's final flat weights and SGD momentum buffers (raw float32)
  rank{r}.error.json  on an exception: time, rank, one-line summary and traceback

`run_sync` is also the sync phase of a later Strategy-Switch: it stops when a criterion says so
and returns the weights and momentum buffers that an async phase can start from.
"""
from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch import nn

from psbench.core.accelerator import synchronize, torch_device
from psbench.core.spec import RunSpec
from psbench.core.supervisor import watch_launcher
from psbench.systems.common import (Prepared, StepClock, compute_step, configure_threads, evaluate_splits,
                                    flat_params, forward_backward, make_optimizer, prepare)

# "RANK:STEP": that rank raises at that step. A test hook for failure handling, off unless set.
FAULT_ENV = "PSBENCH_INJECT_FAULT"
STEP_FIELDS = ["worker", "step", "t_wall", "n_samples", "loss", "bytes", "compute_s", "emulated_s", "comm_s",
               "update_s", "data_s"]

# Called on rank 0 after each evaluation with (steps done, {split: (loss, acc)}); True stops the
# sync phase on every rank (the decision is shared by one small reduction).
StopFn = Callable[[int, dict[str, tuple[float, float]]], bool]
# Called on rank 0 after every step with (steps done, its training loss, seconds on the training
# clock); True stops the sync phase on every rank after that step (one small reduction a step
# shares the decision).
StepStopFn = Callable[[int, float, float], bool]


class Comm(Protocol):
    """How one allreduce system moves data; all calls are collective except `wrap`'s local part."""
    rank: int
    size: int
    device: torch.device  # where this rank's model, batches and collectives' tensors live

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer,
             clock: StepClock) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Return (model to train, optimizer) for `apply`. A system whose gradients start moving
        inside backward calls clock.gradients_ready(n) from its hooks before moving them (the
        pacing contract: its communication overlaps the emulated backward's rest, nothing else)."""

    def apply(self, optimizer: torch.optim.Optimizer, clock: StepClock) -> None:
        """Finish the step's communication, then the optimizer step under clock.update()."""

    def barrier(self) -> None: ...

    def allreduce_once(self, tensor: torch.Tensor) -> None:
        """Average `tensor` over the ranks the way the system averages gradients (collective)."""

    def sum_floats(self, values: list[float]) -> list[float]:
        """Elementwise sum over ranks of a few floats (float64), the result on every rank."""

    def shutdown(self) -> None: ...


class Clock:
    """Training clock of one worker: starts after set-up, leaves out rank 0's evaluation spans."""

    def __init__(self) -> None:
        self.t_start = 0.0
        self.t_end = 0.0
        self.paused_s = 0.0

    def start(self) -> None:
        self.t_start = time.time()

    def stop(self) -> None:
        self.t_end = time.time()

    def now(self) -> float:
        return time.time() - self.t_start - self.paused_s


ALONE_REPEATS = 30  # allreduces of the gradient's size timed alone after training (their median)


def time_allreduce_alone(comm: Comm, n_elements: int, repeats: int = ALONE_REPEATS) -> float:
    """Median seconds of one allreduce of a float32 tensor of the gradients' size, with no compute
    around it, in the ranks that just trained: what the step's comm_s is compared with."""
    tensor = torch.zeros(n_elements, dtype=torch.float32, device=comm.device)
    comm.allreduce_once(tensor)  # warm-up: a first collective pays set-up
    times = []
    for _ in range(repeats):
        comm.barrier()
        began = time.perf_counter()
        comm.allreduce_once(tensor)
        synchronize(comm.device)
        times.append(time.perf_counter() - began)
    return float(np.median(times))


@dataclass
class SyncResult:
    steps: int                    # steps done on every rank
    weights: np.ndarray           # rank's final flat parameters (float32)
    momentum: np.ndarray          # flat SGD momentum buffers, zeros where none yet (float32)
    stopped_early: bool = False   # the stop criterion fired before the step budget
    buffers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # float buffers (BatchNorm)
    step_rows: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)
    allreduce_alone_s: float | None = None  # time_allreduce_alone after training (None: not measured)
    # the timer evaluator's (steps done, training clock, flat parameters + float buffers), rank 0
    snapshots: list[tuple[int, float, np.ndarray]] = field(default_factory=list)


def common_steps(prep: Prepared, world: int) -> int:
    """Every rank must do the same number of steps (each step is a collective): the smallest budget."""
    return min(prep.total_steps(w) for w in range(world))


def ring_allreduce_bytes(n_params: int, world: int) -> int:
    """Bytes one rank sends per ring allreduce of float32 gradients: 2 (N-1)/N of the buffer."""
    return int(2 * (world - 1) * n_params * 4 // world) if world > 1 else 0


def flat_momentum(model: nn.Module, optimizer: torch.optim.Optimizer) -> np.ndarray:
    parts = []
    for p in model.parameters():
        buf = optimizer.state.get(p, {}).get("momentum_buffer")
        parts.append((buf if buf is not None else torch.zeros_like(p)).detach().reshape(-1))
    return torch.cat(parts).cpu().numpy().astype(np.float32)


@torch.no_grad()
def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: np.ndarray, momentum: np.ndarray) -> None:
    """Continue from a sync phase: set the weights and the SGD momentum buffers (async phase start)."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(torch.from_numpy(np.asarray(weights[offset:offset + n])).view_as(p))
        optimizer.state[p]["momentum_buffer"] = torch.from_numpy(np.array(momentum[offset:offset + n])).view_as(p).to(
            p.device, copy=True)
        offset += n


def flat_buffers(model: nn.Module) -> np.ndarray:
    """Floating-point buffers (BatchNorm running statistics), flat, in model.buffers() order."""
    parts = [b.detach().reshape(-1) for b in model.buffers() if b.dtype.is_floating_point]
    return torch.cat(parts).cpu().numpy().astype(np.float32) if parts else np.zeros(0, np.float32)


def save_state(directory: Path, weights: np.ndarray, momentum: np.ndarray, buffers: np.ndarray | None = None) -> None:
    named = [("weights", weights), ("momentum", momentum)] + ([("buffers", buffers)] if buffers is not None else [])
    for name, arr in named:
        tmp = directory / f".{name}.npy.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, np.asarray(arr, dtype=np.float32), allow_pickle=False)
        os.replace(tmp, directory / f"{name}.npy")


def read_state(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    return (np.load(Path(directory) / "weights.npy", allow_pickle=False),
            np.load(Path(directory) / "momentum.npy", allow_pickle=False))


def read_buffers(directory: Path) -> np.ndarray:
    """Rank 0's BatchNorm running statistics (empty when the model has none or none were saved)."""
    path = Path(directory) / "buffers.npy"
    return np.load(path, allow_pickle=False) if path.is_file() else np.zeros(0, np.float32)


def _fault_step(rank: int) -> int | None:
    raw = os.environ.get(FAULT_ENV, "")
    if not raw:
        return None
    want_rank, step = raw.split(":")
    return int(step) if int(want_rank) == rank else None


def run_sync(prep: Prepared, comm: Comm, should_stop: StopFn | None = None,
             max_steps: int | None = None, step_stop: StepStopFn | None = None) -> SyncResult:
    """Synchronous data-parallel training on this rank's shard until the step budget (or
    `max_steps`) runs out or `should_stop` (at evaluations) or `step_stop` (after every step) fires.
    Rank 0 evaluates at single's cadence (step 0, every `eval_every` steps, and at the end), off
    the clock: all ranks pause while it evaluates. A `step_stop` stop skips the evaluation at that
    step: whoever continues from the returned state evaluates it."""
    rank, world = comm.rank, comm.size
    model = prep.build_model().to(comm.device)  # same seed on every rank: same initial weights
    loss_fn = prep.workload.loss_fn()
    step_clock = StepClock(prep.pacer(rank), device=comm.device)
    train_model, optimizer = comm.wrap(model, make_optimizer(model, prep.workload, prep.lr), step_clock)
    n_steps = common_steps(prep, world)
    if max_steps is not None:
        n_steps = min(n_steps, max_steps)
    every = prep.eval_every()
    nbytes = ring_allreduce_bytes(sum(p.numel() for p in model.parameters()), world)
    fault = _fault_step(rank)
    deadline = prep.budget_seconds()  # --budget seconds=T: rank 0's clock decides for every rank
    result = SyncResult(0, np.empty(0, np.float32), np.empty(0, np.float32))
    clock = result.clock

    def eval_point(step: int) -> bool:
        # Rank 0 is the clock: after a barrier it evaluates, and one reduction shares its
        # evaluation time and stop decision, so every rank keeps the same span off its clock and
        # step times of all ranks stay comparable. Waiting at the barrier for a slower rank stays
        # on the clock: that is synchronisation cost, in the last step's comm_s (its columns add up).
        began = time.perf_counter()
        comm.barrier()
        if result.step_rows:
            result.step_rows[-1]["comm_s"] += time.perf_counter() - began
        stop, eval_s = False, 0.0
        if rank == 0:
            begin = time.time()
            t_wall = clock.now()
            splits = evaluate_splits(model, loss_fn, prep.data)
            for split, (loss, acc) in splits.items():
                result.evals.append({"step": step, "t_wall": t_wall, "split": split, "loss": loss, "accuracy": acc})
            stop = bool(should_stop and should_stop(step, splits))
            eval_s = time.time() - begin
        any_stop, eval_s = comm.sum_floats([1.0 if stop else 0.0, eval_s])
        clock.paused_s += eval_s
        return any_stop > 0

    timer = prep.spec.eval_every_s  # the timer evaluator: rank 0 snapshots, the launcher evaluates
    next_snapshot = 0.0

    def snapshot(step: int, final: bool = False) -> None:
        """Rank 0, at a step's end: keep the model if the clock has passed the next multiple of the
        timer (or at the run's end); no barrier, no pause: it is evaluated after the run."""
        nonlocal next_snapshot
        now = clock.t_end - clock.t_start - clock.paused_s if final else clock.now()  # final: when the clock stopped
        if rank == 0 and (final or now >= next_snapshot):
            result.snapshots.append((step, now, np.concatenate([flat_params(model), flat_buffers(model)])))
            next_snapshot = (math.floor(now / timer) + 1) * timer

    if timer is not None:
        # every point evaluation pauses for is a snapshot instead (criteria that read evaluations,
        # should_stop, are not for timer runs)
        def eval_point(step: int) -> bool:  # noqa: F811
            snapshot(step)
            return False

    comm.barrier()
    clock.start()
    # one clock for all ranks: rank 0's start (each rank leaves the barrier a little apart, so their
    # own starts would put rank r's rows off rank 0's timeline, whose clock the run adopts)
    clock.t_start = comm.sum_floats([clock.t_start if rank == 0 else 0.0])[0]
    done = 0
    stopped = eval_point(0)
    for step, x, y in prep.batches(rank, step_clock, comm.device):
        if stopped or step >= n_steps:
            break
        if fault is not None and step == fault:
            raise RuntimeError(f"injected fault at step {step} ({FAULT_ENV})")
        loss = compute_step(train_model, loss_fn, x, y, step_clock, step)
        comm.apply(optimizer, step_clock)
        done = step + 1
        fired = out_of_time = False
        if (step_stop is not None or deadline is not None) and done < n_steps:
            # one small reduction a step shares rank 0's decisions, so every rank stops after this
            # step; it is this step's communication (comm_s), a cost of deciding online
            fired, out_of_time = (v > 0 for v in comm.sum_floats(
                [float(rank == 0 and step_stop is not None and step_stop(done, loss, clock.now())),
                 float(rank == 0 and deadline is not None and clock.now() >= deadline)]))
        t = step_clock.split()
        result.step_rows.append({"worker": rank, "step": step, "t_wall": clock.now(), "n_samples": len(y),
                                 "loss": loss, "bytes": nbytes, "compute_s": t.compute_s, "emulated_s": t.emulated_s,
                                 "comm_s": t.comm_s, "update_s": t.update_s, "data_s": t.data_s})
        if fired:  # the criterion: whoever continues from here evaluates this state
            stopped = True
            break
        if out_of_time:  # --budget seconds=T: the run ends here, evaluated as at any end
            eval_point(done)
            break
        if timer is not None:
            snapshot(done)
        elif done % every == 0 or done == n_steps:
            stopped = eval_point(done)
    comm.barrier()  # the run ends when every rank has ended its last step (and recorded it)
    clock.stop()
    if timer is not None and not (result.snapshots and result.snapshots[-1][0] == done):
        snapshot(done, final=True)
    # Off the clock, every rank: the same tensors' allreduce with nothing around it. Not in a
    # switch's sync phase (a stop criterion), whose hand-over it would lengthen.
    if world > 1 and should_stop is None and step_stop is None:
        result.allreduce_alone_s = time_allreduce_alone(comm, sum(p.numel() for p in model.parameters()))
    result.steps = done
    result.stopped_early = stopped and done < n_steps
    result.weights = flat_params(model)
    result.momentum = flat_momentum(model, optimizer)
    result.buffers = flat_buffers(model)
    return result


def backend_for(device: torch.device) -> str:
    """torch.distributed's backend for a rank's device: NCCL between GPUs, gloo between CPUs."""
    return "nccl" if device.type == "cuda" else "gloo"


def paced_ddp(model: nn.Module, clock: StepClock) -> nn.Module:
    """DistributedDataParallel under the pacing contract: DDP's own allreduce hook, called as each
    gradient bucket fills during backward, first waits until the emulated backward has produced
    that bucket (clock.gradients_ready), then starts the bucket's allreduce: it overlaps the rest of
    the emulated backward, as on a device, and never the forward pass. (One bucket, as for these
    small models: the allreduce starts when the whole backward is done.)"""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    on_gpu = clock.device.type == "cuda"  # one GPU per rank: DDP's NCCL allreduce runs on it
    ddp = DistributedDataParallel(model, device_ids=[clock.device.index] if on_gpu else None)
    clock.n_elements = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def paced_allreduce(state, bucket):
        clock.gradients_ready(sum(p.numel() for p in bucket.parameters()))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, paced_allreduce)
    return ddp


# ---- the worker process ------------------------------------------------------------------

def write_snapshots(path: Path, snapshots: list[tuple[int, float, np.ndarray]]) -> None:
    """Rank 0's timer snapshots as one .npz (arrays only, nothing pickled), renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(tmp, steps=np.array([s[0] for s in snapshots], np.int64),
             t_wall=np.array([s[1] for s in snapshots], np.float64), flats=np.stack([s[2] for s in snapshots]))
    os.replace(tmp, path)


def read_snapshots(path: Path) -> list[tuple[int, float, np.ndarray]]:
    with np.load(path, allow_pickle=False) as f:
        return list(zip(f["steps"].tolist(), f["t_wall"].tolist(), list(f["flats"])))


def read_job(job_dir: Path) -> RunSpec:
    return RunSpec.from_dict(json.loads((Path(job_dir) / "spec.json").read_text()))


def write_outputs(job_dir: Path, rank: int, result: SyncResult) -> None:
    tmp = job_dir / f".rank{rank}.steps.csv.tmp"
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=STEP_FIELDS)
        writer.writeheader()
        writer.writerows(result.step_rows)
    os.replace(tmp, job_dir / f"rank{rank}.steps.csv")
    meta = {"rank": rank, "t_start": result.clock.t_start, "t_end": result.clock.t_end,
            "paused_s": result.clock.paused_s, "steps": result.steps, "evals": result.evals,
            "allreduce_alone_s": result.allreduce_alone_s}
    tmp = job_dir / f".rank{rank}.meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, job_dir / f"rank{rank}.meta.json")
    if rank == 0:
        save_state(job_dir, result.weights, result.momentum, result.buffers)
        if result.snapshots:
            write_snapshots(job_dir / "snapshots.npz", result.snapshots)


def write_error(job_dir: Path, rank: int, exc: BaseException) -> None:
    info = {"time": time.time(), "rank": rank, "summary": f"{type(exc).__name__}: {exc}".splitlines()[0],
            "traceback": traceback.format_exc()}
    (Path(job_dir) / f"rank{rank}.error.json").write_text(json.dumps(info))


def worker_main(job_dir: Path, make_comm: Callable[[torch.device], Comm], rank_hint: int = -1,
                should_stop: StopFn | None = None, max_steps: int | None = None,
                make_step_stop: Callable[[Prepared], StepStopFn] | None = None) -> int:
    """Body of a worker process: set up, train, write outputs; on failure write rank{r}.error.json.
    `rank_hint` names the rank in an error raised before the communicator knows it (-1: unknown).
    With `should_stop`/`max_steps`/`make_step_stop` (built from the prepared run, on every rank;
    only rank 0's is asked) it is the sync phase of a switch: weights.npy and momentum.npy in the
    job directory are where the async phase starts. `make_comm` is given the rank's device: its
    spec's, on a GPU the one of its local rank (torchrun's LOCAL_RANK, else its rank: one host)."""
    job_dir = Path(job_dir)
    watch_launcher()
    configure_threads(1)
    rank = rank_hint
    try:
        spec = read_job(job_dir)
        prep = prepare(spec)
        device = torch_device(spec.device, int(os.environ.get("LOCAL_RANK", max(rank, 0))))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        comm = make_comm(device)
        rank = comm.rank
        step_stop = make_step_stop(prep) if make_step_stop is not None else None
        result = run_sync(prep, comm, should_stop, max_steps, step_stop)
        write_outputs(job_dir, rank, result)
        comm.shutdown()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the launcher
        write_error(job_dir, rank, exc)
        return 1
    return 0


def exit_now(code: int) -> None:
    """Leave without interpreter teardown. Every output is written and closed and the communicator
    shut down by now; teardown of torch's native threads took seconds here and could abort
    ("terminate called without an active exception"), turning a finished run into a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def concat_batch_reference(spec: RunSpec, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Single-process SGD on the concatenation of every rank's mini-batch, step by step: what
    synchronous allreduce training must equal (averaged gradients of equal-size batches are the
    gradient of the mean loss over their union). Returns (flat weights, flat momentum)."""
    configure_threads(1)
    prep = prepare(spec)
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(model, prep.workload, prep.lr)
    streams = [prep.batches(w) for w in range(spec.workers)]
    for _ in range(min(steps, common_steps(prep, spec.workers))):
        parts = [next(s) for s in streams]
        x = torch.cat([p[1] for p in parts])
        y = torch.cat([p[2] for p in parts])
        forward_backward(model, loss_fn, x, y)
        optimizer.step()
    return flat_params(model), flat_momentum(model, optimizer)
