"""spark-barrier: Spark's barrier execution mode as a synchronous data-parallel trainer. One barrier
stage of N tasks (rdd.barrier().mapPartitions), each a worker holding a model replica and its
shard; every step each task sends its gradient through BarrierTaskContext.allGather (Spark's own
channel: via the driver's barrier coordinator), sums all N and takes the same optimizer step.

allGather carries strings: a gradient goes as base64 of its float32 bytes (the example-weighted
sum, so uneven last batches average correctly). Rank 0 snapshots the weights at the evaluation
cadence; the driver evaluates the snapshots after the job, off the training clock."""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from psbench.core.records import Recorder, split_sync_wait
from psbench.core.spec import RunSpec
from psbench.systems.base import option
from psbench.core.emulation import pacer_for
from psbench.systems.common import (StepClock, compute_step, configure_threads, evaluate_splits, flat_grads, flat_params,
                            record_evals, set_flat_params)
from psbench.systems.spark.partitions import (ModelSpec, ShardBlock, adopt_task_clock, cached_shards, common_steps,
                                      injected_failure)
from psbench.systems.spark.session import (Hold, SparkJobFailed, SparkOptions, SparkSystem, error_line,
                                           start_session)
from psbench.core.errors import ConfigError


@dataclass(frozen=True)
class BarrierOptions(SparkOptions):
    barrier_timeout_s: int = option(300, "seconds a barrier task waits in allGather for its peers before the job fails")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.barrier_timeout_s < 1:
            raise ConfigError(f"option barrier_timeout_s must be >= 1, got {self.barrier_timeout_s}")


def encode(grad_sum: np.ndarray, n: int, loss: float) -> str:
    return f"{n};{loss!r};" + base64.b64encode(np.ascontiguousarray(grad_sum, dtype=np.float32).tobytes()).decode()


def decode(message: str) -> tuple[np.ndarray, int, float]:
    n, loss, payload = message.split(";", 2)
    return np.frombuffer(base64.b64decode(payload), dtype=np.float32), int(n), float(loss)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    total_steps: int
    eval_every: int
    fail_at_step: int
    workers: int
    hold: Hold | None
    spec: RunSpec  # for the pacer: emulated device and stragglers


def _train_fn(plan: Plan):
    def train(blocks: Iterator[ShardBlock]) -> Iterator[dict[str, Any]]:
        from pyspark import BarrierTaskContext

        t_start = time.time()
        configure_threads(1)
        context = BarrierTaskContext.get()
        rank = context.partitionId()
        block = next(iter(blocks))
        model, loss_fn = plan.model.build()  # same seed on every task: identical replicas
        optimizer = plan.model.optimizer(model)
        n_params = sum(p.numel() for p in model.parameters())
        context.barrier()  # every task is up: training starts together
        t_ready = time.time()
        rows, snapshots = [], []
        spec = plan.spec
        clock = StepClock(pacer_for(spec.emulate_device, spec.stragglers, spec.workload, block.worker, spec.workers,
                                    spec.seed))
        for step in range(plan.total_steps):
            injected_failure(step, plan.fail_at_step, block.worker, plan.workers)
            if plan.hold is not None:
                plan.hold.pause("task", step, block.worker, plan.workers)
            fetching = time.perf_counter()
            x, y = block.batch(step)
            clock.fetched(time.perf_counter() - fetching)
            loss = compute_step(model, loss_fn, x, y, clock, step)
            message = encode(flat_grads(model) * len(y), len(y), loss)
            t1 = time.perf_counter()
            messages = context.allGather(message)  # moves the gradients and waits for every task
            t2 = time.perf_counter()
            total = np.zeros(n_params, dtype=np.float64)
            n_total = 0
            for other in messages:  # in partition order on every task: replicas stay bit-identical
                grad, n, _ = decode(other)
                total += grad
                n_total += n
            mean = (total / n_total).astype(np.float32)
            offset = 0
            for p in model.parameters():
                p.grad = torch.from_numpy(mean[offset:offset + p.numel()]).view_as(p).clone()
                offset += p.numel()
            optimizer.step()
            t3 = time.perf_counter()
            rows.append({"worker": rank, "step": step, "t_epoch": time.time(), "n_samples": len(y), "loss": loss,
                         "bytes": len(message) + sum(len(m) for m in messages),
                         "compute_s": clock.compute_s, "emulated_s": clock.emulated_s,
                         "comm_s": t2 - t1, "allgather_s": t2 - t1, "update_s": t3 - t2,
                         "data_s": clock.data_s})
            if rank == 0 and ((step + 1) % plan.eval_every == 0 or step + 1 == plan.total_steps):
                snapshots.append((step + 1, time.time(), flat_params(model)))
        yield {"rank": rank, "rows": rows, "snapshots": snapshots, "t_start": t_start, "t_ready": t_ready}
    return train


class SparkBarrierSystem(SparkSystem):
    name = "spark-barrier"
    Options = BarrierOptions

    def _train(self, spec: RunSpec, options: BarrierOptions, recorder: Recorder) -> None:
        session = start_session(spec, options, recorder, barrier_timeout_s=options.barrier_timeout_s)
        sc = session.spark.sparkContext
        prep, data = cached_shards(sc, spec, recorder)
        model = prep.build_model()
        loss_fn = prep.workload.loss_fn()
        plan = Plan(ModelSpec.of(prep), common_steps(prep), prep.eval_every(), options.fail_at_step, spec.workers,
                    Hold.parse(options.hold), spec)
        group = f"psbench-{spec.run_id}-{time.time_ns()}"

        t_submit = time.time()
        try:
            sc.setJobGroup(group, "psbench barrier training", False)
            results = data.barrier().mapPartitions(_train_fn(plan)).collect()
        except Exception as exc:
            raise SparkJobFailed(f"spark-barrier: the barrier training job failed: {error_line(exc)}") from exc
        finally:
            sc.setJobGroup("", "", False)
            data.unpersist()
        t_done = time.time()
        rows = sorted((r for res in results for r in res["rows"]), key=lambda r: (r["step"], r["worker"]))
        to_clock = adopt_task_clock(recorder, max(res["t_ready"] for res in results),
                                    max((r["t_epoch"] for r in rows), default=t_done))
        record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data), t_wall=0.0)  # the initial model
        split_sync_wait(rows)  # allGather returns when the slowest task has sent
        for r in rows:
            recorder.step(r["worker"], r["step"], r["n_samples"], r["loss"], nbytes=r["bytes"],
                          t_wall=to_clock(r["t_epoch"]), compute_s=r["compute_s"], emulated_s=r["emulated_s"],
                          comm_s=r["comm_s"], wait_s=r["wait_s"], update_s=r["update_s"], data_s=r["data_s"])
            recorder.event("spark_step", step=r["step"], worker=r["worker"], t_wall=to_clock(r["t_epoch"]),
                           compute_s=r["compute_s"], allgather_s=r["allgather_s"], update_s=r["update_s"])
        rank0 = next(res for res in results if res["rank"] == 0)
        for step, t_epoch, weights in rank0["snapshots"]:  # evaluated now, stamped when they were taken
            set_flat_params(model, weights)
            record_evals(recorder, step, evaluate_splits(model, loss_fn, prep.data), t_wall=to_clock(t_epoch))
        self._record_overheads(sc, group, results, rows, t_submit, t_done, recorder)

    @staticmethod
    def _record_overheads(sc: Any, group: str, results: list[dict], rows: list[dict], t_submit: float,
                          t_done: float, recorder: Recorder) -> None:
        """launch_s: job submitted to the last task ready to train (scheduling, Python worker start,
        model build, first barrier); per step: compute vs allGather (Spark's channel) vs update;
        finish_s: last step done to results back on the driver."""
        from psbench.systems.spark.overheads import job_timings, summarise

        jobs = job_timings(sc, group)
        last_step = max(r["t_epoch"] for r in rows) if rows else t_done
        stats = summarise(rows, ["compute_s", "allgather_s", "update_s"])
        stats.update(launch_s=max(res["t_ready"] for res in results) - t_submit,
                     task_start_delay_s=max(res["t_start"] for res in results) - t_submit,
                     finish_s=t_done - last_step, job_s=jobs[0]["job_s"] if jobs else None,
                     first_task_delay_s=jobs[0]["first_task_delay_s"] if jobs else None)
        if stats.get("compute_s_mean") is not None:
            step_s = stats["compute_s_mean"] + stats["allgather_s_mean"] + stats["update_s_mean"]
            stats["allgather_fraction"] = stats["allgather_s_mean"] / step_s if step_s > 0 else None
        recorder.extra["spark_overheads"] = stats
