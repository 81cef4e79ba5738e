"""The peer parameter servers `ray-ps` (Ray actors) and `rpc-ps` (torch.distributed.rpc): real Ray
and real RPC processes train mlp-digits with 2 workers under asp and bsp; bsp equals one process
doing SGD on the averaged gradients; records are those of `ps`; everything listens on loopback and
nothing is left running. Without ray, ray-ps is an explicit skip with its reason."""
from __future__ import annotations

import ipaddress
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
import psutil
import pytest
import torch

from allreduce_helpers import TARGET_ACCURACY, WEIGHT_ATOL, ListenWatch
from async_helpers import ASYNC_EPOCHS, check_async_learned
from psbench.bench.cli import main as cli_main
from psbench.core.records import STEP_COLUMNS, Recorder
from psbench.core.spec import RunSpec
from psbench.systems import get_system
from psbench.systems.allreduce_launch import WorkerFailed
from psbench.systems.common import flat_params, forward_backward, make_optimizer, prepare
from psbench.systems.peer_common import PeerFailed, PeerOptions
from psbench.systems.ray_ps.adapter import NOT_INSTALLED, RayPSSystem
from psbench.core.errors import ConfigError

RAY = RayPSSystem.unavailable_reason() is None
NO_RAY = "ray not installed: run `make setup` (the `ray` extra)"
SYSTEMS = [pytest.param("ray-ps", marks=pytest.mark.skipif(not RAY, reason=NO_RAY)), "rpc-ps"]


@dataclass
class PeerRun:
    spec: RunSpec
    recorder: Recorder
    final: np.ndarray
    listening: set[str]


@contextmanager
def no_process_left() -> Iterator[dict[int, float]]:
    """Records every process descended from this one while the block runs (Ray's gcs_server,
    raylet and actors; RPC servers and trainers), then asserts none is still running, orphaned
    or not. Processes of other runs on the machine are not ours and are not counted."""
    seen: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        me = psutil.Process()
        while not stop.wait(0.05):
            for child in me.children(recursive=True):
                try:
                    seen[child.pid] = child.create_time()
                except psutil.NoSuchProcess:
                    pass

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
    alive = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.cmdline()[:3])
        except psutil.NoSuchProcess:
            pass
    assert seen and alive == []


def _train(system: str, spec: RunSpec, options: PeerOptions) -> PeerRun:
    """One run through the adapter module's `train` (it returns the servers' final parameters),
    watching what this process's descendants listen on; asserts nothing is left running."""
    import importlib

    module = importlib.import_module(get_system(system).__module__)
    prep = prepare(spec)
    recorder = Recorder(spec, target_accuracy=prep.workload.target_accuracy)
    with no_process_left(), ListenWatch() as watch:
        final = module.train(prep, options, recorder)
    return PeerRun(spec, recorder, final, watch.addresses)


@pytest.fixture(scope="module", params=SYSTEMS)
def system(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def bsp_run(system) -> PeerRun:
    # 2 shards: each worker's gradient and each reply are split by key, as for ps --servers 2
    return _train(system, RunSpec(system, "mlp-digits", workers=2, seed=0), PeerOptions("bsp", servers=2))


@pytest.fixture(scope="module")
def asp_run(system) -> PeerRun:
    return _train(system, RunSpec(system, "mlp-digits", workers=2, seed=0, epochs=ASYNC_EPOCHS), PeerOptions("asp"))


def _val(run: PeerRun) -> list[float]:
    return [e["accuracy"] for e in sorted(run.recorder.evals, key=lambda e: e["step"]) if e["split"] == "val"]


def check_records(run: PeerRun) -> None:
    """The columns and cadence of ps: every step of every worker in order on the training clock,
    evaluations at step 0, every eval_every steps of worker 0, and at the end."""
    prep = prepare(run.spec)
    steps = pd.DataFrame(run.recorder.steps)
    assert list(pd.DataFrame(run.recorder.steps, columns=STEP_COLUMNS).columns) == STEP_COLUMNS
    assert set(steps.columns) == set(STEP_COLUMNS)
    summary = run.recorder.summary()
    n_params = sum(p.numel() for p in prep.build_model().parameters())
    for w in range(run.spec.workers):
        rows = steps[steps["worker"] == w]
        assert rows["step"].tolist() == list(range(prep.total_steps(w)))
        t = rows["t_wall"].to_numpy()
        assert (np.diff(t) >= 0).all() and t[0] >= 0 and t[-1] <= summary["train_s"] + 1e-6
        assert (rows["bytes"] == 2 * 4 * n_params).all() and np.isfinite(rows["loss"]).all()
        assert rows["staleness"].notna().all() and (rows["staleness"] >= 0).all()
    every, last = prep.eval_every(0), prep.total_steps(0)
    expected = sorted({0, last} | set(range(every, last, every)))
    assert sorted({e["step"] for e in run.recorder.evals}) == expected
    assert summary["samples"] == sum(len(prep.plan.shards[w]) for w in range(2)) * prep.epochs
    assert summary["samples_per_s"] > 0


def check_loopback(run: PeerRun) -> None:
    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip)
        return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)

    assert run.listening and all(loopback(ip) for ip in run.listening), run.listening


def test_bsp_learns_with_staleness_zero(bsp_run):
    assert bsp_run.recorder.summary()["final_val_accuracy"] >= TARGET_ACCURACY, _val(bsp_run)
    assert set(pd.DataFrame(bsp_run.recorder.steps)["staleness"]) == {0}


def test_bsp_equals_single_process_sgd_on_the_averaged_gradient(bsp_run):
    """Each round: the mean of the active workers' gradients, one torch SGD step (momentum 0.9)."""
    prep = prepare(bsp_run.spec)
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(model, prep.workload, prep.lr)  # bsp: lr scaling 1
    streams = [list(prep.batches(w)) for w in range(2)]
    for r in range(max(len(s) for s in streams)):
        grads = []
        for _, x, y in (s[r] for s in streams if r < len(s)):
            forward_backward(model, loss_fn, x, y)
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = torch.stack(gs).mean(0)
        optimizer.step()
    np.testing.assert_allclose(bsp_run.final, flat_params(model), rtol=1e-5, atol=WEIGHT_ATOL)


def test_asp_learns_and_records_staleness(asp_run):
    check_async_learned(_val(asp_run))
    staleness = pd.DataFrame(asp_run.recorder.steps)["staleness"]
    assert staleness.mean() > 0  # two workers interleave: some gradients land on moved weights


def test_bsp_records_are_those_of_ps_and_sockets_are_loopback(bsp_run):
    check_records(bsp_run)
    check_loopback(bsp_run)


def test_asp_records_are_those_of_ps_and_sockets_are_loopback(asp_run):
    check_records(asp_run)
    check_loopback(asp_run)


@pytest.mark.parametrize("name", SYSTEMS)
def test_timeout_stops_everything(name):
    with no_process_left(), pytest.raises((PeerFailed, WorkerFailed), match="timed out"):
        _train(name, RunSpec(name, "mlp-digits", workers=2), PeerOptions("asp", timeout_s=1.0))


@pytest.mark.parametrize("name", ["ray-ps", "rpc-ps"])
@pytest.mark.parametrize("raw, message", [
    ({"consistency": "ssp:2"}, "not supported by the peer systems; allowed: asp | bsp"),
    ({"servers": "0"}, "servers must be >= 1"),
    ({"lr_scaling": "fast"}, "lr_scaling 'fast' unknown"),
    ({"timeout_s": "0"}, "timeout_s must be > 0"),
])
def test_bad_options_are_one_line_errors(name, raw, message, tmp_path, capsys):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in raw.items()]
    rc = cli_main(["run", "--system", name, "--workload", "mlp-digits", "-np", "2", *flags,
                   "--results-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("name", SYSTEMS)
def test_more_shards_than_tensors_fails_before_any_process_starts(name):
    import importlib

    module = importlib.import_module(get_system(name).__module__)
    spec = RunSpec(name, "mlp-digits", workers=2)
    with pytest.raises(ConfigError, match="exceeds the model's"):
        module.train(prepare(spec), PeerOptions("asp", servers=64), Recorder(spec))
    assert not psutil.Process().children(recursive=True)


def test_list_shows_the_peers(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "  ray-ps " in out and "  rpc-ps " in out


def test_without_ray_ray_ps_is_an_explicit_skip_with_its_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, installed or not
    assert RayPSSystem.unavailable_reason() == NOT_INSTALLED
    rc = cli_main(["run", "--system", "ray-ps", "--workload", "mlp-digits", "-np", "2",
                   "--results-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "system 'ray-ps' is not available here: ray is not installed" in err[0]
    assert cli_main(["list"]) == 0
    assert f"[unavailable: {NOT_INSTALLED}]" in capsys.readouterr().out
    from psbench.bench.harness.runner import run_all

    assert run_all([RunSpec("ray-ps", "mlp-digits", workers=2)], tmp_path, "suite", progress=False,
                   skip_unavailable=True) == []
    assert "psbench: skipping ray-ps-mlp-digits-w2" in capsys.readouterr().err
    assert not psutil.Process().children(recursive=True)
