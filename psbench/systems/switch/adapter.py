"""`switch`: Strategy-Switch (Provatas et al., IEEE Access 2025). Phase 1 trains synchronously
(torch DDP allreduce, or PS BSP) until a criterion (systems/switch/criteria.py) fires: under DDP
on rank 0's training loss (one small reduction a step shares the decision); under PS BSP on the
step's mean training loss over the workers, which shard 0's reply gives every worker alike at the
step's barrier (each evaluates the same rule on the same report, so all stop at one step); phase 2 continues asynchronously on the PS (ASP or SSP:s, any mitigation) from
phase 1's weights, SGD momentum buffers and BatchNorm statistics, with the same workers, shards
and batch stream, for the rest of the step budget. One run, one clock, one set of records.

Hand-over: the sync workers stop together after the step where the criterion fired; the state
(DDP: rank 0's, through the job directory as raw .npy; PS BSP: the shards') goes into phase 2's
PS shards (`init`), whose state is read back
and compared bit for bit before the PS workers start (manifest: extra.switch.handover_exact).
Phase 2's processes (shards, workers with their data) are started before phase 1 and wait: a
warm standby, as a hybrid system keeps both runtimes up, so their start-up is launch cost. The
hand-over (phase 1's ranks leaving, the state into the shards, the go) is on the training clock:
a switch pays it before its async phase trains, so time to accuracy includes it. Its length is
also shown on its own: extra.switch.handover_s and a `handover` event.
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from psbench.core.cpu import Proc
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.allreduce_common import common_steps, read_buffers, read_state
from psbench.systems.base import System, option
from psbench.systems.common import Prepared, configure_threads, prepare
from psbench.systems.ps.adapter import PSOptions, PSPhase, PSSystem, check_timer_model, ps_processes, run_ps_phase
from psbench.systems.ps.policies import parse_consistency
from psbench.systems.switch.criteria import describe, parse_criterion
from psbench.core.errors import ConfigError

SYNC_CHOICES = ("ddp", "ps-bsp")

# Tests set this to see the hand-over: called with phase 1's (weights, momentum) and what the PS
# shards hold before the async workers start (params, momentum). None in normal runs.
HANDOVER_HOOK: Callable[[dict[str, np.ndarray]], None] | None = None


@dataclasses.dataclass(frozen=True)
class SwitchOptions:
    criterion: str = option("plateau:window=20,threshold=0.01",
                            "when to switch: fixed:epoch=E | fixed:fraction=F | plateau:window=W,threshold=T | "
                            "variance:window=W,threshold=T (on rank 0's training loss, every step)")
    sync: str = option("ddp", "phase 1: ddp (torch DDP allreduce; the criterion on rank 0's loss) | ps-bsp (PS "
                              "BSP; the criterion on the step's mean loss over workers, shared at the barrier)")
    async_consistency: str = option("asp", "phase 2: asp | ssp:S")
    mitigation: str = option("none", "phase 2 staleness mitigation: none | staleness-lr | dc-asgd:LAMBDA | gap-aware")
    servers: int = option(1, "PS server shards")
    lr_scaling: str = option("auto", "phase 2's async step, as for ps: ONE reduction so its step per sample matches "
                                     "phase 1's; auto | 1/n (lr / N, momentum kept) | none | a factor")
    momentum_scaling: str = option("auto", "as for ps: auto (completes the one reduction) | scaled (1 - (1 - m) N, "
                                           "lr kept) | none | a momentum")
    warmup: str = option("none", "phase 2's ramp from the hand-over, as for ps: none | lr:from=F,updates=U | "
                                 "momentum:from=M,updates=U")
    step_timeout_s: float = option(60.0, "how long PS BSP/SSP waits for slow workers before failing the step")
    timeout_s: float = option(1800.0, "stop the DDP phase's workers and fail after this many seconds")

    def __post_init__(self) -> None:
        parse_criterion(self.criterion)
        if self.sync not in SYNC_CHOICES:
            raise ConfigError(f"option sync must be one of {', '.join(SYNC_CHOICES)}, got '{self.sync}'")
        kind, _ = parse_consistency(self.async_consistency)
        if kind == "bsp":
            raise ConfigError("option async_consistency must be asynchronous: asp or ssp:S, got 'bsp'")
        if self.timeout_s <= 0:
            raise ConfigError(f"option timeout_s must be > 0, got {self.timeout_s}")
        self.ps_options("bsp")  # validates servers, mitigation, lr_scaling, step_timeout_s

    def ps_options(self, consistency: str, mitigation: str | None = None) -> PSOptions:
        return PSOptions(consistency=consistency, servers=self.servers,
                         mitigation=self.mitigation if mitigation is None else mitigation,
                         lr_scaling=self.lr_scaling, momentum_scaling=self.momentum_scaling,
                         step_timeout_s=self.step_timeout_s, warmup=self.warmup if consistency != "bsp" else "none")


@dataclasses.dataclass
class Phase1:
    steps: int                  # synchronous steps done (the switch step when the criterion fired)
    fired: bool
    weights: np.ndarray
    momentum: np.ndarray | None
    buffers: np.ndarray | None
    t_end: float                # the run's clock when phase 1 ended
    epoch_end: float            # the same moment in epoch seconds: the hand-over is timed from it


def _phase1_ddp(spec: RunSpec, prep: Prepared, options: SwitchOptions, recorder: Recorder, budget: int) -> Phase1:
    from psbench.systems.ddp.adapter import DDPOptions, DDPSystem

    state = Path(tempfile.mkdtemp(prefix="psbench-switch-"))
    try:
        DDPSystem().run(spec, DDPOptions(timeout_s=options.timeout_s), recorder, state_out=state,
                        worker_module="psbench.systems.switch.sync_worker", worker_args=("--criterion", options.criterion))
        weights, momentum = read_state(state)
        buffers = read_buffers(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    steps = int(recorder.extra["steps_per_worker"])
    t_end = recorder.t_end - recorder.t0 - recorder.extra["eval_s"]
    # rank 0's last step: the ranks' exit and the driver's collecting of their files come after it,
    # and belong to the hand-over
    return Phase1(steps, steps < budget, weights, momentum, buffers, t_end, recorder.t_end)


def _phase1_ps_bsp(spec: RunSpec, prep: Prepared, options: SwitchOptions, recorder: Recorder, budget: int) -> Phase1:
    # Every worker runs the common budget (as DDP's ranks) and stops where the shared criterion fires.
    prep1 = dataclasses.replace(prep, spec=dataclasses.replace(spec, max_steps=budget))
    result = run_ps_phase(prep1, options.ps_options("bsp", mitigation="none"), recorder,
                          stop_criterion=options.criterion)
    if not result.stopped:  # the run ends with phase 1: its clock stops here, not after the standby's exit
        recorder.stop_clock()
    return Phase1(min(result.steps.values()), result.stopped, result.params, result.momentum, result.buffers,
                  recorder.now(), time.time())


class SwitchSystem(System):
    name = "switch"
    no_cuda_reason = "its hand-over from the sync phase to the PS phase is built on host buffers"
    budgets = ("seconds",)  # over both phases: the sync phase stops there too if the criterion never fired
    timer_evaluator = True  # --eval-every-s: snapshots on the training clock, evaluated off it
    Options = SwitchOptions

    @staticmethod
    def cpu_processes(options: SwitchOptions, workers: int) -> list[Proc]:
        """The sync phase's DDP ranks or PS workers, then the async phase's (all forked from a
        zygote), and the PS shards."""
        return ps_processes(options.servers, workers)

    @staticmethod
    def check_spec(spec: RunSpec, options: SwitchOptions, workload: Any, device: Any, stragglers: Any) -> None:
        check_timer_model(spec, workload)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        from psbench.systems.ddp.adapter import DDPSystem

        return PSSystem.unavailable_reason() or DDPSystem.unavailable_reason()

    def run(self, spec: RunSpec, options: SwitchOptions, recorder: Recorder) -> None:
        configure_threads(1)
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        criterion = parse_criterion(options.criterion)
        budget = common_steps(prep, spec.workers)  # the sync phase's budget: every rank the same steps
        info: dict[str, Any] = {"criterion": describe(criterion), "criterion_text": options.criterion,
                                "sync": options.sync, "async": options.async_consistency,
                                "mitigation": options.mitigation, "sync_budget_steps": budget}
        recorder.extra["switch"] = info
        with contextlib.ExitStack() as stack:
            # Phase 2's processes start first and wait (a warm standby, launch cost): the hand-over
            # then moves the state only, after either sync phase.
            standby = stack.enter_context(PSPhase(prep, options.ps_options(options.async_consistency)))
            info["phase2_started"] = "before phase 1 (standby)"
            phase1 = (_phase1_ddp if options.sync == "ddp" else _phase1_ps_bsp)(spec, prep, options, recorder, budget)
            info.update(fired=phase1.fired, switch_step=phase1.steps if phase1.fired else None,
                        switch_t_wall=phase1.t_end if phase1.fired else None, phase1_steps=phase1.steps)
            if not phase1.fired:  # the clock is phase 1's (adopted): its end, not this process's later one
                info["note"] = "criterion never fired: phase 1 (sync) ran the whole budget, no async phase"
                return
            handover: dict[str, Any] = {}

            def before_go(admin) -> None:
                params = np.concatenate([a.reshape(-1) for a in admin.state("params")])
                momentum = (np.concatenate([a.reshape(-1) for a in admin.state("momentum")])
                            if phase1.momentum is not None and prep.workload.optimizer.momentum else None)
                handover["exact"] = bool(np.array_equal(params, phase1.weights) and
                                         (momentum is None or np.array_equal(momentum, phase1.momentum)))
                if HANDOVER_HOOK is not None:
                    HANDOVER_HOOK({"phase1_weights": phase1.weights, "phase1_momentum": phase1.momentum,
                                   "server_params": params, "server_momentum": momentum})
                # The hand-over (phase 1's ranks leaving, the state into the shards; phase 2's
                # processes too when they start here) stays on the clock.
                handover["s"] = time.time() - phase1.epoch_end
                recorder.event("handover", step=phase1.steps, seconds=handover["s"], exact=handover["exact"])

            state = dict(init_params=phase1.weights, init_momentum=phase1.momentum, start_step=phase1.steps,
                         init_buffers=phase1.buffers, before_go=before_go, start_t_wall=phase1.t_end,
                         evaluate_start=spec.eval_every_s is None)
            result = standby.run(recorder, **state)
        recorder.stop_clock()
        info.update(handover_exact=handover.get("exact"), handover_s=handover.get("s"), handover_on_clock=True,
                    phase2_steps={str(w): n - phase1.steps for w, n in result.steps.items()})
        self._record_switch(recorder, phase1, options.criterion)

    @staticmethod
    def _record_switch(recorder: Recorder, phase1: Phase1, criterion: str) -> None:
        losses = [r["loss"] for r in recorder.steps if r["worker"] == 0 and r["step"] == phase1.steps - 1]
        # The async phase evaluates its starting weights (= phase 1's final) first, at the switch step.
        val = [e["accuracy"] for e in recorder.evals if e["split"] == "val" and e["step"] == phase1.steps]
        recorder.event("switch", step=phase1.steps, t_wall=phase1.t_end, criterion=criterion,
                       loss=losses[0] if losses else None, val_accuracy=val[0] if val else None)
        recorder.extra["switch"]["spikes"] = record_spikes(recorder, phase1.steps)


SPIKE_FACTOR = 2.0   # a step's training loss this many times the loss before the hand-over is a spike
SPIKE_BEFORE = 10    # the pre-switch loss: the mean over every worker's last this-many sync steps
SPIKE_AFTER = 50     # looked for in each worker's first this-many async steps


def record_spikes(recorder: Recorder, switch_step: int) -> dict[str, Any]:
    """Loss spikes after the hand-over: one `loss_spike` event per async step row (of a worker's first
    SPIKE_AFTER) whose mini-batch loss exceeds SPIKE_FACTOR x the pre-switch loss and also every
    mini-batch loss of the pre-switch window: a small batch's loss swings several-fold around a low
    mean, and what the sync phase's own mini-batches reached is noise, not the hand-over. The
    summary (the rule, the pre-switch loss and its largest mini-batch loss, how many, the largest
    ratio) goes to the manifest."""
    before = [r["loss"] for r in recorder.steps if switch_step - SPIKE_BEFORE <= r["step"] < switch_step]
    reference = float(np.mean(before)) if before else float("nan")
    noise = float(np.max(before)) if before else float("nan")
    after = [r for r in recorder.steps if switch_step <= r["step"] < switch_step + SPIKE_AFTER]
    ratios = [(r, r["loss"] / reference) for r in after if reference > 0]
    spikes = [(r, ratio) for r, ratio in ratios if ratio > SPIKE_FACTOR and r["loss"] > noise]
    for r, ratio in spikes:
        recorder.event("loss_spike", step=r["step"], worker=r["worker"], t_wall=r["t_wall"], loss=r["loss"],
                       ratio=ratio, pre_switch_loss=reference)
    return {"rule": f"async step loss > {SPIKE_FACTOR:g} x the mean loss of the last {SPIKE_BEFORE} sync steps "
                    f"(every worker's) and > the largest of those, within each worker's first {SPIKE_AFTER} "
                    f"async steps",
            "pre_switch_loss": reference, "pre_switch_max_loss": noise, "spikes": len(spikes),
            "max_ratio": max((ratio for _, ratio in ratios), default=None)}
