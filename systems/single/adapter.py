"""The single-process baseline: plain SGD on one core."""
from __future__ import annotations

from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import NoOptions
from psbench.systems.common import (configure_threads, evaluate_splits, forward_backward, make_optimizer, prepare,
                            record_evals)


class SingleSystem:
    name = "single"
    Options = NoOptions
    max_workers = 1

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
        recorder.start_clock()
        with recorder.paused():
            record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data))
        step = 0
        for step, x, y in prep.batches(0):
            loss = forward_backward(model, loss_fn, x, y)
            optimizer.step()
            recorder.step(0, step, len(y), loss, staleness=None)
            if (step + 1) % every == 0:
                with recorder.paused():
                    record_evals(recorder, step + 1, evaluate_splits(model, loss_fn, prep.data))
        if (step + 1) % every != 0:
            with recorder.paused():
                record_evals(recorder, step + 1, evaluate_splits(model, loss_fn, prep.data))
        recorder.stop_clock()
