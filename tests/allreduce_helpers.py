"""Checks shared by tests/test_ddp.py and tests/test_horovod.py: one system, same assertions."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from psbench.core.records import Recorder
from psbench.core.supervisor import LAUNCHER_PID_ENV
from psbench.core.spec import RunSpec
from psbench.systems.allreduce_common import FAULT_ENV, concat_batch_reference, read_state, ring_allreduce_bytes
from psbench.systems.common import prepare

TARGET_ACCURACY = 0.90  # mlp-digits, 2 workers, 5 epochs: validation accuracy reached (0.936 measured)
WEIGHT_ATOL = 1e-5      # measured max |difference| 1.8e-7 after 115 steps


@dataclass
class TrainedRun:
    spec: RunSpec
    recorder: Recorder
    state_dir: Path
    wall_s: float


def train(system_cls: Any, spec: RunSpec, options: Any, state_dir: Path) -> TrainedRun:
    recorder = Recorder(spec, target_accuracy=TARGET_ACCURACY)
    start = time.time()
    system_cls().run(spec, options, recorder, state_out=state_dir)
    return TrainedRun(spec, recorder, state_dir, time.time() - start)


def train_on_loopback(system_cls: Any, spec: RunSpec, options: Any, worker_module: str, state_dir: Path) -> TrainedRun:
    """`train`, asserting that every socket the run listened on (rendezvous stores, launchers'
    servers, gloo pairs) was on loopback and that no worker of `worker_module` is left running."""
    since = time.time()
    with ListenWatch() as listening:
        run = train(system_cls, spec, options, state_dir)
    assert listening.addresses and listening.addresses <= {"127.0.0.1"}, listening.addresses
    assert leftover_workers(worker_module, since) == []
    return run


@dataclass
class ListenWatch:
    """Collects the addresses that this process's descendants listen on, while a run is going."""
    addresses: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _poll(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            pids = {c.pid for c in me.children(recursive=True)}
            for conn in psutil.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
                    self.addresses.add(conn.laddr.ip)

    def __enter__(self) -> "ListenWatch":
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def leftover_workers(module: str, since: float) -> list[psutil.Process]:
    """Worker processes of `module` started since `since` and still alive (orphans), ranks this
    process launched through a zygote (their command line is the zygote's; their environment names
    us as launcher), and any child of this process (a launcher left behind)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            ours = "psbench.core.zygote" in cmd and proc.environ().get(LAUNCHER_PID_ENV) == str(os.getpid())
            if (module in cmd or ours) and proc.info["create_time"] >= since - 1 \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found + [c for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]


def kill_launcher_and_expect_gone(launcher: subprocess.Popen, family: list[psutil.Process], within_s: float = 15) -> None:
    """SIGKILL the launcher (no chance to clean up), then every process it started must exit by itself."""
    launcher.kill()
    launcher.wait()
    _, alive = psutil.wait_procs(family, timeout=within_s)
    assert alive == [], f"left running after the launcher died: {[p.cmdline() for p in alive]}"


def check_accuracy(run: TrainedRun) -> None:
    summary = run.recorder.summary()
    assert summary["final_val_accuracy"] >= TARGET_ACCURACY, summary
    assert summary["time_to_target_s"] is not None


def check_records(run: TrainedRun) -> None:
    """Both ranks recorded every step; rank 0 evaluated at single's cadence, off the clock."""
    prep = prepare(run.spec)
    steps = run.recorder.extra["steps_per_worker"]
    assert steps == min(prep.total_steps(w) for w in range(run.spec.workers))
    n_params = sum(p.numel() for p in prep.build_model().parameters())
    for worker in range(run.spec.workers):
        rows = [r for r in run.recorder.steps if r["worker"] == worker]
        assert [r["step"] for r in rows] == list(range(steps))
        t = [r["t_wall"] for r in rows]
        assert all(b >= a for a, b in zip(t, t[1:])) and t[0] >= 0
        assert all(r["bytes"] == ring_allreduce_bytes(n_params, run.spec.workers) for r in rows)
        assert all(np.isfinite(r["loss"]) for r in rows)
    every = prep.eval_every()
    expected = sorted({0, steps} | set(range(every, steps + 1, every)))
    assert sorted({e["step"] for e in run.recorder.evals}) == expected
    assert run.recorder.extra["eval_s"] > 0
    summary = run.recorder.summary()
    assert summary["samples"] == sum(r["n_samples"] for r in run.recorder.steps) > 0
    # every rank runs on rank 0's clock (evaluation kept off it): the last step of any rank lies
    # within the run's training time, up to the ranks' start skew at the barrier
    assert max(r["t_wall"] for r in run.recorder.steps) <= summary["train_s"] + 0.005


def check_equals_concat_batch(run: TrainedRun) -> None:
    """Synchronous allreduce on 2 ranks == one process on the concatenated mini-batches."""
    weights, momentum = read_state(run.state_dir)
    ref_w, ref_m = concat_batch_reference(run.spec, run.recorder.extra["steps_per_worker"])
    assert weights.shape == ref_w.shape and momentum.shape == ref_m.shape
    np.testing.assert_allclose(weights, ref_w, rtol=0, atol=WEIGHT_ATOL)
    np.testing.assert_allclose(momentum, ref_m, rtol=0, atol=WEIGHT_ATOL)
    # and it is not trivially equal: training moved the weights away from the initial ones
    init = np.concatenate([p.detach().numpy().ravel() for p in prepare(run.spec).build_model().parameters()])
    assert np.abs(weights - init).max() > 100 * WEIGHT_ATOL


def fault_env(rank: int, step: int) -> tuple[str, str]:
    return FAULT_ENV, f"{rank}:{step}"
