"""Cluster conditions on one machine: emulated device speed and seeded stragglers.

A worker's compute for a mini-batch takes at least a target time; the real gradient is still
computed (accuracy stays real) and the rest of the target is slept, so N emulated workers need far
less than N cores. Stragglers slow a worker's steps by a factor (persistent or a seeded spread) and
stall single steps (transient). The schedule depends only on (seed, worker, step): every system run
with the same seed meets the same stragglers, so comparisons are paired.

    --emulate-device step_ms=20            every mini-batch takes >= 20 ms
    --emulate-device example_ms=0.5        >= 0.5 ms per example of the batch
    --emulate-device step_ms=2,example_ms=0.1
    --emulate-device vm-2vcpu              a named profile (device_profiles.toml: figures and sources)
    --stragglers slow:1=3                  worker 1 three times slower (slow:1=3,4=2 for several)
    --stragglers transient:p=0.01,ms=1000  each step, a worker stalls 1 s with probability 0.01
    --stragglers spread:lo=1,hi=4.5        each worker's slow-down drawn from U(lo, hi) (worker 0 = lo)
    --stragglers slow:1=3+transient:p=0.02,ms=200   several kinds, joined by '+'
    --emulate-device step_ms=20,backward=0.5       the backward pass's share of a step (default 2/3)

The pacing contract (ARCHITECTURE.md, "Pacing"), one for every system: an emulated step of target
T is a forward part, (1 - b) T, then a backward part, b T; a stall comes before both. Gradients
become ready through the backward part in proportion to their size (the last layer's first), so
the gradients of fraction f of the model are ready at (1 - b) T + f b T. Communication a system
starts inside backward (DDP buckets, Horovod hooks) may begin once its gradients are ready there:
it overlaps the rest of the backward part, never the forward part or the optimizer step. A system
that communicates after backward (a PS push, an allGather) overlaps nothing of its own step; a
pipelined PS push overlaps the next step's compute, as it would on a device (its next step does
not wait for the reply). Without a device profile a straggler stretches the real compute itself,
every part of it by the same factor. The optimizer step is real work on its own clock (update_s).
"""
from __future__ import annotations

import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from psbench.core.errors import ConfigError

PROFILES_FILE = Path(__file__).resolve().parent / "device_profiles.toml"
_NUMBER = r"\d+(?:\.\d+)?"


# The backward pass's share of a step's compute: backward costs about twice the forward pass (for
# each layer, the gradients of both its input and its weights, each a matrix product the size of the
# forward one: Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1).
BACKWARD_FRACTION = 2.0 / 3.0
BACKWARD_SOURCE = "backward ~ 2x forward FLOPs (Kaplan et al. 2020, section 2.1): 2/3 of a step"


@dataclass(frozen=True)
class DeviceProfile:
    """Target compute time of one mini-batch: step_ms + example_ms * batch (per workload for a profile),
    of which `backward_fraction` is the backward pass (the part gradients become ready in)."""
    name: str
    step_ms: float = 0.0
    example_ms: float = 0.0
    per_workload: dict[str, tuple[float, float]] = field(default_factory=dict)  # workload -> (step_ms, example_ms)
    source: str = ""
    backward_fraction: float = BACKWARD_FRACTION
    backward_source: str = BACKWARD_SOURCE

    def target_s(self, workload: str, batch: int) -> float:
        step_ms, example_ms = self.per_workload.get(workload, (self.step_ms, self.example_ms))
        return (step_ms + example_ms * batch) / 1e3

    def describe(self) -> dict:
        return {"name": self.name, "step_ms": self.step_ms, "example_ms": self.example_ms,
                "per_workload": {k: list(v) for k, v in self.per_workload.items()}, "source": self.source,
                "backward_fraction": self.backward_fraction, "backward_source": self.backward_source}


def load_profiles() -> dict[str, DeviceProfile]:
    raw = tomllib.loads(PROFILES_FILE.read_text())
    out = {}
    for name, entry in raw.items():
        per = {w: (float(v.get("step_ms", 0.0)), float(v.get("example_ms", 0.0)))
               for w, v in entry.get("workloads", {}).items()}
        out[name] = DeviceProfile(name, float(entry.get("step_ms", 0.0)), float(entry.get("example_ms", 0.0)), per,
                                  entry.get("source", ""), float(entry.get("backward_fraction", BACKWARD_FRACTION)),
                                  entry.get("backward_source", BACKWARD_SOURCE))
    return out


def parse_device(text: str | None) -> DeviceProfile | None:
    """None, a named profile, or step_ms=X / example_ms=Y (either or both, comma-separated)."""
    if not text:
        return None
    text = text.strip()
    profiles = load_profiles()
    if text in profiles:
        return profiles[text]
    values: dict[str, float] = {}
    for part in text.split(","):
        m = re.fullmatch(rf"\s*(step_ms|example_ms|backward)\s*=\s*({_NUMBER})\s*", part)
        if not m or m.group(1) in values:
            raise ConfigError(f"--emulate-device '{text}': expected step_ms=X and/or example_ms=Y (milliseconds), "
                              f"optionally backward=B (0 < B <= 1), or a profile: {', '.join(sorted(profiles))}")
        values[m.group(1)] = float(m.group(2))
    if not (values.get("step_ms", 0.0) or values.get("example_ms", 0.0)):
        raise ConfigError(f"--emulate-device '{text}': the target time must be > 0")
    backward = values.get("backward", BACKWARD_FRACTION)
    if not 0 < backward <= 1:
        raise ConfigError(f"--emulate-device '{text}': backward=B is the backward pass's share of a step, 0 < B <= 1")
    return DeviceProfile(text, values.get("step_ms", 0.0), values.get("example_ms", 0.0), backward_fraction=backward,
                         backward_source=BACKWARD_SOURCE if "backward" not in values else "set by --emulate-device")


@dataclass(frozen=True)
class Stragglers:
    slow: dict[int, float] = field(default_factory=dict)  # persistent: worker -> slow-down factor
    spread: tuple[float, float] | None = None             # per-worker factor ~ U(lo, hi)
    stall_p: float = 0.0                                  # transient: stall probability per step
    stall_ms: float = 0.0
    text: str = ""

    def factor(self, worker: int, n_workers: int, seed: int) -> float:
        """The worker's slow-down of its device time (1 = nominal)."""
        f = self.slow.get(worker, 1.0)
        if self.spread is not None:
            lo, hi = self.spread
            # Worker 0 runs at lo, the rest drawn once per (seed, worker): the same for every system.
            f *= lo if worker == 0 else float(np.random.default_rng((seed, 7717, worker)).uniform(lo, hi))
        return f

    def stall_s(self, worker: int, step: int, seed: int) -> float:
        """Seconds the worker stalls before this step (0 most of the time)."""
        if self.stall_p <= 0:
            return 0.0
        u = np.random.default_rng((seed, 9929, worker, step)).random()
        return self.stall_ms / 1e3 if u < self.stall_p else 0.0


def parse_stragglers(text: str | None) -> Stragglers | None:
    if not text:
        return None
    slow: dict[int, float] = {}
    spread = None
    stall_p = stall_ms = 0.0
    allowed = "slow:W=F[,W=F], transient:p=P,ms=MS, spread:lo=A,hi=B, joined by '+'"
    for part in text.split("+"):
        kind, _, args = part.strip().partition(":")
        pairs = {}
        for item in args.split(","):
            k, eq, v = item.partition("=")
            if not eq or not re.fullmatch(_NUMBER, v.strip()):
                raise ConfigError(f"--stragglers '{text}': '{item}' is not KEY=NUMBER; allowed: {allowed}")
            pairs[k.strip()] = float(v)
        if kind == "slow":
            for k, v in pairs.items():
                if not k.isdigit() or v < 1:
                    raise ConfigError(f"--stragglers '{text}': slow takes WORKER=FACTOR with FACTOR >= 1")
                slow[int(k)] = v
        elif kind == "transient":
            if set(pairs) != {"p", "ms"} or not 0 < pairs["p"] <= 1 or pairs["ms"] <= 0:
                raise ConfigError(f"--stragglers '{text}': transient takes p=P (0 < P <= 1) and ms=MS (> 0)")
            stall_p, stall_ms = pairs["p"], pairs["ms"]
        elif kind == "spread":
            if set(pairs) != {"lo", "hi"} or not 1 <= pairs["lo"] <= pairs["hi"]:
                raise ConfigError(f"--stragglers '{text}': spread takes lo=A,hi=B with 1 <= A <= B")
            spread = (pairs["lo"], pairs["hi"])
        else:
            raise ConfigError(f"--stragglers '{text}': unknown kind '{kind}'; allowed: {allowed}")
    return Stragglers(slow, spread, stall_p, stall_ms, text)


@dataclass
class Pacer:
    """One worker's pacing under the contract above: when, from a step's start, the gradients of a
    fraction of the model are ready on the emulated device (`due_s`). Without a device profile a
    slow-down stretches the real compute itself."""
    device: DeviceProfile | None
    stragglers: Stragglers | None
    workload: str
    worker: int
    n_workers: int
    seed: int

    @property
    def active(self) -> bool:
        return self.device is not None or self.stragglers is not None

    def factor(self) -> float:
        return self.stragglers.factor(self.worker, self.n_workers, self.seed) if self.stragglers else 1.0

    def target_s(self, batch: int, compute_s: float) -> float:
        """A whole step's time: the device's target (or the real compute) times the slow-down."""
        base = self.device.target_s(self.workload, batch) if self.device is not None else compute_s
        return base * self.factor()

    def due_s(self, step: int, batch: int, fraction: float, real_s: float) -> float:
        """Seconds from the step's start at which the gradients of `fraction` of the model are ready
        (1.0: the step's compute is done), given `real_s` seconds of real compute so far; a stall comes
        first. Never less than real_s: a device slower than this machine's compute only adds time."""
        if not self.active:
            return real_s
        stall = self.stragglers.stall_s(self.worker, step, self.seed) if self.stragglers is not None else 0.0
        if self.device is None:
            return stall + real_s * self.factor()
        b = self.device.backward_fraction
        return stall + max(real_s, self.target_s(batch, real_s) * ((1.0 - b) + b * min(1.0, fraction)))


def pacer_for(emulate_device: str | None, stragglers: str | None, workload: str, worker: int, n_workers: int,
              seed: int) -> Pacer:
    return Pacer(parse_device(emulate_device), parse_stragglers(stragglers), workload, worker, n_workers, seed)


def stall_schedule(stragglers: str | None, seed: int, steps: list[tuple[int, int]]) -> list[tuple[int, int, float]]:
    """(worker, step, ms) for each stall among the given (worker, step) pairs: the events a run records."""
    parsed = parse_stragglers(stragglers)
    if parsed is None or parsed.stall_p <= 0:
        return []
    out = []
    for worker, step in steps:
        s = parsed.stall_s(worker, step, seed)
        if s > 0:
            out.append((worker, step, s * 1e3))
    return out


def cpu_demand(n_workers: int, real_compute_share: float, servers: float = 0.0) -> float:
    """Cores a run keeps busy: workers x the share of their step spent computing, plus servers."""
    return n_workers * real_compute_share + servers


def real_share(device: DeviceProfile | None, stragglers: Stragglers | None, workload: str, batch: int,
               compute_s: float, n_workers: int, seed: int) -> float:
    """The mean share of a worker's step spent on real compute (1.0 without emulation)."""
    if device is None:
        return 1.0
    shares = []
    for w in range(n_workers):
        factor = stragglers.factor(w, n_workers, seed) if stragglers else 1.0
        target = device.target_s(workload, batch) * factor
        shares.append(min(1.0, compute_s / target) if target > 0 else 1.0)
    return float(sum(shares) / len(shares)) if shares else 1.0


