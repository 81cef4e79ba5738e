"""Switching criteria for Strategy-Switch: when has synchronous training "stabilised" enough to
continue asynchronously? The thesis' exact rule is not public, so each rule is a small class,
parsed from one string and recorded with its parameters in the run manifest.

    fixed:epoch=2            switch at the start of epoch 2
    fixed:fraction=0.3       switch after 30% of the step budget (of the time, under --budget seconds=T)
    plateau:window=20,threshold=0.01[,alpha=0.2]
                             relative improvement of the EMA-smoothed training loss over the last
                             `window` observations below `threshold`
    variance:window=20,threshold=0.05
                             coefficient of variation (std / mean) of the last `window` losses below
                             `threshold`: the loss has stopped moving more than its own noise
Each observes the loss once per synchronous step and answers whether to switch now.
"""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from psbench.core.errors import ConfigError

CRITERIA = ("fixed:epoch=E", "fixed:fraction=F", "plateau:window=W,threshold=T", "variance:window=W,threshold=T")


@dataclass
class Observation:
    step: int              # synchronous steps done so far (1-based after the first step)
    steps_per_epoch: int
    total_steps: int
    loss: float
    elapsed_s: float = 0.0          # the training clock
    budget_s: float | None = None   # --budget seconds=T: fractions are of the time budget


@dataclass
class FixedPoint:
    epoch: float | None = None
    fraction: float | None = None
    kind: str = field(default="fixed", init=False)

    def __post_init__(self) -> None:
        if (self.epoch is None) == (self.fraction is None):
            raise ConfigError("criterion fixed: give exactly one of epoch=E or fraction=F")
        if self.epoch is not None and self.epoch < 0:
            raise ConfigError(f"criterion fixed: epoch must be >= 0, got {self.epoch}")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise ConfigError(f"criterion fixed: fraction must be in [0, 1], got {self.fraction}")

    def should_switch(self, obs: Observation) -> bool:
        if self.epoch is not None:
            return obs.step >= self.epoch * obs.steps_per_epoch
        if obs.budget_s is not None:
            return obs.elapsed_s >= self.fraction * obs.budget_s
        return obs.step >= self.fraction * obs.total_steps


@dataclass
class LossPlateau:
    window: int = 20
    threshold: float = 0.01
    alpha: float = 0.2  # EMA smoothing of the noisy per-step loss
    kind: str = field(default="plateau", init=False)

    def __post_init__(self) -> None:
        _check_window(self.window, self.threshold, "plateau")
        if not 0.0 < self.alpha <= 1.0:
            raise ConfigError(f"criterion plateau: alpha must be in (0, 1], got {self.alpha}")
        self._smoothed: deque[float] = deque(maxlen=self.window + 1)
        self._ema: float | None = None

    def should_switch(self, obs: Observation) -> bool:
        self._ema = obs.loss if self._ema is None else self.alpha * obs.loss + (1 - self.alpha) * self._ema
        self._smoothed.append(self._ema)
        if len(self._smoothed) <= self.window:
            return False
        old, new = self._smoothed[0], self._smoothed[-1]
        return (old - new) / max(abs(old), 1e-12) < self.threshold


@dataclass
class LossVariance:
    window: int = 20
    threshold: float = 0.05
    kind: str = field(default="variance", init=False)

    def __post_init__(self) -> None:
        _check_window(self.window, self.threshold, "variance")
        self._recent: deque[float] = deque(maxlen=self.window)

    def should_switch(self, obs: Observation) -> bool:
        self._recent.append(obs.loss)
        if len(self._recent) < self.window:
            return False
        values = np.asarray(self._recent)
        return float(values.std() / max(abs(values.mean()), 1e-12)) < self.threshold


def _check_window(window: int, threshold: float, name: str) -> None:
    if window < 2:
        raise ConfigError(f"criterion {name}: window must be >= 2, got {window}")
    if threshold <= 0:
        raise ConfigError(f"criterion {name}: threshold must be > 0, got {threshold}")


_KINDS: dict[str, type] = {"fixed": FixedPoint, "plateau": LossPlateau, "variance": LossVariance}


def parse_criterion(text: str):
    """'plateau:window=20,threshold=0.01' -> LossPlateau(window=20, threshold=0.01)."""
    kind, _, raw_params = text.partition(":")
    if kind not in _KINDS:
        raise ConfigError(f"unknown switch criterion '{text}'; choose from: {', '.join(CRITERIA)}")
    params: dict[str, Any] = {}
    for item in filter(None, raw_params.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"switch criterion '{text}': expected key=value, got '{item}'")
        try:
            params[key] = int(value) if key == "window" else float(value)
        except ValueError:
            raise ConfigError(f"switch criterion '{text}': {key} must be a number, got '{value}'") from None
    try:
        return _KINDS[kind](**params)
    except TypeError:
        allowed = [f for f in _KINDS[kind].__dataclass_fields__ if f != "kind"]
        raise ConfigError(f"switch criterion '{text}': parameters allowed: {', '.join(allowed)}") from None


def step_stop_for(text: str, prep, world: int) -> Callable[[int, float, float], bool]:
    """The criterion `text` as a per-step stop: (steps done, training loss, training clock) -> switch
    now? One rule for both sync phases: DDP's rank 0 calls it on its loss; each PS BSP worker on the
    step's shared report (the mean loss over workers, the same in every reply), so all agree."""
    from psbench.systems.allreduce_common import common_steps

    criterion = parse_criterion(text)
    per_epoch, total, budget_s = prep.steps_per_epoch(0), common_steps(prep, world), prep.budget_seconds()

    def step_stop(done: int, loss: float, elapsed_s: float) -> bool:
        return bool(criterion.should_switch(Observation(done, per_epoch, total, loss, elapsed_s, budget_s)))

    return step_stop


def describe(criterion) -> dict[str, Any]:
    """Parameters for the manifest (private state excluded)."""
    return {k: v for k, v in asdict(criterion).items() if not k.startswith("_")}
