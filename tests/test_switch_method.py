"""The method every Strategy-Switch comparison rests on: a time budget that ends every system (and
both phases of a switch) on the same training clock, a timer evaluator that evaluates every system
on the same schedule, and the hand-over's loss spikes on record."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from psbench.bench.harness.runner import plan, record_run
from psbench.core.spec import RunSpec

STEP_S = 0.02  # the emulated device's step


def run(system: str, workers: int, budget_s: float, every_s: float, **options) -> tuple[pd.DataFrame, pd.DataFrame, object]:
    spec = RunSpec(system, "mlp-digits", workers=workers, budget=f"seconds={budget_s:g}", eval_every_s=every_s,
                   emulate_device=f"step_ms={STEP_S * 1000:g}", options=options)
    recorder = record_run(plan(spec, allow_oversubscribe=True))
    evals = pd.DataFrame(recorder.evals)
    return pd.DataFrame(recorder.steps), evals[evals["split"] == "val"], recorder


def on_grid(times: pd.Series, every_s: float, slack_s: float) -> bool:
    """Every evaluation after the first lies within slack_s after a multiple of every_s."""
    return all(0 <= t - math.floor(t / every_s) * every_s <= slack_s for t in times)


@pytest.mark.parametrize("system, workers, options", [("single", 1, {}), ("ddp", 2, {}), ("ps", 2, {"consistency": "asp"}),
                                                      ("ps", 2, {"consistency": "bsp"})])
def test_a_time_budget_ends_the_run_and_the_timer_evaluates_on_one_grid(system, workers, options):
    budget_s, every_s = 3.0, 0.5
    steps, val, recorder = run(system, workers, budget_s, every_s, **options)
    last = steps.groupby("worker")["t_wall"].max()
    # every worker stops once the clock passes the budget: its last step ends within a few steps of it
    assert (last >= budget_s - 3 * STEP_S).all() and (last <= budget_s + 5 * STEP_S).all(), last.to_dict()
    # the schedule: one evaluation per multiple of every_s (a step's end after it), plus the start and the end
    slack = 0.25  # a step, a pull from the servers, a loaded machine's scheduling
    assert on_grid(val["t_wall"].iloc[1:-1], every_s, slack), val["t_wall"].round(3).tolist()
    covered = {math.floor(t / every_s + 1e-9) for t in val["t_wall"]}
    assert covered >= set(range(int(budget_s / every_s))), sorted(covered)
    assert recorder.summary()["budget"] == f"seconds={budget_s:g}"
    assert "last 3" in recorder.summary()["time_to_target_rule"]


def test_a_switch_keeps_one_budget_and_one_evaluation_grid_across_both_phases():
    """fixed:fraction=0.2 of a 7 s budget: the sync phase hands over at ~1.4 s of the clock, the
    async phase trains until 7 s; the timer's grid goes on through the hand-over; spikes are
    looked for and summarised."""
    budget_s, every_s = 7.0, 1.0
    steps, val, recorder = run("switch", 2, budget_s, every_s, criterion="fixed:fraction=0.2",
                               warmup="lr:from=0.2,updates=40")
    info = recorder.extra["switch"]
    assert info["fired"] is True and 0.2 * budget_s <= info["switch_t_wall"] <= 0.2 * budget_s + 0.5
    async_rows = steps[steps["staleness"].notna()]
    assert len(async_rows) and async_rows["t_wall"].max() <= budget_s + 5 * STEP_S
    assert async_rows["t_wall"].max() >= budget_s - 3 * STEP_S
    timed = val[(val["t_wall"] - info["switch_t_wall"]).abs() > 1e-9]  # the hand-over's own evaluation aside
    assert on_grid(timed["t_wall"].iloc[1:-1], every_s, 0.3), val["t_wall"].round(3).tolist()
    assert (val["t_wall"] == info["switch_t_wall"]).sum() == 1  # the hand-over's weights evaluated once
    spikes = info["spikes"]
    assert spikes["pre_switch_loss"] > 0 and spikes["spikes"] >= 0 and "2 x" in spikes["rule"]
    phase2 = recorder.extra["ps"]["phases"][-1]
    assert phase2["warmup"] == {"kind": "lr", "start": 0.2, "updates": 40}
    assert phase2["async_step"]["step_per_sample_vs_sync"] == pytest.approx(1.0)


class _Steps:
    """What record_spikes reads and writes of a Recorder: its step rows and its events."""

    def __init__(self, rows: list[dict]):
        self.steps, self.events = rows, []

    def event(self, kind: str, **detail) -> None:
        self.events.append((kind, detail))


def _rows(losses_by_step: dict[int, list[float]]) -> list[dict]:
    return [{"step": step, "worker": w, "t_wall": step * 0.1, "loss": loss}
            for step, losses in losses_by_step.items() for w, loss in enumerate(losses)]


def test_a_loss_spike_is_beyond_the_hand_over_loss_and_beyond_the_sync_phases_own_noise():
    from psbench.systems.switch.adapter import SPIKE_AFTER, record_spikes

    # sync phase (steps 0-9): mean loss 0.0625, a small batch swinging up to 0.3 (4.8x the mean)
    before = {s: [0.05, 0.3 if s == 4 else 0.05] for s in range(10)}
    # async phase: a batch at 0.25 (4x the mean, but no more than the sync phase's own noise) is not a spike;
    # 0.9 and 0.6 are; beyond the first SPIKE_AFTER async steps nothing is looked for
    after = {10: [0.25, 0.9], 11: [0.6, 0.05], 10 + SPIKE_AFTER: [5.0, 5.0]}
    recorder = _Steps(_rows({**before, **after}))
    summary = record_spikes(recorder, switch_step=10)
    assert summary["pre_switch_loss"] == pytest.approx(0.0625) and summary["pre_switch_max_loss"] == 0.3
    assert summary["spikes"] == 2
    assert sorted(d["loss"] for kind, d in recorder.events if kind == "loss_spike") == [0.6, 0.9]
    assert summary["max_ratio"] == pytest.approx(0.9 / 0.0625)
