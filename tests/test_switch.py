"""`switch` (Strategy-Switch): real DDP ranks, then real PS shards and workers, one timeline."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from async_helpers import ASYNC_ACCURACY, ASYNC_EPOCHS, check_async_learned
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.core.tables import read_table
from psbench.systems import get_system
from psbench.systems.allreduce_common import concat_batch_reference
from psbench.systems.base import parse_options
from psbench.systems.common import child_env
from psbench.systems.switch import adapter as switch_adapter
from psbench.systems.switch.adapter import SwitchOptions, SwitchSystem
from psbench.core.errors import ConfigError

TARGET_ACCURACY = ASYNC_ACCURACY  # switch at 40%, seed 0, 10 epochs: last-three mean 0.938-0.969 (n=7, under
#                                  load); the async phase varies with scheduling, so the bar is the PS async tests'
#                                  (async_helpers)
STEPS = 23 * ASYNC_EPOCHS  # a worker's steps: 23 an epoch (its ~719 mlp-digits examples, batch 32)
SWITCH_STEP = 92          # fixed:fraction=0.4 of the 230 common steps
WEIGHT_ATOL = 1e-5      # DDP vs single-process concat batch (tests/allreduce_helpers.py)


@pytest.fixture(scope="module")
def switched(tmp_path_factory):
    """One run shared by the checks: mlp-digits, 2 workers, DDP to 40% of the budget, then PS ASP
    (ASYNC_EPOCHS, as every async accuracy test)."""
    seen: dict[str, np.ndarray] = {}
    switch_adapter.HANDOVER_HOOK = seen.update
    try:
        spec = RunSpec("switch", "mlp-digits", workers=2, seed=0, epochs=ASYNC_EPOCHS,
                       options={"criterion": "fixed:fraction=0.4"})
        recorder = Recorder(spec, target_accuracy=TARGET_ACCURACY)
        SwitchSystem().run(spec, parse_options(SwitchOptions, spec.options, "switch"), recorder)
    finally:
        switch_adapter.HANDOVER_HOOK = None
    result = recorder.finish(tmp_path_factory.mktemp("results"), "switch-test")
    return spec, recorder, result, seen


def test_async_phase_starts_from_exactly_the_phase1_state(switched):
    spec, _, _, seen = switched
    # The PS shards hold rank 0's phase-1 weights and momentum buffers, bit for bit.
    assert seen["server_params"].dtype == np.float32
    assert np.array_equal(seen["server_params"], seen["phase1_weights"])
    assert np.array_equal(seen["server_momentum"], seen["phase1_momentum"])
    assert np.abs(seen["phase1_momentum"]).sum() > 0  # momentum really carried, not fresh zeros
    # ... and phase 1 is SWITCH_STEP synchronous steps: the single-process concat-batch reference.
    weights, momentum = concat_batch_reference(spec, SWITCH_STEP)
    assert np.abs(seen["phase1_weights"] - weights).max() < WEIGHT_ATOL
    assert np.abs(seen["phase1_momentum"] - momentum).max() < WEIGHT_ATOL
    # ... while one more or one fewer step would be clearly different.
    later, _ = concat_batch_reference(spec, SWITCH_STEP + 1)
    assert np.abs(seen["phase1_weights"] - later).max() > 100 * WEIGHT_ATOL


def test_manifest_records_criterion_and_switch_point(switched):
    _, _, result, _ = switched
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    info = manifest["extra"]["switch"]
    assert info["criterion"] == {"kind": "fixed", "epoch": None, "fraction": 0.4}
    assert info["fired"] is True and info["switch_step"] == SWITCH_STEP and info["handover_exact"] is True
    assert info["sync"] == "ddp" and info["async"] == "asp"
    assert info["phase2_steps"] == {"0": STEPS - SWITCH_STEP, "1": STEPS - SWITCH_STEP}
    events = read_table(result.out_dir, "events")
    switch = events[events["kind"] == "switch"]
    assert len(switch) == 1 and int(switch["step"].iloc[0]) == SWITCH_STEP
    detail = json.loads(switch["detail"].iloc[0])
    assert detail["criterion"] == "fixed:fraction=0.4" and detail["loss"] > 0 and 0 < detail["val_accuracy"] <= 1
    assert switch["t_wall"].iloc[0] == pytest.approx(info["switch_t_wall"])


def test_records_form_one_timeline(switched):
    _, recorder, result, _ = switched
    steps = read_table(result.out_dir, "steps")
    t_switch = recorder.extra["switch"]["switch_t_wall"]
    for worker, rows in steps.groupby("worker"):
        rows = rows.sort_values("step")
        assert rows["step"].tolist() == list(range(STEPS)), worker  # both phases, no gap, no repeat
        assert rows["t_wall"].is_monotonic_increasing, worker
        sync, async_ = rows[rows["step"] < SWITCH_STEP], rows[rows["step"] >= SWITCH_STEP]
        assert sync["staleness"].isna().all()                       # allreduce: no staleness
        assert async_["staleness"].notna().all() and (async_["staleness"] >= 0).all()
        assert sync["t_wall"].max() <= t_switch + 1e-6 <= async_["t_wall"].min() + 1e-6
    evals = read_table(result.out_dir, "evals")
    val = evals[evals["split"] == "val"]
    assert (val["step"] < SWITCH_STEP).sum() >= 2 and (val["step"] > SWITCH_STEP).sum() >= 2
    assert val["t_wall"].is_monotonic_increasing
    assert val["step"].iloc[-1] == STEPS
    # the async phase's first evaluation is of phase 1's final weights, stamped at the switch
    first_async = val[val["step"] == SWITCH_STEP].iloc[0]
    assert first_async["t_wall"] == pytest.approx(t_switch, abs=0.05)


def test_switch_run_reaches_accuracy(switched):
    _, _, result, _ = switched
    evals = read_table(result.out_dir, "evals")
    check_async_learned(evals[evals["split"] == "val"]["accuracy"])
    assert result.summary["time_to_target_s"] is not None
    # staleness comes from the async phase alone (allreduce rows have none), and two ASP workers
    # interleave, so some updates are stale
    steps = read_table(result.out_dir, "steps")
    async_staleness = steps[steps["step"] >= SWITCH_STEP]["staleness"]
    assert result.summary["staleness_mean"] == pytest.approx(async_staleness.mean())
    assert result.summary["staleness_mean"] > 0 and result.summary["staleness_max"] >= 1


@pytest.mark.parametrize("sync, sync_staleness", [("ddp", None), ("ps-bsp", 0)])
def test_criterion_that_never_fires_runs_sync_only(tmp_path, sync, sync_staleness):
    spec = RunSpec("switch", "mlp-digits", workers=2, seed=1, max_steps=30,
                   options={"criterion": "plateau:window=25,threshold=0.0001", "sync": sync})
    recorder = Recorder(spec)
    SwitchSystem().run(spec, parse_options(SwitchOptions, spec.options, "switch"), recorder)
    info = recorder.extra["switch"]
    assert info["fired"] is False and info["switch_step"] is None and "never fired" in info["note"]
    assert not [e for e in recorder.events if e["kind"] == "switch"]
    assert {r["step"] for r in recorder.steps} == set(range(30))
    assert all(r["staleness"] == sync_staleness for r in recorder.steps)  # allreduce: none; bsp: every update fresh


def test_ps_bsp_phase1_then_ssp(tmp_path):
    spec = RunSpec("switch", "mlp-digits", workers=2, seed=0, max_steps=40,
                   options={"criterion": "fixed:fraction=0.5", "sync": "ps-bsp", "async_consistency": "ssp:1"})
    recorder = Recorder(spec)
    SwitchSystem().run(spec, parse_options(SwitchOptions, spec.options, "switch"), recorder)
    info = recorder.extra["switch"]
    assert info["switch_step"] == 20 and info["handover_exact"] is True
    steps = pd.DataFrame(recorder.steps)
    assert sorted(steps[steps["worker"] == 0]["step"]) == list(range(40))
    phases = [p["consistency"] for p in recorder.extra["ps"]["phases"]]
    assert phases == ["bsp", "ssp:1"]
    assert (steps[steps["step"] < 20]["staleness"] == 0).all()  # BSP: every update fresh
    # SSP:1 with 2 workers: at most 2s+1 = 3 pushes of the other between a pull and a push
    assert (steps[steps["step"] >= 20]["staleness"] <= 3).all()
    assert recorder.extra["ps"]["phases"][1]["shards"][0]["max_gap"] <= 1


def test_ps_bsp_plateau_stops_every_worker_at_one_step_on_the_shared_mean_loss():
    """The plateau criterion on a PS BSP sync phase: each push reports the worker's loss, shard 0's
    reply gives every worker the step's mean, every worker's copy of the rule fires at the same step,
    and the switch step is where the rule, replayed on the recorded mean losses, fires first; on any
    one worker's own losses it would fire elsewhere (unsmoothed, a worker's noise crosses the threshold
    in the flat start). (Real shards and workers, both phases, as this module's other runs: ~15 s.)"""
    from psbench.systems.switch.criteria import Observation, parse_criterion

    criterion = "plateau:window=5,threshold=0.005,alpha=1"
    spec = RunSpec("switch", "mlp-digits", workers=3, seed=0, max_steps=100,
                   options={"criterion": criterion, "sync": "ps-bsp"})
    recorder = Recorder(spec)
    SwitchSystem().run(spec, parse_options(SwitchOptions, spec.options, "switch"), recorder)
    info = recorder.extra["switch"]
    assert info["fired"] is True and info["handover_exact"] is True
    k = info["switch_step"]
    steps = pd.DataFrame(recorder.steps)
    sync, async_ = steps[steps["step"] < k], steps[steps["step"] >= k]
    assert (sync["staleness"] == 0).all() and len(async_)  # BSP: every update fresh; then the async phase
    # every worker's sync phase ends after step k - 1, and its async phase starts at step k
    assert sync.groupby("worker")["step"].max().tolist() == [k - 1] * 3
    assert async_.groupby("worker")["step"].min().tolist() == [k] * 3
    assert [p["consistency"] for p in recorder.extra["ps"]["phases"]] == ["bsp", "asp"]

    def fires_at(losses: pd.Series) -> int | None:
        rule = parse_criterion(criterion)
        return next((step + 1 for step, loss in losses.sort_index().items()
                     if rule.should_switch(Observation(step + 1, 0, 100, float(loss)))), None)

    assert fires_at(sync.groupby("step")["loss"].mean()) == k > 20  # past the loss's flat start
    own = [fires_at(rows.set_index("step")["loss"]) for _, rows in sync.groupby("worker")]
    assert any(step != k for step in own), own


def test_a_push_report_is_checked_and_only_taken_under_bsp():
    """A push's report is two finite numbers under bsp (else a clear error, nothing applied); the
    step's reply gives each worker the mean loss and the latest clock."""
    from psbench.systems.ps import protocol
    from psbench.systems.ps.server import Shard

    def push(shard, worker, report):
        extra = {} if report is None else {"report": report}
        frames = protocol.encode("push", worker=worker, step=0, keys=[0], arrays=[np.ones(2, np.float32)],
                                 rid=1, want_params=False, **extra)
        shard.receive(bytes([worker]), frames, None, 2**20)
        out = [protocol.decode(frames) for _, frames in shard.outbox]
        shard.outbox.clear()
        return out

    def shard(consistency):
        s = Shard(0, 2, lr=0.1, consistency=consistency)
        s.receive(b"a", protocol.encode("init", worker=-1, keys=[0], arrays=[np.zeros(2, np.float32)], rid=1),
                  None, 2**20)
        s.outbox.clear()
        return s

    bsp = shard("bsp")
    for bad in ([1.0], [float("nan"), 1.0], ["x", 1.0], [True, 1.0]):
        (reply,) = push(bsp, 0, bad)
        assert reply.op == "error" and "report must be [loss, seconds]" in reply.extra["error"]
        assert bsp.version == 0 and not bsp.policy.pending
    assert push(bsp, 0, [0.5, 2.0]) == []  # held for the step
    replies = push(bsp, 1, [1.5, 3.0])
    assert [(m.extra["step_loss"], m.extra["step_clock_s"]) for m in replies] == [(1.0, 3.0)] * 2
    (reply,) = push(shard("asp"), 0, [0.5, 2.0])
    assert reply.op == "error" and "needs consistency bsp" in reply.extra["error"]


@pytest.mark.parametrize("raw, message", [
    ({"criterion": "soon"}, "unknown switch criterion"),
    ({"criterion": "plateau:window=1"}, "window must be >= 2"),
    ({"sync": "horovod"}, "option sync must be one of ddp, ps-bsp"),
    ({"async_consistency": "bsp"}, "must be asynchronous"),
    ({"mitigation": "magic"}, "mitigation"),
    ({"servers": "0"}, "servers must be >= 1"),
])
def test_bad_options_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_options(SwitchOptions, raw, "switch")


def test_cli_bad_criterion_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "psbench", "run", "--system", "switch", "--workload", "mlp-digits",
                           "-np", "2", "--criterion", "plateau:window=x", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, env=child_env(), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "window must be a number" in lines[0], proc.stderr


def test_registered():
    assert get_system("switch") is SwitchSystem


def test_handover_is_on_the_training_clock(switched):
    """The hand-over is paid on the clock: the async phase's first step comes at least the hand-over
    after the switch, and the hand-over is also shown on its own (manifest and a `handover` event).
    After DDP the PS processes are a warm standby (started before phase 1, launch cost), so the
    hand-over moves the state only: measured, not zero, and not a process start-up."""
    _, recorder, result, _ = switched
    info = recorder.extra["switch"]
    steps = read_table(result.out_dir, "steps")
    first_async = steps[steps["step"] >= SWITCH_STEP]["t_wall"].min()
    assert info["phase2_started"] == "before phase 1 (standby)"
    assert info["handover_s"] > 0  # phase 1's ranks leave, the shards take the state
    assert first_async - info["switch_t_wall"] >= info["handover_s"]
    events = read_table(result.out_dir, "events")
    handover = events[events["kind"] == "handover"]
    assert len(handover) == 1 and json.loads(handover["detail"].iloc[0])["seconds"] == pytest.approx(info["handover_s"])
    assert recorder.summary()["train_s"] >= info["switch_t_wall"] + info["handover_s"]
