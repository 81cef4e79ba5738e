"""Worker-side code every system shares: data on a shard, one gradient step, evaluation, and flat
views of parameters and gradients. Systems differ only in how gradients and parameters move."""
from __future__ import annotations

import itertools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from psbench.core.accelerator import synchronize
from psbench.core.emulation import Pacer, pacer_for
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.workloads import Dataset, Workload, get_workload
from psbench.workloads.datasets import cache_dir
from psbench.workloads.sharding import ShardPlan, make_shards_cached

BUDGET_STEP_CAP = 10 ** 9  # per-worker steps under a global budget: never the limit
TRAIN_EVAL_EXAMPLES = 2048  # training metrics are measured on a fixed subset, for speed


def configure_threads(n_threads: int = 1) -> None:
    """One intra-op thread per worker process: N workers then use N cores, as on N hosts."""
    torch.set_num_threads(n_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


@dataclass
class Prepared:
    """A run's workload made concrete: data, shards, the seeded initial model and settings."""
    spec: RunSpec
    workload: Workload
    data: Dataset
    plan: ShardPlan
    epochs: int
    batch_size: int
    lr: float

    def build_model(self) -> nn.Module:
        return self.workload.build_model(self.data, self.spec.seed)

    def steps_per_epoch(self, worker: int = 0) -> int:
        return max(1, math.ceil(len(self.plan.shards[worker]) / self.batch_size))

    def budget_updates(self, samples_per_update: int) -> int | None:
        """The global budget in server updates (--budget updates=N, or samples=N over the samples
        one update carries: a batch under asp/ssp, every worker's batch under bsp), or None."""
        if self.spec.budget is None:
            return None
        kind, _, n = self.spec.budget.partition("=")
        if kind == "seconds":
            return None
        return int(n) if kind == "updates" else math.ceil(int(n) / samples_per_update)

    def budget_seconds(self) -> float | None:
        """--budget seconds=T: the training clock's T, where every worker stops; else None."""
        kind, _, value = (self.spec.budget or "").partition("=")
        return float(value) if kind == "seconds" else None

    def total_steps(self, worker: int = 0) -> int:
        if self.spec.budget is not None:  # the global budget ends the run, not a per-worker count
            return BUDGET_STEP_CAP
        steps = self.epochs * self.steps_per_epoch(worker)
        return min(steps, self.spec.max_steps) if self.spec.max_steps else steps

    def eval_every(self, worker: int = 0) -> int:
        return max(1, self.steps_per_epoch(worker) // self.spec.evals_per_epoch)

    def pacer(self, worker: int) -> Pacer:
        """This worker's emulated device and straggler schedule (inactive when the spec sets none)."""
        s = self.spec
        return pacer_for(s.emulate_device, s.stragglers, s.workload, worker, s.workers, s.seed)

    def batches(self, worker: int, clock: StepClock | None = None,
                device: torch.device | None = None) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(step, x, y) over the worker's shard until total_steps, as a DataLoader over a shuffled
        array reads it: each epoch the shard's rows are gathered once in that epoch's seeded order
        (`epoch_order`), then each step is a contiguous slice of that array, a view, no copy. A
        `clock` is told each batch's assembly time (StepClock.fetched: the step's data_s); an
        epoch's gather lands on its first step. On a GPU `device` the batch is copied there, inside
        its assembly time."""
        shard = self.plan.shards[worker]
        last = self.total_steps(worker)
        one_batch = self.batch_size >= len(shard)  # every epoch is the same single batch
        step, x, y = 0, None, None
        for epoch in (itertools.count() if self.spec.budget is not None else range(self.epochs)):
            if step >= last:
                return
            began = time.perf_counter()
            if x is None or not one_batch:  # one batch an epoch: the same rows every epoch, gathered once
                x, y = epoch_arrays(self.data, epoch_order(self.spec.seed, worker, epoch, shard, self.batch_size))
            for start in range(0, len(shard), self.batch_size):
                if step >= last:
                    return
                xb = torch.from_numpy(x[start:start + self.batch_size])
                yb = torch.from_numpy(y[start:start + self.batch_size])
                if device is not None and device.type != "cpu":
                    xb, yb = xb.to(device), yb.to(device)
                    synchronize(device)
                if clock is not None:
                    clock.fetched(time.perf_counter() - began)
                yield step, xb, yb
                step += 1
                began = time.perf_counter()


def epoch_order(seed: int, worker: int, epoch: int, shard: Sequence[int], batch_size: int) -> np.ndarray:
    """The training rows (global indices) of a worker's epoch in the order its steps read them, the
    one seeded shuffle every system's batches follow (Prepared.batches, Spark's ShardBlock): a
    permutation of the shard, each batch's rows then in index order (the batch is the same set, and
    the gather reads memory forward: ~4x faster than in random order at 800k rows here)."""
    order = np.random.default_rng((seed, worker, epoch)).permutation(np.asarray(shard))
    full = len(order) // batch_size * batch_size
    order[:full].reshape(-1, batch_size).sort(axis=1)
    order[full:].sort()
    return order


def epoch_arrays(data: Dataset, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An epoch's rows gathered once, in order: each step then reads a contiguous slice of them."""
    return np.take(data.x_train, order, axis=0), np.take(data.y_train, order, axis=0)


def prepare(spec: RunSpec) -> Prepared:
    workload = get_workload(spec.workload)
    data = workload.load_data(data_dir=spec.data_dir)
    plan = make_shards_cached(data.y_train, data.x_train, spec.workers, spec.sharding, spec.seed, cache_dir())
    return Prepared(spec, workload, data, plan,
                    epochs=spec.epochs or workload.epochs,
                    batch_size=spec.batch_size or workload.batch_size,
                    lr=spec.lr or workload.optimizer.lr)


def forward_backward(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     grads: Sequence[torch.Tensor] | None = None) -> float:
    """Zero the gradients, then compute them for one mini-batch; returns the loss. `grads`: one
    tensor per parameter (e.g. views of one flat buffer, the PS's tensor fusion) that backward
    accumulates into, zeroed first, instead of fresh tensors: the same values."""
    model.train()
    if grads is None:
        for p in model.parameters():
            p.grad = None
    else:
        for p, g in zip(model.parameters(), grads, strict=True):
            g.zero_()
            p.grad = g
    loss = loss_fn(model(x), y)
    loss.backward()
    return float(loss.detach())


@dataclass(frozen=True)
class StepTimes:
    """One step's time split, as the step rows record it (psbench/core/records.py)."""
    compute_s: float   # real gradient computation
    emulated_s: float  # the emulated device's (or a straggler's) sleep
    comm_s: float      # the rest: moving gradients and parameters (with waiting, until split off)
    update_s: float    # the optimizer step / loading the new parameters
    data_s: float = 0.0  # assembling the step's mini-batch (before the clock's begin)


class StepClock:
    """Times one worker step, the same way in every system, under the one pacing contract
    (psbench/core/emulation.py, ARCHITECTURE.md "Pacing"): the real gradient computation; the
    emulated device's sleep, paid as the gradients become ready; whatever follows (moving gradients
    and parameters, waiting on other workers); the optimizer step (`update`).

        loss = compute_step(model, loss_fn, x, y, clock, step)   # every gradient ready, device paid
        <communicate>
        with clock.update():
            optimizer.step()
        times = clock.split()

    A system that moves gradients inside backward calls `gradients_ready(n)` from its hooks before
    it starts moving those n elements (paced_ddp, the Horovod adapter): it waits until the
    emulated backward has produced them, so its communication overlaps the rest of the backward
    part only.
    """

    def __init__(self, pacer: Pacer, n_elements: int = 0, device: torch.device | None = None):
        self.pacer = pacer
        self.n_elements = n_elements  # gradient elements of the model (for gradients_ready)
        # a GPU's kernels return before they run: its compute and update are timed once it is idle
        self.device = device if device is not None else torch.device("cpu")
        self.start = 0.0
        self.step = self.batch = 0
        self.compute_s: float | None = None
        self.emulated_s = self.update_s = self.data_s = 0.0
        self._fetched_s = 0.0
        self._ready = 0

    def fetched(self, seconds: float) -> None:
        """The next step's mini-batch took `seconds` to assemble (Prepared.batches says so before
        yielding it): that step's data_s, outside its compute and emulated device."""
        self._fetched_s = seconds

    def begin(self, step: int, batch: int) -> None:
        self.start = time.perf_counter()
        self.step, self.batch = step, batch
        self.compute_s, self.emulated_s, self.update_s, self._ready = None, 0.0, 0.0, 0
        self.data_s, self._fetched_s = self._fetched_s, 0.0

    def ready(self, fraction: float) -> None:
        """The gradients of `fraction` of the model are computed: sleep until the emulated device
        has them too. At 1.0 the step's compute is done and its real part is taken."""
        if self.compute_s is not None:
            return
        elapsed = time.perf_counter() - self.start
        real = elapsed - self.emulated_s
        owed = self.pacer.due_s(self.step, self.batch, fraction, real) - elapsed
        if owed > 0:
            slept = time.perf_counter()
            time.sleep(owed)
            # an oversleep of a loaded machine is counted here, not hidden in the next phase
            self.emulated_s += time.perf_counter() - slept
        if fraction >= 1.0:
            self.compute_s = real

    def gradients_ready(self, n: int) -> None:
        """A backward hook's `n` more gradient elements are ready (of n_elements in all)."""
        self._ready += n
        self.ready(self._ready / self.n_elements if self.n_elements else 1.0)

    def computed(self) -> None:
        """Backward is done: every gradient is ready (once per step)."""
        self.ready(1.0)

    @contextmanager
    def update(self) -> Iterator[None]:
        """Time the optimizer step (or loading new parameters): real work, its own column."""
        began = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.update_s += time.perf_counter() - began

    def split(self) -> StepTimes:
        """The step so far: compute, emulated, the rest (communication and waiting), update, and the
        batch's assembly before it."""
        total = time.perf_counter() - self.start
        compute = self.compute_s if self.compute_s is not None else total - self.emulated_s - self.update_s
        rest = max(0.0, total - compute - self.emulated_s - self.update_s)
        return StepTimes(compute, self.emulated_s, rest, self.update_s, self.data_s)


def compute_step(model: nn.Module, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor, clock: StepClock,
                 step: int, grads: Sequence[torch.Tensor] | None = None) -> float:
    """The one worker step every system runs: the real gradient of a mini-batch (into `grads`, see
    forward_backward), then the pacer's sleep. Starts the step's clock; returns the loss."""
    clock.begin(step, len(y))
    loss = forward_backward(model, loss_fn, x, y, grads)
    synchronize(clock.device)
    clock.computed()
    return loss


@torch.no_grad()
def evaluate(model: nn.Module, loss_fn: nn.Module, x: np.ndarray, y: np.ndarray,
             batch_size: int = 1024) -> tuple[float, float]:
    """Mean loss and accuracy over (x, y), on the device the model is on."""
    model.eval()
    device = next(model.parameters()).device
    total_loss, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        xb = torch.from_numpy(x[start:start + batch_size]).to(device)
        yb = torch.from_numpy(y[start:start + batch_size]).to(device)
        logits = model(xb)
        total_loss += float(loss_fn(logits, yb)) * len(yb)
        correct += int((logits.argmax(1) == yb).sum())
    return total_loss / len(x), correct / len(x)


def evaluate_splits(model: nn.Module, loss_fn: nn.Module, data: Dataset) -> dict[str, tuple[float, float]]:
    """{'train': (loss, acc), 'val': (loss, acc)}; train on a fixed subset for speed."""
    n = min(TRAIN_EVAL_EXAMPLES, len(data.x_train))
    return {"train": evaluate(model, loss_fn, data.x_train[:n], data.y_train[:n]),
            "val": evaluate(model, loss_fn, data.x_val, data.y_val)}


def record_evals(recorder, step: int, results: dict[str, tuple[float, float]], t_wall: float | None = None) -> None:
    for split, (loss, acc) in results.items():
        recorder.eval(step, split, loss, acc, t_wall=t_wall)


def evaluate_snapshots(recorder, model: nn.Module, loss_fn: nn.Module, data: Dataset,
                       snapshots: Sequence[tuple[int, float, np.ndarray]]) -> None:
    """Evaluate (steps done, training clock, flat parameters + float buffers) snapshots taken during a
    run, after it (off its clock), each stamped with when it was taken."""
    n_params = sum(p.numel() for p in model.parameters())
    for step, t_wall, flat in snapshots:
        set_flat_params(model, flat[:n_params])
        set_flat_buffers(model, flat[n_params:])
        record_evals(recorder, step, evaluate_splits(model, loss_fn, data), t_wall=t_wall)


# ---- flat views (for systems that move one buffer per step) ------------------------------

def flat_params(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().numpy().astype(np.float32)


def flat_grads(model: nn.Module) -> np.ndarray:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()]).cpu().numpy().astype(np.float32)


@torch.no_grad()
def set_flat_params(model: nn.Module, flat: np.ndarray) -> None:
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(torch.from_numpy(np.asarray(flat[offset:offset + n])).view_as(p))
        offset += n


def split_flat(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """One flat float32 buffer cut into arrays of the given shapes (the reverse of flat_params)."""
    out, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(np.ascontiguousarray(flat[offset:offset + n], dtype=np.float32).reshape(shape))
        offset += n
    if offset != len(flat):
        raise ConfigError(f"a flat buffer of {len(flat)} values for shapes that hold {offset}")
    return out


def float_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The model's floating-point buffers (BatchNorm running statistics): not trained by gradients."""
    return [b for b in model.buffers() if b.dtype.is_floating_point]


def flat_buffers(model: nn.Module) -> np.ndarray:
    buffers = float_buffers(model)
    if not buffers:
        return np.zeros(0, np.float32)
    return np.concatenate([b.detach().cpu().numpy().reshape(-1) for b in buffers]).astype(np.float32)


@torch.no_grad()
def set_flat_buffers(model: nn.Module, flat: np.ndarray) -> None:
    """Load float buffers written by flat_buffers (a Strategy-Switch hand-off, worker 0's statistics)."""
    buffers = float_buffers(model)
    if len(flat) != sum(b.numel() for b in buffers):
        raise ValueError(f"{len(flat)} buffer values for a model whose buffers hold {sum(b.numel() for b in buffers)}")
    offset = 0
    for b in buffers:
        b.copy_(torch.from_numpy(np.array(flat[offset:offset + b.numel()])).view_as(b))
        offset += b.numel()


def make_optimizer(model: nn.Module, workload: Workload, lr: float) -> torch.optim.Optimizer:
    opt = workload.optimizer
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay)


REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for processes a system starts (workers, servers, Spark executors): this
    checkout's packages first on PYTHONPATH, then the folders the user's workload modules were
    imported from (workloads/user.py), one thread each, plus `extra`."""
    import os

    from psbench.workloads.user import pythonpath_with_roots

    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with_roots(
        os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.update(extra or {})
    return env
