"""What the peer parameter servers (`ray-ps`, `rpc-ps`) share: their options, a shard's update rule,
the worker side (a model on its data shard, gradients split by shard, step rows, worker 0's
snapshots) and reading a finished run into the Recorder. The peers differ only in how gradients
and parameters move: Ray's actor calls and object store, or torch.distributed.rpc.

Same as `ps`, so the comparison is of the transport alone: the data shards (`prepare`), keys split
across shards by size (`partition_keys`), the workload's SGD applied on the server with ps's
settings (`resolve_step`: one reduction of the async step, lr kept and momentum 1 - (1 - m) * N
under asp by default; averaged gradients under bsp), staleness = the shard's version when a gradient is applied
minus the version the worker computed it on, evaluation of worker 0's snapshots off the clock.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from psbench.core.records import Recorder, split_sync_wait
from psbench.core.spec import RunSpec
from psbench.systems.base import option
from psbench.systems.common import (Prepared, StepClock, compute_step, configure_threads, evaluate_splits, prepare,
                                    record_evals)
from psbench.systems.ps.launch import ROW_COLUMNS, WorkerReport  # a worker's rows (t_wall: epoch seconds here) and snapshots
from psbench.systems.ps.partition import partition_keys
from psbench.systems.ps.policies import resolve_step
from psbench.core.errors import ConfigError

# Ray hands numpy arrays out of its object store read-only; the optimizer only reads gradients.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class PeerFailed(RuntimeError):
    """A peer run failed (a process, actor or call); the message names which and why."""


@dataclass(frozen=True)
class PeerOptions:
    consistency: str = option("asp", "asp (apply each gradient on arrival) | bsp (average one gradient per worker, "
                                     "then answer all)")
    servers: int = option(1, "number of server shards (keys split by size across them, as for ps)")
    lr_scaling: str = option("auto", "as for ps: the async step's one reduction; auto | 1/n | none | a factor")
    momentum_scaling: str = option("auto", "as for ps: auto (completes the one reduction) | scaled | none | a momentum")
    timeout_s: float = option(1800.0, "stop every process and fail after this many seconds")

    def __post_init__(self) -> None:
        if self.consistency not in ("asp", "bsp"):
            raise ConfigError(f"consistency '{self.consistency}' is not supported by the peer systems; allowed: asp | bsp")
        if self.servers < 1:
            raise ConfigError(f"servers must be >= 1, got {self.servers}")
        resolve_step(self.lr_scaling, self.momentum_scaling, self.consistency, 1, 0.9)  # the words, early
        if not self.timeout_s > 0:
            raise ConfigError(f"option timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class ShardPlan:
    """Everything a server shard needs to start: its keys' initial tensors and the update rule."""
    tensors: list[np.ndarray]
    lr: float
    momentum: float
    weight_decay: float


def layout(prep: Prepared, servers: int) -> list[list[int]]:
    """Which keys (parameter tensors, in model order) each shard owns: the split `ps` uses."""
    return partition_keys([p.numel() for p in prep.build_model().parameters()], servers)


def shard_plans(prep: Prepared, options: PeerOptions) -> list[ShardPlan]:
    tensors = [p.detach().numpy().copy() for p in prep.build_model().parameters()]
    opt = prep.workload.optimizer
    step = resolve_step(options.lr_scaling, options.momentum_scaling, options.consistency, prep.spec.workers,
                        opt.momentum)
    lr, momentum = prep.lr * step.lr_factor, step.momentum
    return [ShardPlan([tensors[k] for k in keys], lr, momentum, opt.weight_decay)
            for keys in layout(prep, options.servers)]


class ShardCore:
    """A shard's parameters under torch.optim.SGD, as both peers' own examples keep them. `apply`
    takes one gradient (asp) or one per worker of a round (bsp: averaged), in key order."""

    def __init__(self, plan: ShardPlan):
        configure_threads(1)
        self.params = [torch.nn.Parameter(torch.from_numpy(np.array(t, np.float32))) for t in plan.tensors]
        self.optimizer = torch.optim.SGD(self.params, lr=plan.lr, momentum=plan.momentum,
                                         weight_decay=plan.weight_decay)
        self.version = 0  # updates applied

    def apply(self, grads: Sequence[Sequence[Any]]) -> None:
        for i, p in enumerate(self.params):
            parts = [torch.as_tensor(g[i]) for g in grads]
            p.grad = parts[0] if len(parts) == 1 else torch.stack(parts).mean(0)
        self.optimizer.step()
        self.version += 1

    def weights(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.params]


class PeerWorker:
    """A worker's model on its data shard. Per step: `receive` the shards' fresh parameters (this
    completes the row of the step whose push they answer), `compute` the next gradient, split by
    shard. Worker 0 keeps a copy of the parameters every eval_every steps, as `ps`'s worker 0 does."""

    def __init__(self, spec: RunSpec, worker: int, n_shards: int):
        configure_threads(1)
        self.prep = prepare(spec)
        self.worker = worker
        self.model = self.prep.build_model()
        self.loss_fn = self.prep.workload.loss_fn()
        self.params = list(self.model.parameters())
        self.buffers = [b for b in self.model.buffers() if b.dtype.is_floating_point]
        self.layout = partition_keys([p.numel() for p in self.params], n_shards)
        self.every, self.last = self.prep.eval_every(worker), self.prep.total_steps(worker)
        self.step_bytes = 2 * 4 * sum(p.numel() for p in self.params)  # gradients out, parameters back
        self.report = WorkerReport(worker, {c: [] for c in ROW_COLUMNS})
        self.clock = StepClock(self.prep.pacer(worker))  # the one worker step: emulated device, stragglers
        self.batches = self.prep.batches(worker, self.clock)
        # (step, n_samples, loss, compute_s, emulated_s, data_s, when the push left) awaiting its reply
        self.pending: tuple[int, int, float, float, float, float, float] | None = None

    def receive(self, parts: Sequence[Sequence[Any]], staleness: int | None = None) -> None:
        loading = time.perf_counter()
        with torch.no_grad():
            for keys, tensors in zip(self.layout, parts):
                for k, t in zip(keys, tensors):
                    self.params[k].copy_(torch.as_tensor(t))
        if self.pending is None:
            return
        now, loaded = time.time(), time.perf_counter()
        step, n_samples, loss, compute_s, emulated_s, data_s, sent = self.pending
        self.pending = None
        # comm_s: push to reply (bsp: the launcher's record_run splits off the wait for the others);
        # update_s: loading the answered parameters
        values = (step, now, n_samples, loss, staleness, self.step_bytes, compute_s, emulated_s,
                  loading - sent, 0.0, loaded - loading, data_s)
        for name, value in zip(ROW_COLUMNS, values, strict=True):
            self.report.rows[name].append(value)
        done = step + 1
        if self.worker == 0 and done % self.every == 0 and done < self.last:
            self.report.snapshot_steps.append(done)
            self.report.snapshot_t.append(now)
            self.report.snapshots.append(self.flat_state())

    def compute(self) -> list[list[torch.Tensor]] | None:
        """The next mini-batch's gradients, one list per shard; None when the budget is spent."""
        step, x, y = next(self.batches, (None, None, None))
        if step is None:
            return None
        loss = compute_step(self.model, self.loss_fn, x, y, self.clock, step)
        self.pending = (step, len(y), loss, self.clock.compute_s, self.clock.emulated_s, self.clock.data_s,
                        time.perf_counter())
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        return [[grads[k] for k in keys] for keys in self.layout]

    def flat_state(self) -> np.ndarray:
        return parameters_to_vector(self.params + self.buffers).detach().numpy().copy()

    def finish(self) -> WorkerReport:
        if self.buffers:
            self.report.final_buffers = parameters_to_vector(self.buffers).detach().numpy().copy()
        return self.report


def join_shards(shard_weights: Sequence[Sequence[Any]]) -> np.ndarray:
    """The flat parameter vector (model order) from each shard's tensors (shard order)."""
    return np.concatenate([np.asarray(t, np.float32).reshape(-1) for part in shard_weights for t in part])


def record_run(prep: Prepared, recorder: Recorder, reports: Sequence[WorkerReport], t0: float, t_end: float,
               final: np.ndarray, consistency: str = "asp") -> None:
    """The run's clock (epoch seconds t0..t_end), every worker's step rows, and evaluations of the
    initial model, worker 0's snapshots and the servers' final parameters (worker 0's buffers)."""
    recorder.adopt_clock(t0, t_end, 0.0)
    rows = []
    for rep in sorted(reports, key=lambda r: r.worker):
        cols = rep.rows
        rows += [{"worker": rep.worker, **dict(zip(ROW_COLUMNS, values))}
                 for values in zip(*(cols[c] for c in ROW_COLUMNS))]
    for row in rows:
        row["t_wall"] -= t0
    if consistency == "bsp":
        split_sync_wait(rows)  # a bsp round waits for the slowest worker
    recorder.add_steps(rows)
    model = prep.build_model()
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.dtype.is_floating_point]
    start = parameters_to_vector(tensors).detach().numpy().copy()
    rep0 = next(r for r in reports if r.worker == 0)
    n_params = len(final)
    buffers = rep0.final_buffers if len(rep0.final_buffers) else start[n_params:]
    evals = [(0, t0, start)] + list(zip(rep0.snapshot_steps, rep0.snapshot_t, rep0.snapshots))
    evals.append((len(rep0.rows["step"]), t_end, np.concatenate([final, buffers])))
    loss_fn = prep.workload.loss_fn()
    for step, t, flat in evals:
        with torch.no_grad():
            vector_to_parameters(torch.from_numpy(np.array(flat, np.float32)), tensors)
        record_evals(recorder, step, evaluate_splits(model, loss_fn, prep.data), t_wall=t - t0)


def timed_out(what: str) -> PeerFailed:
    return PeerFailed(f"{what} timed out; everything it started is stopped (raise the timeout_s option for longer runs)")


def deadline_left(deadline: float, what: str) -> float:
    """Seconds left before `deadline` (time.monotonic); PeerFailed once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise timed_out(what)
    return left
