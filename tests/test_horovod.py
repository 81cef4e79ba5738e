"""`horovod`: real Horovod (horovod.torch, gloo) under horovodrun. Needs the wheel from `make horovod`;
without it the Horovod runs are an explicit skip, and only the "not installed" path is tested."""
from __future__ import annotations

import sys
import time

import pytest

from allreduce_helpers import (check_accuracy, check_equals_concat_batch, check_records, fault_env, leftover_workers,
                               train, train_on_loopback)
from psbench.core.spec import RunSpec
from psbench.systems.allreduce_launch import WorkerFailed
from psbench.systems.base import parse_options
from psbench.systems.horovod.adapter import NOT_INSTALLED, HorovodOptions, HorovodSystem
from psbench.core.errors import ConfigError

WORKER = "psbench.systems.horovod.worker"
INSTALLED = HorovodSystem.unavailable_reason() is None


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    return train_on_loopback(HorovodSystem, RunSpec("horovod", "mlp-digits", workers=2, seed=0), HorovodOptions(),
                             WORKER, tmp_path_factory.mktemp("horovod-state"))


@pytest.mark.parametrize("check", [check_accuracy, check_records, check_equals_concat_batch],
                         ids=["reaches-accuracy", "records", "equals-concat-batch"])
@pytest.mark.horovod
@pytest.mark.skipif(not INSTALLED, reason="horovod not installed: run `make horovod`")
def test_two_workers(two_workers, check):
    check(two_workers)


@pytest.mark.horovod
@pytest.mark.skipif(not INSTALLED, reason="horovod not installed: run `make horovod`")
def test_worker_exception_is_one_error_naming_the_rank_and_leaves_no_orphans(monkeypatch, tmp_path):
    monkeypatch.setenv(*fault_env(rank=1, step=3))
    since = time.time()
    with pytest.raises(WorkerFailed, match=r"^horovod worker rank 1 failed: RuntimeError: injected fault at step 3"):
        train(HorovodSystem, RunSpec("horovod", "mlp-digits", workers=2, max_steps=20), HorovodOptions(), tmp_path)
    assert leftover_workers(WORKER, since) == []


@pytest.mark.horovod
@pytest.mark.skipif(not INSTALLED, reason="horovod not installed: run `make horovod`")
def test_timeout_stops_horovodrun_and_its_workers(tmp_path):
    since = time.time()
    with pytest.raises(WorkerFailed, match=r"horovod run timed out after 2 s"):
        train(HorovodSystem, RunSpec("horovod", "mlp-digits", workers=2), HorovodOptions(timeout_s=2), tmp_path)
    assert leftover_workers(WORKER, since) == [] and leftover_workers("horovodrun", since) == []


def test_not_installed_is_a_clear_config_error(tmp_path, monkeypatch, capsys):
    # A None entry in sys.modules makes `import horovod.torch` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    assert HorovodSystem.unavailable_reason() == NOT_INSTALLED
    from psbench.bench import cli

    rc = cli.main(["run", "--system", "horovod", "--workload", "mlp-digits", "-np", "2",
                   "--results-dir", str(tmp_path / "results"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "horovod is not installed: run `make horovod`" in err[0]
    with pytest.raises(ConfigError, match="horovod is not installed: run `make horovod`"):
        train(HorovodSystem, RunSpec("horovod", "mlp-digits", workers=2), HorovodOptions(), tmp_path)


@pytest.mark.parametrize("raw, message", [
    ({"hosts": "localhost:x"}, "is not HOST or HOST:SLOTS"),
    ({"hosts": ":2"}, "is not HOST or HOST:SLOTS"),
    ({"hosts": "h1:1,-oProxyCommand=touch pwned:1"}, "'-oProxyCommand=touch pwned' is not a host address; allowed: a hostname"),
    ({"timeout_s": "-1"}, "timeout_s must be > 0"),
])
def test_bad_options_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_options(HorovodOptions, raw, "horovod")
