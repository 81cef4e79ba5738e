"""Horovod's own synthetic benchmark beside psbench: `pytorch_synthetic_benchmark.py` (Horovod
v0.28.1, vendored unchanged in third_party/horovod/) run by horovodrun, and psbench's `horovod` (and
`ddp`) systems on the `horovod-synthetic` workload, at the same model, batch, image size (the
script's 3x224x224) and batches, run in turn, A B B A ..., so a drift in the machine's load falls on
both sides.

Both sides are measured by the script's rule: its first `warmup_batches` steps are left out, the
rest are timed in iterations of `batches_per_iter` steps, each iteration's images/s is batch x
batches / its seconds, on rank 0, and a run's figure is their mean ("Img/sec per CPU"). The
script's figures are read from its own output; psbench's from its step records (rank 0's step
ends on its training clock). Differences in how the two are set up, stated: the script's one
batch vs psbench's views into its worker's shard of 64 random images (gathered once, before the
first step); psbench's workers and the script's both at one thread (OMP_NUM_THREADS=1, psbench's
children's default); horovodrun on loopback for both (psbench.systems.horovod.run); no evaluation
inside psbench's timed window (a timer evaluator whose only snapshots are the first and the last).

By hand: `python -m psbench.bench.regress.horovod_script --pairs 3 --batch-size 4` (JSON, then a
Markdown table); tests/test_horovod_script.py holds the check (`make test-slow`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from psbench.bench.harness.runner import plan, record_run
from psbench.bench.report.stats import Interval, paired_ratio_ci
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.systems.common import child_env
from psbench.systems.horovod.adapter import horovodrun_command
from psbench.systems.horovod.run import LOOPBACK_ENV

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "third_party" / "horovod" / "pytorch_synthetic_benchmark.py"
SHIM = Path(__file__).resolve().parent / "horovod_shim"  # its `torchvision.models` is psbench's ResNets
WORKLOADS = {"resnet18": "horovod-synthetic", "resnet50": "horovod-synthetic-resnet50"}
# rank 0's line, as horovodrun forwards it ("[0]<stdout>:" in front)
ITERATION_LINE = re.compile(r"^(?:\[0\]<stdout>:)?Iter #(\d+): ([0-9.]+) img/sec per CPU$", re.MULTILINE)
PRINTED_DECIMALS = 1  # the script prints each iteration's images/s with %.1f
NO_EVALUATION_S = 1e6  # psbench's timer evaluator: a snapshot at the start and at the end only
SYSTEMS = ("horovod", "ddp")


@dataclass(frozen=True)
class Setting:
    """One configuration of the script, named by its own flags (their defaults are its own)."""
    model: str = "resnet18"
    batch_size: int = 32
    warmup_batches: int = 10
    batches_per_iter: int = 10
    iters: int = 10
    workers: int = 2

    def __post_init__(self) -> None:
        if self.model not in WORKLOADS:
            raise ConfigError(f"model '{self.model}': allowed {', '.join(WORKLOADS)}")
        for name in ("batch_size", "batches_per_iter", "iters", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_batches < 0:
            raise ConfigError(f"warmup_batches must be >= 0, got {self.warmup_batches}")

    @property
    def steps(self) -> int:
        return self.warmup_batches + self.iters * self.batches_per_iter

    def script_args(self) -> list[str]:
        return ["--model", self.model, "--batch-size", str(self.batch_size), "--num-warmup-batches",
                str(self.warmup_batches), "--num-batches-per-iter", str(self.batches_per_iter),
                "--num-iters", str(self.iters), "--no-cuda"]


def script_command(setting: Setting) -> list[str]:
    """horovodrun (on loopback, as psbench's horovod system runs it) starting the vendored script."""
    hosts = f"localhost:{setting.workers}"
    return (horovodrun_command(local=True) + ["--gloo", "-np", str(setting.workers), "-H", hosts,
                                               "--network-interfaces", "lo", sys.executable, str(SCRIPT)]
            + setting.script_args())


def script_env() -> dict[str, str]:
    """psbench's children's environment (one thread a rank), the shim first on PYTHONPATH."""
    env = child_env({"HOROVOD_GLOO_IFACE": "lo", LOOPBACK_ENV: "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), env["PYTHONPATH"]])
    return env


def parse_iterations(output: str, setting: Setting) -> list[float]:
    """The script's per-iteration images/s (rank 0's lines), all of them or a ConfigError."""
    rates = [float(m.group(2)) for m in ITERATION_LINE.finditer(output)]
    if len(rates) != setting.iters:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise ConfigError(f"the synthetic benchmark printed {len(rates)} of {setting.iters} iteration lines; "
                          f"its output ends:\n{tail}")
    return rates


def script_rates(setting: Setting, timeout_s: float = 600.0) -> list[float]:
    """Run the vendored script once; its per-iteration images/s on one rank."""
    proc = subprocess.Popen(script_command(setting), env=script_env(), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # horovodrun and the ranks it started
        proc.communicate(timeout=30)
        raise ConfigError(f"the synthetic benchmark ran past {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise ConfigError(f"the synthetic benchmark exited {proc.returncode}: {output.strip()[-2000:]}")
    return parse_iterations(output, setting)


def iteration_rates(steps: pd.DataFrame, setting: Setting, worker: int = 0) -> list[float]:
    """The script's rule on psbench's step records: `worker`'s rows after its warm-up steps, in
    iterations of batches_per_iter steps; each iteration's images over the seconds from the end of
    the step before it to the end of its last step (t_wall: step ends on the training clock, which
    starts at 0 with the first step), rounded as the script prints it."""
    rows = steps[steps["worker"] == worker].sort_values("step")
    if len(rows) != setting.steps:
        raise ConfigError(f"worker {worker} recorded {len(rows)} steps, the setting times {setting.steps}")
    ends = [0.0] + rows["t_wall"].astype(float).tolist()  # ends[i]: the end of step i - 1
    samples = rows["n_samples"].astype(int).tolist()
    rates = []
    for i in range(setting.iters):
        first = setting.warmup_batches + i * setting.batches_per_iter
        last = first + setting.batches_per_iter
        rates.append(round(sum(samples[first:last]) / (ends[last] - ends[first]), PRINTED_DECIMALS))
    return rates


def psbench_spec(system: str, setting: Setting, seed: int = 0) -> RunSpec:
    return RunSpec(system, WORKLOADS[setting.model], workers=setting.workers, seed=seed,
                   batch_size=setting.batch_size, epochs=setting.steps, max_steps=setting.steps,
                   eval_every_s=NO_EVALUATION_S)


def psbench_rates(system: str, setting: Setting, seed: int = 0) -> list[float]:
    """One psbench run through the harness (nothing written); rank 0's per-iteration images/s."""
    recorder = record_run(plan(psbench_spec(system, setting, seed), allow_oversubscribe=True), quiet=True)
    return iteration_rates(pd.DataFrame(recorder.steps), setting)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass
class SideBySide:
    """Per pair, each side's run figure (the mean of its iterations' images/s); the order each pair ran in."""
    setting: Setting
    script: list[float]
    systems: dict[str, list[float]]
    orders: list[list[str]]

    def ratio(self, system: str) -> Interval:
        """The system's images/s over the script's: mean over the pairs, with its paired bootstrap interval."""
        return paired_ratio_ci(self.systems[system], self.script, statistic="mean")

    def summary(self) -> dict:
        return {"setting": asdict(self.setting), "n_pairs": len(self.script), "script": self.script,
                "systems": self.systems, "orders": self.orders,
                "ratios": {s: asdict(self.ratio(s)) for s in self.systems}}


def side_by_side(setting: Setting, pairs: int = 3, systems: tuple[str, ...] = ("horovod",),
                 timeout_s: float = 600.0) -> SideBySide:
    """`pairs` rounds, each running the script and every system once; the script goes first in
    even rounds and last in odd ones (A B, B A, ...), so a trend in the load weighs on both sides."""
    result = SideBySide(setting, [], {s: [] for s in systems}, [])
    for i in range(pairs):
        order = ["script", *systems] if i % 2 == 0 else [*systems, "script"]
        for side in order:
            if side == "script":
                result.script.append(mean(script_rates(setting, timeout_s)))
            else:
                result.systems[side].append(mean(psbench_rates(side, setting, seed=i)))
        result.orders.append(order)
    return result


def markdown(result: SideBySide) -> str:
    s = result.setting
    lines = [f"{s.model}, batch {s.batch_size}, 3x224x224, {s.workers} ranks, {s.warmup_batches} warm-up + "
             f"{s.iters} x {s.batches_per_iter} timed batches, {len(result.script)} interleaved pairs",
             "", "| side | img/s per rank, each pair | mean | ÷ script (95% CI) |", "|---|---|---:|---:|"]
    lines.append(f"| script | {', '.join(f'{v:.2f}' for v in result.script)} | {mean(result.script):.2f} | |")
    for system, values in result.systems.items():
        r = result.ratio(system)
        ci = f"[{r.lo:.3f}, {r.hi:.3f}]" if not math.isnan(r.lo) else "n < 2"
        lines.append(f"| psbench {system} | {', '.join(f'{v:.2f}' for v in values)} | {mean(values):.2f} | "
                     f"{r.estimate:.3f} {ci} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m psbench.bench.regress.horovod_script", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    for field, default in asdict(Setting()).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    args = p.parse_args(argv)
    try:
        setting = Setting(**{f: getattr(args, f) for f in asdict(Setting())})
        result = side_by_side(setting, args.pairs, tuple(args.systems))
    except ConfigError as exc:
        print(f"horovod_script: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.summary(), indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
