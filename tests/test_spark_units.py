"""Spark adapter pieces that need no Spark: batch schedule, options, error lines, registry."""
from __future__ import annotations

import numpy as np
import pytest

from psbench.core.spec import RunSpec
from psbench.systems import get_system
from psbench.systems.base import parse_options
from psbench.systems.common import prepare
from psbench.systems.spark.partitions import common_steps, executor_shard
from psbench.systems.spark.session import error_line, parse_conf
from psbench.core.errors import ConfigError


@pytest.mark.parametrize("sharding, batch_size", [("random", 50), ("stratified", 50), ("random", 10_000)])
def test_shard_block_batches_equal_prepared_batches(sharding, batch_size):
    spec = RunSpec("spark-mllib", "mlp-digits", workers=3, batch_size=batch_size, epochs=2, sharding=sharding)
    prep = prepare(spec)
    for block in (executor_shard(w, spec) for w in range(3)):  # built as an executor builds it
        for step, x, y in prep.batches(block.worker):
            bx, by = block.batch(step)
            np.testing.assert_array_equal(bx.numpy(), x.numpy())
            np.testing.assert_array_equal(by.numpy(), y.numpy())
    assert common_steps(prep) == min(prep.total_steps(w) for w in range(3))


@pytest.mark.parametrize("system", ["spark-mllib", "spark-barrier", "spark-torch"])
def test_options_validate(system):
    cls = get_system(system)
    opts = parse_options(cls.Options, {}, system)
    assert opts.master(3) == "local[3]"
    assert parse_options(cls.Options, {"spark_master": "spark://127.0.0.1:7077"}, system).master(3) == \
        "spark://127.0.0.1:7077"
    with pytest.raises(ConfigError, match="not a Spark master"):
        parse_options(cls.Options, {"spark_master": "mesos://x"}, system)
    with pytest.raises(ConfigError, match="spark.key=value"):
        parse_options(cls.Options, {"spark_conf": "nonsense"}, system)


def test_parse_conf():
    assert parse_conf("spark.a=1, spark.b.c = x=y") == {"spark.a": "1", "spark.b.c": "x=y"}
    assert parse_conf("") == {}


def test_error_line_finds_the_python_error_in_a_spark_failure():
    text = ("An error occurred while calling o1.collect.\n: org.apache.spark.SparkException: Job aborted\n"
            "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] Traceback (most recent call last):\n"
            '  File "x.py", line 3, in f\n    raise ValueError("bad")\nValueError: bad shard 3\n'
            "\tat org.apache.spark.Foo(Foo.scala:1)\n")
    assert error_line(RuntimeError(text)) == "ValueError: bad shard 3"
    torchrun = '[rank1]: Traceback (most recent call last):\n[rank1]:   File "f.py"\n[rank1]: RuntimeError: boom\n'
    assert error_line(RuntimeError("TorchDistributor failed"), torchrun) == "RuntimeError: boom"
    # the JVM's reason without its class name (Py4J's ': org.apache.spark.SparkException: ' prefix)
    assert error_line(RuntimeError("x\norg.apache.spark.SparkException: Job aborted: why")) == "Job aborted: why"
    assert error_line(RuntimeError("An error occurred while calling o7.collect.\n: org.apache.spark.SparkException: "
                                   "Job aborted due to stage failure: lost")) == "Job aborted due to stage failure: lost"


def test_unavailable_without_pyspark(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a))
    for system in ("spark-mllib", "spark-barrier", "spark-torch"):
        assert get_system(system).unavailable_reason() == "pyspark is not installed"
