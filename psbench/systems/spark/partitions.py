"""Executor-side pieces the Spark adapters share: one worker's shard as one RDD record, the same
mini-batch schedule as systems.common.Prepared.batches, and the model a task trains."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from psbench.systems.common import Prepared, epoch_order


@dataclass
class ShardBlock:
    """One worker's training shard, held by one Spark partition (MLlib 'blockifies' rows likewise)."""
    worker: int
    shard: np.ndarray       # global indices, in the plan's order (the batch schedule permutes this)
    sorted_idx: np.ndarray  # the same indices sorted: row i of x/y is example sorted_idx[i]
    x: np.ndarray
    y: np.ndarray
    seed: int
    batch_size: int

    @property
    def steps_per_epoch(self) -> int:
        return max(1, math.ceil(len(self.shard) / self.batch_size))

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The mini-batch Prepared.batches(worker) yields at `step` (the same epoch order, the same
        rows). A task holds its block for one step only, so it gathers that batch's rows alone."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        if self.batch_size >= len(self.shard):
            epoch = 0  # one batch an epoch: Prepared.batches keeps epoch 0's order (the same rows)
        order = epoch_order(self.seed, self.worker, epoch, self.shard, self.batch_size)
        local = np.searchsorted(self.sorted_idx, order[pos * self.batch_size:(pos + 1) * self.batch_size])
        return torch.from_numpy(self.x[local]), torch.from_numpy(self.y[local])


def shard_block(prep: Prepared, worker: int) -> ShardBlock:
    shard = np.asarray(prep.plan.shards[worker], dtype=np.int64)
    sorted_idx = np.sort(shard)
    return ShardBlock(worker, shard, sorted_idx, prep.data.x_train[sorted_idx], prep.data.y_train[sorted_idx],
                      prep.spec.seed, prep.batch_size)


def common_steps(prep: Prepared) -> int:
    """Synchronous systems step together: every worker runs as many steps as the smallest shard allows."""
    return min(prep.total_steps(w) for w in range(prep.spec.workers))


@dataclass(frozen=True)
class ModelSpec:
    """What a task needs to rebuild the run's model and optimizer without the dataset."""
    workload: str
    input_shape: tuple[int, ...]
    n_classes: int
    seed: int
    lr: float

    @classmethod
    def of(cls, prep: Prepared) -> "ModelSpec":
        return cls(prep.workload.name, prep.data.input_shape, prep.data.n_classes, prep.spec.seed, prep.lr)

    def build(self) -> tuple[nn.Module, nn.Module]:
        from psbench.workloads import get_workload

        workload = get_workload(self.workload)
        return workload.model_for(self.input_shape, self.n_classes, self.seed), workload.loss_fn()

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        from psbench.systems.common import make_optimizer
        from psbench.workloads import get_workload

        return make_optimizer(model, get_workload(self.workload), self.lr)


_MODELS: dict[ModelSpec, tuple[nn.Module, nn.Module]] = {}


def cached_model(spec: ModelSpec) -> tuple[nn.Module, nn.Module]:
    """Python workers are reused across tasks: build the model structure once per worker process;
    its weights are overwritten from the broadcast every step."""
    if spec not in _MODELS:
        _MODELS.clear()
        _MODELS[spec] = spec.build()
    return _MODELS[spec]


def injected_failure(step: int, fail_at_step: int, worker: int, workers: int) -> None:
    if fail_at_step >= 0 and step == fail_at_step and worker == workers - 1:
        raise RuntimeError(f"injected failure in worker {worker} at step {step} (option fail_at_step)")


def clock_mapper(recorder: Any) -> Any:
    """Map epoch timestamps taken in other processes onto the recorder's training clock
    (valid while nothing is paused between now and those timestamps)."""
    import time

    clock_now, epoch_now = recorder.now(), time.time()
    return lambda t_epoch: clock_now + (t_epoch - epoch_now)


def adopt_task_clock(recorder: Any, t_first: float, t_last: float) -> Any:
    """Training ran in tasks (other processes, maybe other hosts): the run's clock is theirs, from
    when every task was ready to train (t_first, epoch s) to the last step's end (t_last). What came
    before (the session, the data, the job's launch: scheduling, Python workers, torchrun) is the
    launch column (setup_s), never the first step's time. Returns the epoch -> clock map."""
    recorder.adopt_clock(t_first, t_last, 0.0)
    return lambda t_epoch: t_epoch - t_first


def executor_shard(worker: int, spec: Any) -> ShardBlock:
    """Executor side: worker `worker`'s shard, built from the seeded, cached dataset and the run's
    shard plan on the executor's own disk (the same prepare() as the driver's)."""
    from psbench.systems.common import prepare

    return shard_block(prepare(spec), worker)


def cached_shards(sc: Any, spec: Any, recorder: Any) -> tuple[Prepared, Any]:
    """Prepare the run and cache its shards as an RDD (partition i = worker i's shard), each built
    on its executor (executor_shard), so a task carries a worker id, never the data; the time this
    takes is recorded as spark_data_ready_s, the serialized partition as task_partition_bytes."""
    import time
    from functools import partial

    from psbench.systems.common import prepare

    t_data = time.perf_counter()
    prep = prepare(spec)
    recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
    data = sc.parallelize(range(spec.workers), spec.workers).map(partial(executor_shard, spec=spec)).cache()
    data.count()
    recorder.extra["spark_data_ready_s"] = time.perf_counter() - t_data
    recorder.extra["task_partition_bytes"] = task_partition_bytes(sc, data._jrdd.rdd())
    return prep, data


def task_partition_bytes(sc: Any, jvm_rdd: Any) -> int:
    """The largest Java-serialized partition of a JVM RDD: what every task on it carries besides
    its (broadcast) closure. A partition that holds its data (sc.parallelize of arrays, a
    DataFrame from pandas) ships it with every task of every iteration."""
    serialize = sc._jvm.org.apache.commons.lang3.SerializationUtils.serialize
    parts = jvm_rdd.partitions()
    return max(len(serialize(parts[i])) for i in range(len(parts)))
