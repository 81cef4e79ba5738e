"""spark-mllib: train the way Spark MLlib does. Each mini-batch step is one Spark job: the weights
go out as a broadcast variable, every partition (one per worker, holding its shard) computes the
gradient of its mini-batch, the driver sums them with treeAggregate and takes the optimizer step."""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import option
from psbench.core.emulation import pacer_for
from psbench.systems.common import (StepClock, compute_step, configure_threads, evaluate_splits, flat_grads,
                                    flat_params, make_optimizer, record_evals, set_flat_params, split_flat)
from psbench.systems.spark.partitions import (ModelSpec, ShardBlock, cached_model, cached_shards, common_steps,
                                      injected_failure)
from psbench.systems.spark.session import (Hold, SparkJobFailed, SparkOptions, SparkSystem, check_executors,
                                           error_line, executor_lost, start_session)
from psbench.core.errors import ConfigError

# One partition's contribution: (sum of per-example gradients, sum of losses, examples, per-worker rows)
Partial = tuple[np.ndarray, float, int, list]


@dataclass(frozen=True)
class MllibOptions(SparkOptions):
    tree_depth: int = option(2, "depth of the treeAggregate that sums the gradients")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tree_depth < 1:
            raise ConfigError(f"option tree_depth must be >= 1, got {self.tree_depth}")


def _gradient_fn(model_spec: ModelSpec, weights: Any, step: int, fail_at_step: int, spec: RunSpec,
                 hold: Hold | None):
    """The task code of one step: the partition's mini-batch gradient at the broadcast weights,
    paced like every system's worker step (an emulated device, stragglers)."""
    def gradient(blocks: Iterator[ShardBlock]) -> Iterator[Partial]:
        start = time.perf_counter()
        configure_threads(1)
        model, loss_fn = cached_model(model_spec)
        set_flat_params(model, weights.value)
        for block in blocks:
            injected_failure(step, fail_at_step, block.worker, spec.workers)
            if hold is not None:
                hold.pause("task", step, block.worker, spec.workers)
            clock = StepClock(pacer_for(spec.emulate_device, spec.stragglers, spec.workload, block.worker,
                                        spec.workers, spec.seed))
            fetching = time.perf_counter()
            x, y = block.batch(step)
            clock.fetched(time.perf_counter() - fetching)
            loss = compute_step(model, loss_fn, x, y, clock, step)
            n = len(y)
            grad = flat_grads(model).astype(np.float64) * n
            yield grad, loss * n, n, [(block.worker, n, loss, time.perf_counter() - start, os.getpid(),
                                       clock.compute_s, clock.emulated_s, clock.data_s)]
    return gradient


def _add(a: Partial, b: Partial) -> Partial:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]  # new objects: never mutate the zero value


class SparkMllibSystem(SparkSystem):
    name = "spark-mllib"
    Options = MllibOptions
    # One Spark job per mini-batch takes tens of ms here: the CPU calibration paces steps no faster.
    calibration_min_step_s = 0.1

    def _train(self, spec: RunSpec, options: MllibOptions, recorder: Recorder) -> None:
        session = start_session(spec, options, recorder)
        sc = session.spark.sparkContext
        prep, data = cached_shards(sc, spec, recorder)
        model = prep.build_model()
        loss_fn = prep.workload.loss_fn()
        optimizer = make_optimizer(model, prep.workload, prep.lr)
        model_spec = ModelSpec.of(prep)
        n_params = sum(p.numel() for p in model.parameters())
        total, every = common_steps(prep), prep.eval_every()
        group = f"psbench-{spec.run_id}-{time.time_ns()}"
        driver_rows: list[dict[str, float]] = []
        hold = Hold.parse(options.hold)

        # Warm-up off the clock (the launch column), by a stated rule: one untimed job of step 0's shape,
        # its result discarded. The first job paid the Python workers' torch import and model build and
        # the JVM's first treeAggregate (measured here: 0.78 s in the scheduler against 0.15-0.2 s after).
        t_warm = time.perf_counter()
        warm_weights = sc.broadcast(flat_params(model))
        self._job(data, model_spec, warm_weights, 0, n_params, dataclasses.replace(options, fail_at_step=-1), spec,
                  None)
        warm_weights.destroy()
        recorder.extra["warmup_s"] = time.perf_counter() - t_warm
        recorder.extra["warmup_rule"] = "one untimed gradient job of step 0's shape before the clock starts"
        recorder.start_clock()
        with recorder.paused():
            record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data))
        try:
            for step in range(total):
                check_executors()  # a loss between jobs: the next job would quietly run on the rest
                t0 = time.perf_counter()
                weights = sc.broadcast(flat_params(model))
                t1 = time.perf_counter()
                sc.setJobGroup(f"{group}-{step}", f"psbench step {step}", False)
                grad_sum, _, n, rows = self._job(data, model_spec, weights, step, n_params, options, spec, hold)
                t2 = time.perf_counter()
                grads = split_flat(grad_sum / n, [tuple(p.shape) for p in model.parameters()])
                for p, g in zip(model.parameters(), grads):
                    p.grad = torch.from_numpy(g)
                optimizer.step()
                weights.destroy()
                t3 = time.perf_counter()
                t_wall = recorder.now()
                driver_rows.append({"t_wall": t_wall, "step_s": t3 - t0, "broadcast_s": t1 - t0,
                                    "driver_job_s": t2 - t1, "update_s": t3 - t2,
                                    "task_python_s": max(r[3] for r in rows)})
                # Time: each task's compute and emulated sleep; waiting for the slowest task of the job;
                # the driver's update; the rest of the step (broadcast, scheduling, task launch,
                # treeAggregate) is what Spark spends moving the model and gradients.
                slowest = max(r[5] + r[6] + r[7] for r in rows)
                for worker, n_w, loss_w, _, _, compute_s, emulated_s, data_s in sorted(rows):
                    # down: the broadcast weights (float32); up: the partial gradient sum (float64)
                    recorder.step(worker, step, n_w, loss_w, nbytes=n_params * 4 + n_params * 8, t_wall=t_wall,
                                  compute_s=compute_s, emulated_s=emulated_s, comm_s=max(0.0, t2 - t0 - slowest),
                                  wait_s=slowest - compute_s - emulated_s - data_s, update_s=t3 - t2, data_s=data_s)
                if (step + 1) % every == 0:
                    with recorder.paused():
                        record_evals(recorder, step + 1, evaluate_splits(model, loss_fn, prep.data))
                if hold is not None:
                    with recorder.paused():
                        hold.pause("driver", step, until=executor_lost)
        finally:
            sc.setJobGroup("", "", False)
            data.unpersist()
        if total % every != 0:
            with recorder.paused():
                record_evals(recorder, total, evaluate_splits(model, loss_fn, prep.data))
        recorder.stop_clock()
        self._record_overheads(sc, group, driver_rows, recorder)

    @staticmethod
    def _job(data: Any, model_spec: ModelSpec, weights: Any, step: int, n_params: int, options: MllibOptions,
             spec: RunSpec, hold: Hold | None) -> Partial:
        """One mini-batch as one Spark job; a failed job becomes one clear line, not a JVM stack trace."""
        zero: Partial = (np.zeros(n_params), 0.0, 0, [])
        try:
            return data.mapPartitions(_gradient_fn(model_spec, weights, step, options.fail_at_step, spec, hold)
                                      ).treeAggregate(zero, _add, _add, depth=options.tree_depth)
        except Exception as exc:  # noqa: BLE001 - py4j/pyspark raise several types for a failed job
            raise SparkJobFailed(f"spark-mllib: the Spark job of step {step} failed: {error_line(exc)}") from exc

    @staticmethod
    def _record_overheads(sc: Any, group: str, driver_rows: list[dict[str, float]], recorder: Recorder) -> None:
        """Per step: driver time (broadcast, job, update), Spark's own job/task timings (task_run_s:
        the JVM's view of a task, mean over tasks) and the time the slowest task spent in Python
        computing its gradient (task_python_s). overhead_s = the driver's wait for the job minus
        task_python_s: scheduling, task launch, shipping closure/broadcast/data to the Python
        worker, (de)serialisation and result transfer; what Spark adds to each mini-batch."""
        from psbench.systems.spark.overheads import job_timings, summarise

        per_step = []
        for step, driver in enumerate(driver_rows):
            jobs = job_timings(sc, f"{group}-{step}")
            driver = dict(driver)
            t_wall = driver.pop("t_wall")
            row: dict[str, Any] = {"step": step, **driver, "jobs": len(jobs)}
            if jobs:
                tasks = sum(j["tasks"] for j in jobs) or 1.0
                row.update(job_s=sum(j["job_s"] or 0.0 for j in jobs),
                           task_run_s=sum(j["task_run_s"] for j in jobs) / tasks,
                           task_deserialize_s=sum(j["task_deserialize_s"] for j in jobs) / tasks,
                           task_cpu_s=sum(j["task_cpu_s"] for j in jobs) / tasks,
                           first_task_delay_s=jobs[0]["first_task_delay_s"])
            row["overhead_s"] = row["driver_job_s"] - row["task_python_s"]
            per_step.append(row)
            recorder.event("spark_step", step=step, t_wall=t_wall, **{k: v for k, v in row.items() if k != "step"})
        keys = ["step_s", "broadcast_s", "driver_job_s", "update_s", "task_python_s", "job_s", "task_run_s",
                "task_deserialize_s",
                "task_cpu_s", "first_task_delay_s", "overhead_s"]
        stats = summarise(per_step, keys)
        if stats.get("step_s_mean"):
            stats["overhead_fraction"] = stats.get("overhead_s_mean", 0.0) / stats["step_s_mean"]
        recorder.extra["spark_overheads"] = stats
