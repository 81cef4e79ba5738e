"""The single-process baseline: plain SGD on one core (or, with --device cuda, one GPU)."""
from __future__ import annotations

import math

from psbench.core.accelerator import CPU, CUDA, torch_device
from psbench.core.cpu import WORKERS
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import NoOptions, System
from psbench.systems.common import (StepClock, compute_step, configure_threads, evaluate_splits, make_optimizer,
                                    prepare, record_evals)


class SingleSystem(System):
    name = "single"
    budgets = ("seconds",)  # --budget seconds=T: the training clock stops the run
    timer_evaluator = True  # --eval-every-s: snapshots on the training clock, evaluated off it
    Options = NoOptions
    max_workers = 1
    devices = (CPU, CUDA)  # the model and batches on the device
    cpu_self_role = WORKERS  # the worker is this process: no launcher besides it

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def run(self, spec: RunSpec, options: NoOptions, recorder: Recorder) -> None:
        configure_threads(1)
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        device = torch_device(spec.device)
        model = prep.build_model().to(device)
        loss_fn = prep.workload.loss_fn()
        optimizer = make_optimizer(model, prep.workload, prep.lr)
        every, timer = prep.eval_every(), spec.eval_every_s
        clock = StepClock(prep.pacer(0), device=device)
        deadline = prep.budget_seconds()
        recorder.start_clock()
        next_eval = timer if timer is not None else None

        def evaluate(done: int) -> None:
            """Off the clock, stamped now: the timer evaluator's snapshot, evaluated in place."""
            nonlocal next_eval
            t_wall = recorder.now()
            with recorder.paused():
                record_evals(recorder, done, evaluate_splits(model, loss_fn, prep.data), t_wall=t_wall)
            if timer is not None:
                next_eval = (math.floor(t_wall / timer) + 1) * timer

        evaluate(0)
        step, last_eval = 0, 0
        for step, x, y in prep.batches(0, clock, device):
            if deadline is not None and recorder.now() >= deadline:
                step -= 1  # this batch is not trained: the last step done is the one before
                break
            loss = compute_step(model, loss_fn, x, y, clock, step)
            with clock.update():
                optimizer.step()
            t = clock.split()  # nothing moves: the rest of the step is the clock's own bookkeeping
            recorder.step(0, step, len(y), loss, staleness=None, compute_s=t.compute_s + t.comm_s,
                          emulated_s=t.emulated_s, comm_s=0.0, wait_s=0.0, update_s=t.update_s, data_s=t.data_s)
            if (recorder.now() >= next_eval) if timer is not None else (step + 1) % every == 0:
                evaluate(step + 1)
                last_eval = step + 1
        if last_eval != step + 1:
            evaluate(step + 1)
        recorder.stop_clock()
