"""spark-mllib-native: Spark's own JVM trainers, as the thesis ran them (no Python in the loop).

- logreg workloads: MLlib's `GradientDescent.runMiniBatchSGD` with `LogisticGradient` and
  `SimpleUpdater` (step / sqrt(iteration)) and `miniBatchFraction` = the run's global mini-batch /
  training rows: exactly what `pyspark.mllib.classification.LogisticRegressionWithSGD.train(...,
  regParam=0, regType=None, intercept=True)` runs inside (still in pyspark 4.3, deprecated since 2.0).
  It is called directly so that (a) it starts from the run's torch initial weights like every other
  system (the Python API forces the intercept to 1.0), (b) its per-iteration loss history comes
  back, and (c) the rows reach it as a JVM RDD built from a DataFrame (Arrow), not pickled one by one.
  tests/test_spark_native.py checks it gives LogisticRegressionWithSGD.train's weights.
- sigmoid MLP workloads: `pyspark.ml.classification.MultilayerPerceptronClassifier(solver="gd")`.
  Its GradientDescent runs with miniBatchFraction 1.0 and does not expose it, so a run must take
  every training row per iteration (a smaller mini-batch is a ConfigError).
- Anything else (cnn, resnet, relu MLPs) has no native trainer here: a ConfigError says so.

Per-iteration times come from Spark's status store (the data its UI shows): every iteration is one
`treeAggregate at GradientDescent` job, and one step row per iteration (n = iterations) carries the
job's completion time on the run's clock, the rows the iteration really drew (counted after the run
with the same seeded sample), the slowest partition task's run time (sampling pass + gradient) as
compute_s, and the rest of the iteration (scheduling, the final aggregate, broadcast, the driver's
update) as comm_s. data_s stays empty: MLlib's `sample` is a lazy iterator that treeAggregate's
seqOp pulls row by row in the same task, so the sampling pass and the gradient interleave per row
with no boundary to time; both are in compute_s, and the Kassela cost model's scan term
(bench/report/cost_model.py) separates the pass by its growth with the rows. Evaluation loads the
trained weights into the workload's torch model and runs systems/common.py's evaluate_splits, at
step 0 and at the end (the JVM runs all iterations in one call). An emulated device cannot pace the
JVM's inner loop: it is not applied (the manifest's conditions say emulate_device_applied: false,
and the CPU budget counts each task slot as a busy core); stragglers are refused.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from psbench.core.cpu import WORKERS, Proc
from psbench.core.errors import ConfigError
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import option
from psbench.systems.common import Prepared, evaluate_splits, prepare, record_evals
from psbench.systems.spark.partitions import clock_mapper, common_steps, task_partition_bytes
from psbench.systems.spark.session import SPARK_JVM, SparkJobFailed, SparkOptions, SparkSystem, error_line, start_session

ITERATION_JOB = "treeAggregate at GradientDescent"  # the call site of one iteration's job
# Spark 4.3's GradientDescent runs numIterations + 1 mini-batches (measured: numIterations=5 gives six
# iteration jobs and six losses), so a run of `total` steps asks for total - 1.
EXTRA_ITERATIONS = 1
WARMUP_ITERATIONS = 1 + EXTRA_ITERATIONS + 2  # untimed iterations before each run (JVM warm-up)


TRAINERS = ("gd", "api")


@dataclass(frozen=True)
class NativeOptions(SparkOptions):
    partitions_per_core: int = option(1, "partitions of the training rows per task slot (Spark users run 2-4 per "
                                         "core, spark.default.parallelism)")
    trainer: str = option("gd", "logreg: 'gd' calls MLlib's GradientDescent.runMiniBatchSGD from the run's initial "
                                "weights (its loss history comes back); 'api' calls pyspark's "
                                "LogisticRegressionWithSGD.train as a user would (intercept starts at its 1.0, "
                                "rows converted from Python each run, no loss history, no JVM warm-up)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.partitions_per_core < 1:
            raise ConfigError(f"option partitions_per_core must be >= 1, got {self.partitions_per_core}")
        if self.trainer not in TRAINERS:
            raise ConfigError(f"option trainer: '{self.trainer}' is not a trainer; use {' or '.join(TRAINERS)}")
        for name in ("fail_at_step", "hold"):
            if getattr(self, name) not in (-1, ""):
                raise ConfigError(f"option {name}: spark-mllib-native runs Spark's own trainer, which has no hook "
                                  "to fail or pause a task; use spark-mllib for fault injection")


def trainer_kind(workload: Any) -> str:
    """'logreg' or 'mlp': which native trainer a workload maps to, or a ConfigError saying why none."""
    if workload.model == "logreg":
        return "logreg"
    if workload.model == "mlp" and workload.model_options.get("activation") == "sigmoid":
        return "mlp"
    what = ("a relu MLP (MultilayerPerceptronClassifier's hidden layers are sigmoid)" if workload.model == "mlp"
            else f"model '{workload.model}'")
    raise ConfigError(f"spark-mllib-native has no Spark MLlib trainer for workload '{workload.name}' ({what}); "
                      "it trains logreg workloads (LogisticRegressionWithSGD's GradientDescent) and sigmoid MLPs "
                      "(MultilayerPerceptronClassifier), e.g. logreg-higgs-1m, mlp-higgs-1m")


def mini_batch_fraction(batch_size: int, workers: int, n_train: int) -> float:
    """MLlib's miniBatchFraction for a per-worker batch: the global batch over the training rows."""
    return min(1.0, batch_size * workers / n_train)


# ---- weights between torch and Spark's layouts ----------------------------------------------

def logreg_to_spark(model: torch.nn.Module) -> np.ndarray:
    """A 2-class softmax regression (W: 2 x d, b: 2) as MLlib's binary weights with the intercept
    appended last: softmax([z0, z1])[1] = sigmoid(z1 - z0), so w = W1 - W0, b = b1 - b0."""
    w, b = model.linear.weight.detach().double().numpy(), model.linear.bias.detach().double().numpy()
    return np.concatenate([w[1] - w[0], [b[1] - b[0]]])


@torch.no_grad()
def logreg_from_spark(model: torch.nn.Module, weights: np.ndarray) -> None:
    d = model.linear.weight.shape[1]
    model.linear.weight.zero_()
    model.linear.bias.zero_()
    model.linear.weight[1] = torch.from_numpy(np.asarray(weights[:d], dtype=np.float32))
    model.linear.bias[1] = float(weights[d])


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def mlp_to_spark(model: torch.nn.Module) -> np.ndarray:
    """Spark's ann layout: per affine layer, W (out x in) column-major, then b."""
    parts = []
    for layer in _linears(model):
        parts += [layer.weight.detach().double().numpy().T.reshape(-1), layer.bias.detach().double().numpy()]
    return np.concatenate(parts)


@torch.no_grad()
def mlp_from_spark(model: torch.nn.Module, weights: np.ndarray) -> None:
    offset = 0
    for layer in _linears(model):
        n_out, n_in = layer.weight.shape
        w = np.asarray(weights[offset:offset + n_out * n_in]).reshape(n_in, n_out).T
        offset += n_out * n_in
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)))
        layer.bias.copy_(torch.from_numpy(np.asarray(weights[offset:offset + n_out], dtype=np.float32)))
        offset += n_out
    if offset != len(weights):
        raise ValueError(f"{len(weights)} Spark weights for an MLP that holds {offset}")


def mlp_layers(model: torch.nn.Module) -> list[int]:
    linears = _linears(model)
    return [linears[0].in_features] + [layer.out_features for layer in linears]


# ---- the training rows in the JVM --------------------------------------------------------------

_DATA: dict[tuple, Any] = {}
_EXECUTOR_ROWS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _partition_rows(ids: Any, dataset: str, data_dir: str | None, n_parts: int, kind: str) -> Any:
    """Executor side (mapInPandas): the training rows of the partitions whose ids arrive, built
    from the seeded, cached dataset on the executor's own disk, so a task carries a partition id,
    never the data (as a Spark user's job reads files)."""
    import pandas as pd

    from psbench.workloads.datasets import load_dataset
    from psbench.workloads.registry import DATA_SEED

    key = (dataset, data_dir)
    if key not in _EXECUTOR_ROWS:  # Python workers are reused across tasks: load the rows once
        _EXECUTOR_ROWS.clear()
        data = load_dataset(dataset, DATA_SEED, Path(data_dir) if data_dir else None)
        _EXECUTOR_ROWS[key] = (data.x_train, data.y_train)
    x, y = _EXECUTOR_ROWS[key]
    bounds = np.linspace(0, len(y), n_parts + 1).astype(np.int64)
    for frame in ids:
        for part in frame["id"].tolist():
            lo, hi = int(bounds[part]), int(bounds[part + 1])
            columns = {f"f{i}": x[lo:hi, i].astype(np.float64) for i in range(x.shape[1])}
            if kind == "logreg":  # MLlib's GeneralizedLinearAlgorithm appends this column itself
                columns["intercept"] = np.ones(hi - lo)
            columns["label"] = y[lo:hi].astype(np.float64)
            yield pd.DataFrame(columns)


def partition_count(spec: RunSpec, options: "NativeOptions") -> int:
    """Partitions of the training rows: partitions_per_core per task slot (one slot per worker)."""
    return spec.workers * options.partitions_per_core


def jvm_rows(spark: Any, prep: Prepared, kind: str, n_parts: int) -> Any:
    """The training rows in Spark, `n_parts` partitions built on the executors (_partition_rows),
    cached and reused by later runs on the same session, dataset and partitioning: for logreg a
    JVM RDD[(label, features + 1.0)] (the intercept column MLlib's GeneralizedLinearAlgorithm
    appends), for the MLP and the API ("rows") a DataFrame (features, label)."""
    from functools import partial

    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import DataFrame

    # keyed by the context's application id: an id() of a stopped context's object can come back
    app = spark.sparkContext.applicationId
    key = (app, prep.data.name, len(prep.data.y_train), n_parts, kind)
    if key in _DATA:
        return _DATA[key]
    for old_key, old in _DATA.items():  # a pyspark DataFrame, or a JVM RDD (whose unpersist takes `blocking`)
        if old_key[0] == app:  # another application's context is stopped: its cache went with it
            old.unpersist() if isinstance(old, DataFrame) else old.unpersist(False)
    _DATA.clear()
    n_features = prep.data.x_train.shape[1]
    names = [f"f{i}" for i in range(n_features)] + (["intercept"] if kind == "logreg" else [])
    schema = ", ".join(f"{name} double" for name in names + ["label"])
    build = partial(_partition_rows, dataset=prep.workload.dataset, data_dir=prep.spec.data_dir, n_parts=n_parts,
                    kind=kind)
    frame = spark.range(0, n_parts, 1, n_parts).mapInPandas(build, schema)
    frame = VectorAssembler(inputCols=names, outputCol="features").transform(frame).select("features", "label")
    if kind != "logreg":  # "mlp", "rows" (the API's input)
        data = frame.cache()
        data.count()
    else:
        from pyspark.mllib.util import MLUtils

        old = MLUtils.convertVectorColumnsFromML(frame, "features").cache()
        old.count()
        jvm = spark.sparkContext._jvm
        # Spark's own conversions, no Python per row: RowMatrix's rows (RDD[Vector]) and the label
        # column as RDD[Double], zipped partition by partition into RDD[(Double, Vector)].
        features = jvm.org.apache.spark.mllib.api.python.PythonMLLibAPI().createRowMatrix(
            old.select("features")._jdf, len(prep.data.y_train), len(names)).rows()
        labels = getattr(old.select("label")._jdf, "as")(jvm.org.apache.spark.sql.Encoders.DOUBLE()).rdd()
        data = labels.toJavaRDD().zip(features.toJavaRDD()).rdd().cache()
        data.count()
        old.unpersist()
    _DATA[key] = data
    return data


# ---- per-iteration timings from Spark's status store ------------------------------------------

def iteration_timings(sc: Any, group: str) -> list[dict[str, Any]]:
    """One dict per GradientDescent iteration job of `group`, in order: submitted/completed (epoch
    s), and per partition (the stage with one task per partition) its task's run time."""
    jsc = sc._jsc.sc()
    jsc.listenerBus().waitUntilEmpty(30_000)  # the store is filled by an asynchronous listener
    store = jsc.statusStore()
    out = []
    for job_id in sorted(sc.statusTracker().getJobIdsForGroup(group)):
        job = store.job(job_id)
        if not str(job.name()).startswith(ITERATION_JOB):
            continue
        stage_ids = sorted(job.stageIds().apply(i) for i in range(job.stageIds().length()))
        stages = [store.lastStageAttempt(s) for s in stage_ids]
        first = max(stages, key=lambda st: st.numTasks())  # the partitions' stage (the last one is 1 task)
        tasks = store.taskList(first.stageId(), first.attemptId(), 100_000)
        run_s = {}
        for i in range(tasks.length()):
            task = tasks.apply(i)
            metrics = task.taskMetrics()
            run_s[int(task.index())] = metrics.get().executorRunTime() / 1e3 if metrics.isDefined() else math.nan
        out.append({"job_id": job_id, "submitted": job.submissionTime().get().getTime() / 1e3,
                    "completed": job.completionTime().get().getTime() / 1e3, "task_run_s": run_s})
    return out


class SparkNativeSystem(SparkSystem):
    name = "spark-mllib-native"
    Options = NativeOptions
    paces_steps = False  # the iterations run inside the JVM: no emulated device or straggler can pace them
    calibration_workload = "logreg-higgs-synthetic"  # a workload its JVM trainers take (the harness' CPU figures)

    @staticmethod
    def cpu_processes(options: SparkOptions, workers: int) -> list[Proc]:
        # In local mode the workers are task threads of the driver's JVM: the JVM is their process (a
        # core each; the driver's work lies between an iteration's stages, when the slots are idle).
        return [Proc(WORKERS, workers, SPARK_JVM)] if workers else [Proc("spark driver", 1, SPARK_JVM)]

    @staticmethod
    def check_spec(spec: RunSpec, options: NativeOptions, workload: Any, device: Any, stragglers: Any) -> None:
        if trainer_kind(workload) != "logreg" and options.trainer == "api":
            raise ConfigError("option trainer 'api' (LogisticRegressionWithSGD.train) takes logreg workloads; "
                              f"{workload.name} trains with MultilayerPerceptronClassifier")
        if spec.max_steps is not None and spec.max_steps < 1 + EXTRA_ITERATIONS:
            raise ConfigError(f"spark-mllib-native needs --max-steps >= {1 + EXTRA_ITERATIONS} (Spark's GradientDescent "
                              f"runs numIterations + {EXTRA_ITERATIONS} mini-batches), got {spec.max_steps}")
        if stragglers is not None:
            raise ConfigError("spark-mllib-native cannot apply --stragglers: its iterations run inside Spark's "
                              "JVM trainer, which no pacer can slow; use spark-mllib for straggler runs")
        if spec.budget is not None:
            raise ConfigError("spark-mllib-native takes --max-steps or --epochs (iterations), not --budget")

    def _train(self, spec: RunSpec, options: NativeOptions, recorder: Recorder) -> None:
        prep = prepare(spec)
        kind = trainer_kind(prep.workload)
        if prep.data.n_classes != 2:
            raise ConfigError(f"spark-mllib-native: LogisticRegressionWithSGD is binary; {spec.workload} has "
                              f"{prep.data.n_classes} classes")
        n_train = len(prep.data.y_train)
        fraction = mini_batch_fraction(prep.batch_size, spec.workers, n_train)
        if kind == "mlp" and fraction < 1.0:
            raise ConfigError(
                f"spark-mllib-native trains {spec.workload} with MultilayerPerceptronClassifier(solver='gd'), whose "
                f"GradientDescent takes every row each iteration (miniBatchFraction 1.0, not exposed): use a "
                f"global batch of all {n_train} training rows (batch_size {math.ceil(n_train / spec.workers)} "
                f"with {spec.workers} workers), got {prep.batch_size * spec.workers}")
        session = start_session(spec, options, recorder)
        spark, sc = session.spark, session.spark.sparkContext
        api = options.trainer == "api"
        n_parts = partition_count(spec, options)
        t_data = time.perf_counter()
        data = jvm_rows(spark, prep, "rows" if api else kind, n_parts)
        jvm_data = data if kind == "logreg" and not api else data._jdf.rdd()  # a DataFrame's rows as a JVM RDD
        recorder.extra["spark_data_ready_s"] = time.perf_counter() - t_data
        model, loss_fn = prep.build_model(), prep.workload.loss_fn()
        total = common_steps(prep)
        group = f"psbench-native-{spec.run_id}-{time.time_ns()}"
        trainer = {"logreg": "MLlib GradientDescent.runMiniBatchSGD + LogisticGradient + SimpleUpdater "
                             "(LogisticRegressionWithSGD's optimizer)",
                   "mlp": "pyspark.ml MultilayerPerceptronClassifier(solver='gd')",
                   "api": "pyspark.mllib.classification.LogisticRegressionWithSGD.train"}["api" if api else kind]
        recorder.extra.update(native_trainer=trainer, mini_batch_fraction=fraction, train_rows=n_train, partitions=n_parts,
                              partitions_per_core=options.partitions_per_core,
                              task_partition_bytes=task_partition_bytes(sc, jvm_data),
                              native_evals="step 0 and the end (one JVM call)",
                              sharding_applied=False, bytes_source="computed (weights broadcast down, gradient up, "
                                                                   "float64)")
        if spec.emulate_device:
            recorder.extra["emulate_device_applied"] = False

        def fit(iterations: int) -> tuple[np.ndarray, list[float]]:
            try:
                if api:
                    return self._api(data, logreg_to_spark(model), prep.lr, iterations, fraction)
                if kind == "logreg":
                    return self._logreg(sc, data, logreg_to_spark(model), prep.lr, iterations, fraction)
                return self._mlp(data, model, prep, iterations)
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - py4j/pyspark raise several types for a failed job
                raise SparkJobFailed(f"spark-mllib-native: Spark's trainer failed: {error_line(exc)}") from exc

        # JVM warm-up off the clock (its own column): a few iterations at the run's fraction first, so
        # the JIT and the cached rows' first GC do not land in the first timed steps. Measured here
        # without it: a 100 % run's compute fell 4.9 s -> 0.58 s over its six steps. A user of the
        # API does not warm up: its first iterations (and the rows' conversion) are the report's
        # warm-up cut.
        t_warm = time.perf_counter()
        if not api:
            fit(WARMUP_ITERATIONS)
        recorder.extra["jvm_warmup_s"] = time.perf_counter() - t_warm
        recorder.extra["jvm_warmup_iterations"] = 0 if api else WARMUP_ITERATIONS

        recorder.start_clock()
        with recorder.paused():
            record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data))
        sc.setJobGroup(group, f"psbench {spec.run_id}", False)
        try:
            weights, losses = fit(total)
        finally:
            sc.setJobGroup("", "", False)
        to_clock = clock_mapper(recorder)
        train_end = recorder.now()
        (logreg_from_spark if kind == "logreg" else mlp_from_spark)(model, weights)
        with recorder.paused():
            drawn = drawn_per_iteration(jvm_data, fraction if kind == "logreg" else 1.0, total, n_train)
        self._record_steps(sc, group, recorder, to_clock, losses, total, drawn, len(weights))
        with recorder.paused():
            record_evals(recorder, total, evaluate_splits(model, loss_fn, prep.data), t_wall=train_end)
        recorder.stop_clock()

    @staticmethod
    def _api(rows: Any, initial: np.ndarray, lr: float, total: int, fraction: float) -> tuple[np.ndarray, list[float]]:
        """LogisticRegressionWithSGD.train as a user calls it, on an RDD of LabeledPoint from the
        cached rows (the API converts them to the JVM and caches them itself each call)."""
        import warnings

        from pyspark.mllib.classification import LogisticRegressionWithSGD
        from pyspark.mllib.linalg import Vectors
        from pyspark.mllib.regression import LabeledPoint

        points = rows.rdd.map(lambda r: LabeledPoint(r.label, Vectors.dense(r.features.toArray())))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated since 2.0: run as the thesis ran it
            fitted = LogisticRegressionWithSGD.train(points, iterations=int(total) - EXTRA_ITERATIONS, step=float(lr),
                                                     miniBatchFraction=float(fraction),
                                                     initialWeights=initial[:-1].tolist(), regParam=0.0, regType=None,
                                                     intercept=True)
        return np.concatenate([fitted.weights.toArray(), [fitted.intercept]]), []

    @staticmethod
    def _logreg(sc: Any, data: Any, initial: np.ndarray, lr: float, total: int,
                fraction: float) -> tuple[np.ndarray, list[float]]:
        """`total` mini-batch iterations of MLlib's GradientDescent from `initial` (intercept last)."""
        from pyspark.mllib.common import _py2java
        from pyspark.mllib.linalg import DenseVector

        opt = sc._jvm.org.apache.spark.mllib.optimization
        init = _py2java(sc, DenseVector(initial))  # pickled across: a JVM mllib DenseVector
        result = opt.GradientDescent.runMiniBatchSGD(data, opt.LogisticGradient(), opt.SimpleUpdater(), float(lr),
                                                     int(total) - EXTRA_ITERATIONS, 0.0, float(fraction), init, 0.0)
        return np.array(result._1().toArray()), list(result._2())

    @staticmethod
    def _mlp(data: Any, model: torch.nn.Module, prep: Prepared, total: int) -> tuple[np.ndarray, list[float]]:
        from pyspark.ml.classification import MultilayerPerceptronClassifier
        from pyspark.ml.linalg import Vectors

        trainer = MultilayerPerceptronClassifier(layers=mlp_layers(model), solver="gd", maxIter=total - EXTRA_ITERATIONS,
                                                 stepSize=prep.lr, tol=0.0, seed=prep.spec.seed,
                                                 initialWeights=Vectors.dense(mlp_to_spark(model)))
        fitted = trainer.fit(data)
        summary = fitted.summary() if callable(fitted.summary) else fitted.summary  # a method in pyspark 4.3
        return np.array(fitted.weights.toArray()), list(summary.objectiveHistory)

    @staticmethod
    def _record_steps(sc: Any, group: str, recorder: Recorder, to_clock: Any, losses: list[float], total: int,
                      drawn: list[int], n_params: int) -> None:
        """One row per iteration (the JVM's iteration is one step of the whole cluster): the samples
        it really drew, the slowest partition task's run time as compute_s (its sampling pass and
        gradient), the rest of the iteration (scheduling, the final aggregate, broadcast, the
        driver's update) as comm_s; each partition's task time is in the iteration's event."""
        iterations = iteration_timings(sc, group)
        if len(iterations) != total:
            raise SparkJobFailed(f"spark-mllib-native: Spark ran {len(iterations)} '{ITERATION_JOB}' jobs for "
                                 f"{total} iterations")
        previous = iterations[0]["submitted"]
        for step, it in enumerate(iterations):
            step_s = it["completed"] - previous  # from the previous iteration's end: driver work included
            previous = it["completed"]
            slowest = max(it["task_run_s"].values())
            recorder.step(0, step, drawn[step], losses[step] if step < len(losses) else math.nan,
                          nbytes=n_params * 16 * len(it["task_run_s"]), t_wall=to_clock(it["completed"]),
                          compute_s=slowest, emulated_s=0.0, comm_s=max(0.0, step_s - slowest), wait_s=0.0,
                          update_s=None)
            recorder.event("spark_step", step=step, t_wall=to_clock(it["completed"]), job_s=it["completed"] -
                           it["submitted"], step_s=step_s, task_run_s=sorted(it["task_run_s"].values()))


def drawn_per_iteration(data: Any, fraction: float, total: int, n_train: int) -> list[int]:
    """The rows each of `total` iterations of runMiniBatchSGD really drew: its iteration i (from 1)
    samples data.sample(false, fraction, 42 + i) (Spark 4.3's GradientDescent, read from its
    bytecode), so the same call counts them exactly, after the run, off its clock."""
    if fraction >= 1.0:
        return [n_train] * total
    return [int(data.sample(False, float(fraction), 42 + i).count()) for i in range(1, total + 1)]
