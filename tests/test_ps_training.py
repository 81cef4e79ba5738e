"""End-to-end PS runs with real processes: BSP equals averaged-gradient SGD, ASP/SSP learn, the SSP
bound holds, staleness is recorded, failures are reported and nothing is left running."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import psutil
import pytest
import torch

from async_helpers import ASYNC_EPOCHS, check_async_learned
from psbench.bench.cli import main as cli_main
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.tables import read_table
from psbench.systems.common import flat_params, forward_backward, make_optimizer, prepare
from psbench.systems.ps.adapter import PSOptions, run_ps_phase
from psbench.systems.ps.launch import LaunchError



def no_children() -> list:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def test_the_async_bar_fails_a_run_ending_at_0_6_or_zigzagging_around_0_8():
    check_async_learned([0.3, 0.7, 0.9, 0.93, 0.95])
    for curve in ([0.5, 0.9, 0.95, 0.93, 0.6], [0.6, 0.9, 0.78, 0.84, 0.83], [0.9, 0.95, 0.1]):
        with pytest.raises(AssertionError):
            check_async_learned(curve)


def test_bsp_equals_single_process_sgd_on_the_averaged_gradient():
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=3, max_steps=12)
    prep = prepare(spec)
    recorder = Recorder(spec)
    result = run_ps_phase(prep, PSOptions(consistency="bsp", servers=2), recorder)

    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(model, prep.workload, prep.lr)
    for (_, x0, y0), (_, x1, y1) in zip(prep.batches(0), prep.batches(1)):
        grads = []
        for x, y in ((x0, y0), (x1, y1)):
            forward_backward(model, loss_fn, x, y)
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        optimizer.step()
    np.testing.assert_allclose(result.params, flat_params(model), rtol=1e-5, atol=1e-6)
    momentum = torch.cat([optimizer.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()]).numpy()
    np.testing.assert_allclose(result.momentum, momentum, rtol=1e-5, atol=1e-6)
    steps = pd.DataFrame(recorder.steps)
    assert len(steps) == 24 and set(steps["staleness"]) == {0}
    assert result.steps == {0: 12, 1: 12}
    assert all(s["applied"] == 12 for s in result.server_stats)
    assert not no_children()


def test_pipelined_asp_computes_each_gradient_one_reply_behind():
    """--pipeline: gradient t (t >= 1) is computed on the weights before update t-1 while that
    push is in flight; the shard counts staleness 1 from the version the push names."""
    steps = 12
    spec = RunSpec("ps", "mlp-digits", workers=1, seed=5, max_steps=steps)
    prep = prepare(spec)
    recorder = Recorder(spec)
    result = run_ps_phase(prep, PSOptions(consistency="asp", pipeline=True), recorder)

    server_model, lagging = prep.build_model(), prep.build_model()  # w_t, and the weights the worker holds
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(server_model, prep.workload, prep.lr)  # 1 worker: lr scaling 1
    for _, x, y in prep.batches(0):
        forward_backward(lagging, loss_fn, x, y)
        lagging.load_state_dict(server_model.state_dict())  # the next gradient sees w_t ...
        for p, q in zip(server_model.parameters(), lagging.parameters()):
            p.grad = q.grad.clone()
        optimizer.step()                                     # ... while g_t makes w_{t+1}
    np.testing.assert_allclose(result.params, flat_params(server_model), rtol=1e-5, atol=1e-6)
    rows = pd.DataFrame(recorder.steps)
    assert rows["step"].tolist() == list(range(steps))
    assert rows["staleness"].tolist() == [0] + [1] * (steps - 1)
    assert result.server_stats[0]["applied"] == steps and not no_children()


def test_cli_asp_run_learns_and_records_staleness(results_dir):
    rc = cli_main(["run", "--system", "ps", "--workload", "mlp-digits", "-np", "2", "--consistency", "asp",
                   "--epochs", str(ASYNC_EPOCHS),
                   "--allow-oversubscribe",  # 2 compute-bound workers + the shard: a functional test
                   "--results-dir", str(results_dir), "--suite", "t", "--no-progress"])
    assert rc == 0
    [run] = list((results_dir / "t").iterdir())
    manifest = json.loads((run / "manifest.json").read_text())
    summary = manifest["summary"]
    assert summary["staleness_mean"] > 0 and summary["staleness_max"] >= 1
    # the exchange timed alone after training: a push + pull of the same tensors, within a step
    assert 0 < manifest["extra"]["ps_roundtrip_alone_s"] < summary["median_step_s"]
    assert sum(summary["staleness_hist"].values()) == summary["steps"]
    steps = read_table(run, "steps")
    assert set(steps["worker"]) == {0, 1} and steps["staleness"].notna().all() and (steps["bytes"] > 0).all()
    evals = read_table(run, "evals")
    val = evals[evals["split"] == "val"]  # in step order
    assert len(val) >= 3 and val["accuracy"].iloc[-1] == pytest.approx(summary["final_val_accuracy"])
    check_async_learned(val["accuracy"])
    assert not no_children()


def test_ssp_learns_and_never_exceeds_its_bound():
    bound = 1
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, epochs=ASYNC_EPOCHS)
    recorder = Recorder(spec)
    result = run_ps_phase(prepare(spec), PSOptions(consistency=f"ssp:{bound}"), recorder)
    [shard] = result.server_stats
    assert shard["policy"] == "ssp" and shard["max_gap"] <= bound  # the server's own record
    steps = pd.DataFrame(recorder.steps)
    # With 2 workers, between a worker's pull and its next push the other can push at most 2s+1 times.
    assert steps["staleness"].max() <= 2 * bound + 1
    val = [e for e in recorder.evals if e["split"] == "val"]
    check_async_learned(e["accuracy"] for e in val)


def test_worker_failure_fails_the_run_naming_the_worker_and_leaves_no_processes():
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, max_steps=50)
    with pytest.raises(LaunchError, match=r"ps worker 1 failed(.|\n)*injected failure in worker 1 at step 3"):
        run_ps_phase(prepare(spec), PSOptions(consistency="bsp"), Recorder(spec), fail_worker_at=(1, 3))
    assert not no_children()


def test_ctrl_c_stops_every_process(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from psbench.systems.common import child_env

    def as_from_a_terminal() -> None:
        # SIGINT at its default and unblocked, as a shell's child has it. In full runs of the suite
        # (never alone) the child ignored SIGINT: an earlier test leaves this process with SIGINT
        # ignored or blocked, and both are inherited across exec.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "psbench.bench.cli", "run", "--system", "ps", "--workload", "mlp-digits",
                             "-np", "2", "--epochs", "5000", "--allow-oversubscribe", "--results-dir", str(tmp_path),
                             "--no-progress"],
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 90
    family: list[psutil.Process] = []
    while time.monotonic() < deadline:  # wait until the 1 server and 2 workers are up
        family = parent.children(recursive=True)
        if len(family) >= 3:
            break
        time.sleep(0.2)
    assert len(family) >= 3, "the run never started its processes"
    time.sleep(3)  # let the workers train for a bit (5000 epochs: still training when the signal comes)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()[-2000:]
    gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive, f"left running: {alive}"


def test_shards_and_workers_leave_when_their_launcher_is_killed(tmp_path):
    """SIGKILL on `psbench run` (no chance to clean up): the shard, the zygote and the workers it
    forked watch the launcher's pid (PSBENCH_LAUNCHER_PID; a worker's parent is the zygote) and exit."""
    import subprocess
    import sys
    import time

    from allreduce_helpers import kill_launcher_and_expect_gone
    from psbench.core.supervisor import LAUNCHER_PID_ENV
    from psbench.systems.common import child_env

    launcher = subprocess.Popen([sys.executable, "-m", "psbench", "run", "--system", "ps", "-np", "2", "--workload",
                                 "mlp-digits", "--emulate-device", "step_ms=50", "--epochs", "1000",
                                 "--results-dir", str(tmp_path), "--no-progress"],
                                env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        family: list[psutil.Process] = []
        while time.monotonic() < deadline:  # a shard, the zygote and 2 workers, the workers training
            family = psutil.Process(launcher.pid).children(recursive=True)
            workers = [p for p in family if p.ppid() != launcher.pid]
            if len(family) == 4 and len(workers) == 2 and all(p.net_connections("tcp") for p in workers):
                break
            time.sleep(0.2)
        assert len(family) == 4 and len(workers) == 2, [p.cmdline() for p in family]
        assert all(p.environ().get(LAUNCHER_PID_ENV) == str(launcher.pid) for p in family)
        kill_launcher_and_expect_gone(launcher, family)
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_a_round_trip_alone_pushes_to_a_shard_that_applies_nothing():
    """one_shard's shard has lr 0 and momentum 0: pushes of ones leave its zeros, so timing it
    changes no state (time_push_pull_alone's figure: the CLI run above records it)."""
    from psbench.systems.ps.alone import one_shard

    shapes = [(3, 4), (5,)]
    with one_shard(shapes, "t") as kv:
        for step in range(3):
            reply = kv.push_pull([np.ones(s, np.float32) for s in shapes], step)
            assert all((a == 0).all() for a in reply.params.values()) and len(reply.params) == 2
    assert not no_children()
