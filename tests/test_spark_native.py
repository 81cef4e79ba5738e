"""spark-mllib-native: Spark's own JVM trainers. Unit tests of the weight layouts and the checks
(no Spark), then functional tests on local[2]: the optimizer it calls gives exactly what
pyspark's LogisticRegressionWithSGD.train gives, Spark's MLP weights load into the torch model
with the same predictions, and a run records one step row per partition per iteration."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from psbench.bench.harness.runner import plan
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.systems.spark import native
from psbench.workloads import get_workload
from psbench.workloads.models import build_model
from tests.spark_helpers import run_system, spark_session  # noqa: F401 - the module's session

pytestmark = pytest.mark.skipif(native.SparkNativeSystem.unavailable_reason() is not None,
                                reason=f"spark-mllib-native unavailable: {native.SparkNativeSystem.unavailable_reason()}")


def sigmoid_mlp(seed: int = 0) -> torch.nn.Module:
    return build_model("mlp", (28,), 2, seed, hidden=(15, 15), activation="sigmoid")


# ---- no Spark ---------------------------------------------------------------------------------

def test_logreg_weights_give_the_same_probabilities_both_ways():
    model = build_model("logreg", (28,), 2, 3)
    x = torch.randn(50, 28)
    p_torch = torch.softmax(model(x), 1)[:, 1]
    w = native.logreg_to_spark(model)
    p_spark = torch.sigmoid(x.double() @ torch.from_numpy(w[:28]) + w[28]).float()
    assert torch.allclose(p_torch, p_spark, atol=1e-6)
    other = build_model("logreg", (28,), 2, 9)
    native.logreg_from_spark(other, w)
    assert torch.allclose(torch.softmax(other(x), 1)[:, 1], p_torch, atol=1e-6)


def test_mlp_layout_round_trips_and_is_column_major():
    model, other = sigmoid_mlp(0), sigmoid_mlp(1)
    flat = native.mlp_to_spark(model)
    assert len(flat) == 28 * 15 + 15 + 15 * 15 + 15 + 15 * 2 + 2
    first = model.net[0].weight.detach().double().numpy()
    assert flat[1] == pytest.approx(first[1, 0])  # W (out x in) column-major: element (1, 0) second
    native.mlp_from_spark(other, flat)
    x = torch.randn(20, 28)
    assert torch.equal(model(x), other(x))
    assert native.mlp_layers(model) == [28, 15, 15, 2]


def test_workloads_without_a_native_trainer_are_one_clear_error():
    assert native.trainer_kind(get_workload("logreg-higgs-1m")) == "logreg"
    assert native.trainer_kind(get_workload("mlp-higgs-1m")) == "mlp"
    with pytest.raises(ConfigError, match="no Spark MLlib trainer for workload 'cnn-mnist1d'"):
        plan(RunSpec("spark-mllib-native", "cnn-mnist1d", workers=2))
    with pytest.raises(ConfigError, match="relu MLP"):
        native.trainer_kind(get_workload("mlp-higgs-synthetic"))


def test_stragglers_refused_and_an_emulated_device_recorded_as_not_applied():
    with pytest.raises(ConfigError, match="cannot apply --stragglers"):
        plan(RunSpec("spark-mllib-native", "logreg-higgs-synthetic", workers=2, stragglers="slow:1=3"))
    planned = plan(RunSpec("spark-mllib-native", "logreg-higgs-synthetic", workers=2, emulate_device="step_ms=50"),
                   allow_oversubscribe=True)  # 2 busy task slots + the driver fill 2 cores: not what this checks
    assert planned.conditions["emulate_device_applied"] is False
    assert planned.conditions["worker_compute_share"] == 1.0  # the JVM's task threads are never paced


def test_mini_batch_fraction_is_the_global_batch_over_the_rows():
    assert native.mini_batch_fraction(40, 2, 800_000) == pytest.approx(1e-4)
    assert native.mini_batch_fraction(400_000, 2, 800_000) == 1.0
    assert native.mini_batch_fraction(500_000, 2, 800_000) == 1.0


def test_mlp_below_the_whole_data_is_refused():
    with pytest.raises(ConfigError, match="miniBatchFraction 1.0"):
        run_system("spark-mllib-native", "mlp-higgs-1m", batch_size=4000, max_steps=3)


# ---- local[2] ---------------------------------------------------------------------------------

def test_gradient_descent_call_equals_logistic_regression_with_sgd(spark_session):  # noqa: F811
    """At fraction 1 (no sampling) the optimizer we call directly gives pyspark's
    LogisticRegressionWithSGD.train weights (intercept appended, start intercept 1.0 as it forces)."""
    from pyspark.mllib.classification import LogisticRegressionWithSGD
    from pyspark.mllib.regression import LabeledPoint

    from psbench.systems.common import prepare

    spark = spark_session.spark
    prep = prepare(RunSpec("spark-mllib-native", "logreg-higgs-synthetic", workers=2, batch_size=8000))
    x, y = prep.data.x_train, prep.data.y_train
    data = native.jvm_rows(spark, prep, "logreg", 2)
    initial = np.concatenate([np.random.default_rng(0).normal(0, 0.1, 28), [1.0]])
    ours, losses = native.SparkNativeSystem._logreg(spark.sparkContext, data, initial, 0.5, 6, 1.0)
    points = [LabeledPoint(float(label), row.astype(np.float64)) for row, label in zip(x, y)]
    theirs = LogisticRegressionWithSGD.train(spark.sparkContext.parallelize(points, 2), iterations=5, step=0.5,
                                             miniBatchFraction=1.0, initialWeights=initial[:28], regParam=0.0,
                                             regType=None, intercept=True, validateData=False, convergenceTol=0.0)
    assert np.allclose(ours[:28], theirs.weights.toArray(), rtol=1e-7, atol=1e-10)
    assert ours[28] == pytest.approx(theirs.intercept, rel=1e-7)
    assert len(losses) == 6 and losses[-1] < losses[0]


def test_spark_mlp_weights_predict_the_same_in_torch(spark_session):  # noqa: F811
    from pyspark.ml.classification import MultilayerPerceptronClassifier
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 28))
    y = (x[:, 0] > 0).astype(float)
    df = spark_session.spark.createDataFrame([(Vectors.dense(r), float(label)) for r, label in zip(x, y)],
                                             ["features", "label"])
    model = sigmoid_mlp(0)
    fitted = MultilayerPerceptronClassifier(layers=[28, 15, 15, 2], solver="gd", maxIter=3, stepSize=0.5, tol=0.0,
                                            initialWeights=Vectors.dense(native.mlp_to_spark(model))).fit(df)
    native.mlp_from_spark(model, fitted.weights.toArray())
    spark_p = np.array([row.probability.toArray() for row in fitted.transform(df).select("probability").collect()])
    with torch.no_grad():
        torch_p = torch.softmax(model(torch.from_numpy(x).float()), 1).numpy()
    assert np.allclose(spark_p, torch_p, atol=1e-5)


def test_logreg_run_records_a_row_per_iteration_with_the_samples_it_drew(spark_session):  # noqa: F811
    rec = run_system("spark-mllib-native", "logreg-higgs-synthetic", batch_size=500, max_steps=8, epochs=10,
                     options={"spark_master": "local[2]"})
    steps = rec.steps
    assert len(steps) == 8 and [r["step"] for r in steps] == list(range(8))  # n = iterations, not x partitions
    times = [r["t_wall"] for r in steps]
    assert all(b > a for a, b in zip(times, times[1:]))  # one job per iteration, in order
    assert all(math.isfinite(r["loss"]) and r["compute_s"] > 0 and r["comm_s"] >= 0 for r in steps)
    # counted, not the expected Bernoulli size: fraction 1/16 of 16,000 rows is 1,000 +- ~30 a draw
    drawn = [r["n_samples"] for r in steps]
    assert all(850 <= n <= 1150 for n in drawn) and len(set(drawn)) > 1, drawn
    assert rec.extra["mini_batch_fraction"] == pytest.approx(1000 / 16000)
    evals = {(e["step"], e["split"]): e for e in rec.evals}
    assert set(evals) == {(0, "train"), (0, "val"), (8, "train"), (8, "val")}
    assert evals[(8, "train")]["loss"] < evals[(0, "train")]["loss"]  # the trained weights came back


def test_mlp_run_trains_with_the_multilayer_perceptron(spark_session, monkeypatch):  # noqa: F811
    """A sigmoid MLP over all training rows (fraction 1): MultilayerPerceptronClassifier's iterations
    become step rows, and its weights come back into the torch model for evaluation."""
    from psbench.workloads import registry

    small = registry.Workload("mlp-sigmoid-test", "higgs-synthetic", "mlp", registry.OptimizerSettings(0.5, 0.0), 8000,
                              1, 0.7, model_options={"hidden": (15, 15), "activation": "sigmoid"})
    monkeypatch.setitem(registry.WORKLOADS, small.name, small)
    rec = run_system("spark-mllib-native", small.name, batch_size=8000, max_steps=4, epochs=10)
    assert len(rec.steps) == 4 and all(r["n_samples"] == 16000 for r in rec.steps)  # every row, every iteration
    assert rec.extra["mini_batch_fraction"] == 1.0
    assert "MultilayerPerceptronClassifier" in rec.extra["native_trainer"]
    evals = {(e["step"], e["split"]): e["loss"] for e in rec.evals}
    assert evals[(4, "train")] != evals[(0, "train")]  # the trained weights, not the initial ones


def test_tasks_carry_no_data_and_partitions_follow_partitions_per_core(spark_session):  # noqa: F811
    """The rows are built on the executors: each task's partition is a few hundred bytes at any
    partitioning, where a partition that holds its rows (sc.parallelize of arrays) ships them all."""
    from psbench.systems.spark.partitions import task_partition_bytes

    sc = spark_session.spark.sparkContext
    assert task_partition_bytes(sc, sc.parallelize([np.zeros(50_000)], 1)._jrdd.rdd()) > 400_000  # the measure sees data
    for per_core in (1, 2):
        rec = run_system("spark-mllib-native", "logreg-higgs-synthetic", batch_size=2000, max_steps=4, epochs=10,
                         options={"spark_master": "local[2]", "partitions_per_core": per_core})
        assert rec.extra["partitions"] == 2 * per_core and rec.extra["partitions_per_core"] == per_core
        assert rec.extra["task_partition_bytes"] < 4096, rec.extra["task_partition_bytes"]
        events = [json.loads(e["detail"]) for e in rec.events if e["kind"] == "spark_step"]
        assert {len(e["task_run_s"]) for e in events} == {2 * per_core}  # one task per partition, every iteration


def test_the_pyspark_api_trainer_runs_as_a_user_calls_it(spark_session):  # noqa: F811
    rec = run_system("spark-mllib-native", "logreg-higgs-synthetic", batch_size=1000, max_steps=6, epochs=10,
                     options={"spark_master": "local[2]", "trainer": "api"})
    assert "LogisticRegressionWithSGD.train" in rec.extra["native_trainer"] and rec.extra["jvm_warmup_iterations"] == 0
    steps = rec.steps
    assert len(steps) == 6 and all(math.isnan(r["loss"]) for r in steps)  # the API returns no loss history
    assert all(1800 <= r["n_samples"] <= 2200 for r in steps)  # 2,000 of 16,000 a draw, counted on its partitions
    assert rec.extra["task_partition_bytes"] < 4096
    evals = {(e["step"], e["split"]): e["loss"] for e in rec.evals}
    # the API's weights came back (its intercept starts at 1.0, not the run's: the loss may rise first)
    assert math.isfinite(evals[(6, "train")]) and evals[(6, "train")] != evals[(0, "train")]
    with pytest.raises(ConfigError, match="takes logreg workloads"):
        plan(RunSpec("spark-mllib-native", "mlp-higgs-1m", workers=2, options={"trainer": "api"}))
