"""Helpers shared by the Spark test modules: one SparkSession per module, and running an adapter
in-process with a bound on its time (a hung Spark job fails the test instead of hanging it)."""
from __future__ import annotations

import threading
from typing import Any

import pytest

from psbench.core.records import Recorder
from psbench.bench.harness.runner import plan
from psbench.core.spec import RunSpec

HANG_BOUND_S = 240  # a liveness guard, not a performance assertion
LOCAL2 = {"spark_master": "local[2]"}  # every test of a module reuses the module's session


@pytest.fixture(scope="module", autouse=True)
def spark_session():
    """One local[2] session per test module (import this fixture into the module)."""
    from psbench.systems.spark.session import get_session, stop_session

    yield get_session("local[2]", 2)
    stop_session()


def run_system(system: str, workload: str = "mlp-digits", workers: int = 2, **settings: Any) -> Recorder:
    """Plan and run one spec through its adapter in this process; returns the recorder."""
    options = settings.pop("options", {})
    spec = RunSpec(system=system, workload=workload, workers=workers, options=options, **settings)
    planned = plan(spec, allow_oversubscribe=True)  # local[2] + the driver on 2 cores: a functional test
    recorder = Recorder(spec)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            planned.system_cls().run(spec, planned.options, recorder)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    assert not thread.is_alive(), f"{system} did not finish within {HANG_BOUND_S}s (hung job?)"
    if "error" in outcome:
        raise outcome["error"]
    return recorder


def final_val_accuracy(recorder: Recorder) -> float:
    return recorder.summary()["final_val_accuracy"]
