"""The single-process baseline: plain SGD on one core."""
from __future__ import annotations

from psbench.core.cpu import WORKERS
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import NoOptions
from psbench.systems.common import (StepClock, compute_step, configure_threads, evaluate_splits, make_optimizer,
                                    prepare, record_evals)


class SingleSystem:
    name = "single"
    Options = NoOptions
    max_workers = 1
    cpu_self_role = WORKERS  # the worker is this process: no launcher besides it

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def run(self, spec: RunSpec, options: NoOptions, recorder: Recorder) -> None:
        configure_threads(1)
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        model = prep.build_model()
        loss_fn = prep.workload.loss_fn()
        optimizer = make_optimizer(model, prep.workload, prep.lr)
        every = prep.eval_every()
        clock = StepClock(prep.pacer(0))
        recorder.start_clock()
        with recorder.paused():
            record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data))
        step = 0
        for step, x, y in prep.batches(0):
            loss = compute_step(model, loss_fn, x, y, clock, step)
            optimizer.step()
            compute_s, emulated_s, rest_s = clock.split()  # rest: the optimizer step, computed here too
            recorder.step(0, step, len(y), loss, staleness=None, compute_s=compute_s + rest_s, emulated_s=emulated_s,
                          comm_s=0.0, wait_s=0.0)
            if (step + 1) % every == 0:
                with recorder.paused():
                    record_evals(recorder, step + 1, evaluate_splits(model, loss_fn, prep.data))
        if (step + 1) % every != 0:
            with recorder.paused():
                record_evals(recorder, step + 1, evaluate_splits(model, loss_fn, prep.data))
        recorder.stop_clock()
