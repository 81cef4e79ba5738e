"""spark-mllib: trains, equals single-process gradient descent with one partition and full batch,
fails fast and clearly, records Spark's per-step overheads."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from psbench.core.spec import RunSpec
from spark_helpers import LOCAL2, final_val_accuracy, run_system, spark_session  # noqa: F401 (the module's session)
from psbench.systems.common import prepare

pytestmark = pytest.mark.spark


def test_trains_mlp_digits_with_two_workers_and_records_overheads():
    rec = run_system("spark-mllib", batch_size=64, lr=0.3, epochs=3, options=LOCAL2)
    assert final_val_accuracy(rec) >= 0.85
    steps = rec.summary()["steps"]
    assert steps == 2 * 12 * 3  # two workers' rows per step, 12 steps an epoch
    extra = rec.extra
    assert extra["spark_master"] == "local[2]" and "spark_session_start_s" in extra
    assert extra["spark_auth"] == "loopback" and extra["spark_network_crypto"] is False  # no secret: neither
    assert extra["task_partition_bytes"] < 4096  # shards built on the executors: a task carries a worker id
    over = extra["spark_overheads"]
    for key in ("step_s_mean", "driver_job_s_mean", "job_s_mean", "task_run_s_mean", "task_python_s_mean",
                "overhead_s_mean", "first_task_delay_s_mean", "overhead_fraction"):
        assert key in over, key
    assert over["driver_job_s_mean"] <= over["step_s_mean"]
    assert 0 < over["task_python_s_mean"] < over["driver_job_s_mean"]
    assert sum(1 for e in rec.events if e["kind"] == "spark_step") == 36


def test_one_partition_full_batch_equals_gradient_descent():
    steps = 6
    spec = RunSpec("single", "mlp-digits", workers=1, epochs=steps, batch_size=100_000)
    prep = prepare(spec)
    rec = run_system("spark-mllib", workers=1, epochs=steps, batch_size=100_000, options=LOCAL2)

    # plain full-batch gradient descent in torch, same data and initial weights
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    opt = torch.optim.SGD(model.parameters(), lr=prep.lr, momentum=prep.workload.optimizer.momentum)
    x, y = torch.from_numpy(prep.data.x_train), torch.from_numpy(prep.data.y_train)
    expected = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        expected.append(float(loss.detach()))
    got = [row["loss"] for row in sorted(rec.steps, key=lambda r: r["step"])]
    assert [row["n_samples"] for row in rec.steps] == [len(y)] * steps
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    with torch.no_grad():
        final_val = float(loss_fn(model(torch.from_numpy(prep.data.x_val)), torch.from_numpy(prep.data.y_val)))
    recorded_val = [e["loss"] for e in rec.evals if e["split"] == "val"][-1]
    assert recorded_val == pytest.approx(final_val, rel=1e-5)
    assert got[-1] < got[0]  # it did descend


def test_failing_task_is_one_clear_error():
    with pytest.raises(RuntimeError) as info:
        run_system("spark-mllib", max_steps=5, options={**LOCAL2, "fail_at_step": 2})
    message = str(info.value)
    assert "\n" not in message
    assert "step 2" in message and "injected failure in worker 1 at step 2" in message


def test_a_jvm_error_anywhere_in_a_run_is_one_line_with_its_cause_chained(monkeypatch):
    """Outside the step jobs' own handling (here: caching the shards, a count() whose collect the
    CI saw fail with a Java trace), a Py4J error still leaves the adapter as one line."""
    from py4j.protocol import Py4JError

    from psbench.systems.spark import mllib

    def jvm_fails(*_args, **_kw):
        raise Py4JError("An error occurred while calling o77.collectAndServe.\n: org.apache.spark.SparkException: "
                        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n\tat org.apache.spark."
                        "scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2900)")

    monkeypatch.setattr(mllib, "cached_shards", jvm_fails)
    with pytest.raises(RuntimeError) as info:
        run_system("spark-mllib", max_steps=3, options=LOCAL2)
    assert str(info.value) == "spark-mllib: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times"
    assert isinstance(info.value.__cause__, Py4JError)  # the whole trace stays for the run's failure log


def test_ratio_benchmark_measures_both_systems_in_one_run():
    from psbench.bench.regress.spark_benchmarks import ratio_spark_mllib_step_vs_single

    out = ratio_spark_mllib_step_vs_single(steps=6)
    assert set(out) == {"single_step_s", "spark_mllib_step_s", "ratio", "ratio_mean_step"}
    assert all(isinstance(v, float) and v > 0 for v in out.values())
    assert out["ratio"] == pytest.approx(out["spark_mllib_step_s"] / out["single_step_s"])
    assert out["ratio"] > 1  # a Spark job per mini-batch costs more than a local step
