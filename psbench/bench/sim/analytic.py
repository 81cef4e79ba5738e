"""The analytic model: per-step time and throughput of a parameter server (S shards, BSP/ASP/SSP),
ring allreduce and Spark's job-per-step in closed form, from a few numbers (`AnalyticInputs`)
measured on this machine in minutes or taken from a published setting (`PRESETS`). It needs no
results folder, and each formula can be checked by hand. The scale model of the reference
(results/reference/simulate) is the event model (events.py, its costs measured from the suites'
records), which simulates every system, device and straggler a suite runs (`psbench simulate --from`).

Symbols: N workers, b samples per worker step, M model bytes, B link bandwidth (bytes/s, every link
the same, full duplex), r round-trip time, S server shards. Compute per worker step is
T_c = a + t*b (a: fixed per-step cost, t: seconds per sample), measured with the `single` system.
Stragglers: with compute jitter cv, a barrier over N workers waits about T_c*cv*sqrt(2 ln N) more
(the expected maximum of N normals); cv = 0 by default.

  PS, BSP:  T = T_c + straggle + 2r + 2*(M/B)*max(N/S, 1)
            push phase then pull phase; each of the S server links carries N*M/S bytes per phase.
  PS, ASP:  updates/s = min(N / (T_c + 2r + 2M/B),  S*B/M)
            workers never wait for each other; the servers' links (pushes in, pulls out, full
            duplex) cap the update rate at S*B/M. Throughput = b * updates/s.
  PS, SSP(s), s >= 1: as ASP with the straggler wait amortised over the bound: + straggle/(s+1).
            SSP(0) is BSP.
  Ring allreduce: T = T_c + straggle + 2(N-1)/N * M/B + (N-1)*r
            (2(N-1) steps, each moving M/N bytes and paying a one-way latency r/2).
  Spark job per step: T = J + N*j + T_c + straggle + (M/B)*ceil(log2(N+1)) + 2*ceil(sqrt N)*M/B + 2r
            J: per-job scheduling overhead, j: per-task launch cost at the driver, a torrent-style
            broadcast of the model, and a depth-2 treeAggregate of the gradients.

Scaling efficiency(N) = throughput(N) / (N * b/T_c).

Validation on one machine (`cores` = C > 0): the N workers share C cores, so T_c becomes
T_c * max(1, N/C) for N > 1; projections use cores = 0 (a machine per worker).

Shape against published numbers (Sergeev & Del Balso, "Horovod", 2018: ~88% efficiency at 128
GPUs with ring allreduce vs ~50% for standard distributed TensorFlow with parameter servers):
with the `horovod-paper` preset (ResNet-101, 178 MB, 25 Gbit/s, 64 images/GPU at ~110 images/s)
this model gives ring allreduce ~83% at 128 workers (flat in N: the ring's bandwidth term does not
grow with N; Horovod's remaining ~5 points come from overlapping allreduce with backprop, which
this model does not credit), a single unsharded PS (BSP) ~4% (its link carries N*M per phase),
and ~50% only once the PS is sharded over about 25 servers. The model reproduces the qualitative
result (ring stays flat, the PS decays as 1/N once its link saturates, sharding buys it back
linearly); it does not reproduce TensorFlow's exact PS deployment, which the paper does not give.
"""
from __future__ import annotations

import json
import math
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from psbench.bench.sim.model_size import model_bytes
from psbench.core.errors import ConfigError

SYSTEM_MODELS = {"single": "single", "ps": "ps", "allreduce": "allreduce", "ddp": "allreduce",
                 "horovod": "allreduce", "spark": "spark"}
CONSISTENCY = ("bsp", "asp", "ssp")
DEFAULT_ERROR_BOUND = 0.15  # the error the model claims against measured runs
INPUT_SUITE = "analytic-inputs"  # the suite of the `single` runs its compute fit measures


@dataclass(frozen=True)
class AnalyticInputs:
    """The analytic model's inputs, measured here (`measure_inputs`) or a preset (`PRESETS`)."""
    step_overhead_s: float        # a: fixed cost per worker step
    compute_s_per_sample: float   # t: forward + backward + update per sample
    model_bytes: int              # M: parameters (float32) moved per push, pull or allreduce
    bandwidth_Bps: float          # B: per-link bandwidth, bytes/s
    rtt_s: float                  # r: round-trip time of a small message
    spark_job_overhead_s: float = 0.05    # J: assumed unless measured (Spark local mode: tens of ms)
    spark_task_overhead_s: float = 0.002  # j: assumed per-task launch cost at the driver
    cores: float = 0              # C: cores all workers share (validation on one machine); 0 = a machine each
    workload: str = ""
    source: str = "measured"

    def compute_s(self, batch_size: int) -> float:
        return self.step_overhead_s + self.compute_s_per_sample * batch_size

    def to_json(self, provenance: dict[str, Any] | None = None) -> str:
        """The figures, and what made them (the commit: psbench.core.records.provenance) if given."""
        return json.dumps({**asdict(self), **({"provenance": provenance} if provenance else {})}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "AnalyticInputs":
        raw = json.loads(text)
        raw.pop("provenance", None)
        return cls(**raw)


@dataclass(frozen=True)
class Scenario:
    system: str                 # single | ps | allreduce (ddp, horovod) | spark
    workers: int
    batch_size: int             # per worker
    servers: int = 1            # PS shards
    consistency: str = "bsp"    # PS: bsp | asp | ssp
    staleness: int = 0          # SSP bound
    compute_cv: float = 0.0     # compute-time jitter (coefficient of variation) for stragglers

    def __post_init__(self) -> None:
        if self.system not in SYSTEM_MODELS:
            raise ConfigError(f"simulate: unknown system '{self.system}'; allowed: {', '.join(SYSTEM_MODELS)}")
        if self.consistency not in CONSISTENCY:
            raise ConfigError(f"simulate: consistency must be one of {', '.join(CONSISTENCY)}, got '{self.consistency}'")
        if self.workers < 1 or self.batch_size < 1 or self.servers < 1 or self.staleness < 0 or self.compute_cv < 0:
            raise ConfigError("simulate: workers, batch_size and servers must be >= 1; staleness, compute_cv >= 0")


@dataclass(frozen=True)
class Projection:
    scenario: Scenario
    step_s: float            # mean time between one worker's steps
    compute_s: float
    comm_s: float            # communication and overhead per step (step_s - compute_s for sync systems)
    samples_per_s: float     # all workers together
    efficiency: float        # samples_per_s / (workers * single-worker samples/s)


def _straggle(inputs: AnalyticInputs, sc: Scenario) -> float:
    n = sc.workers
    return inputs.compute_s(sc.batch_size) * sc.compute_cv * math.sqrt(2 * math.log(n)) if n > 1 else 0.0


def project(inputs: AnalyticInputs, sc: Scenario) -> Projection:
    """Per-step time and throughput of one scenario (formulas in the module docstring)."""
    model = SYSTEM_MODELS[sc.system]
    n, b, m_over_b, r = sc.workers, sc.batch_size, inputs.model_bytes / inputs.bandwidth_Bps, inputs.rtt_s
    t_c = inputs.compute_s(b) * cpu_share(inputs, sc)
    straggle = _straggle(inputs, sc)
    if model == "single":
        comm = 0.0
        step = t_c
    elif model == "ps" and (sc.consistency == "bsp" or (sc.consistency == "ssp" and sc.staleness == 0)):
        comm = straggle + 2 * r + 2 * m_over_b * max(n / sc.servers, 1.0)
        step = t_c + comm
    elif model == "ps":  # asp, ssp(s >= 1)
        wait = straggle / (sc.staleness + 1) if sc.consistency == "ssp" else 0.0
        cycle = t_c + wait + 2 * r + 2 * m_over_b
        rate = min(n / cycle, sc.servers * inputs.bandwidth_Bps / inputs.model_bytes)
        step = n / rate
        comm = step - t_c
    elif model == "allreduce":
        comm = straggle + 2 * (n - 1) / n * m_over_b + (n - 1) * r
        step = t_c + comm
    else:  # spark
        broadcast = m_over_b * math.ceil(math.log2(n + 1))
        aggregate = 2 * math.ceil(math.sqrt(n)) * m_over_b + 2 * r
        comm = inputs.spark_job_overhead_s + n * inputs.spark_task_overhead_s + straggle + broadcast + aggregate
        step = t_c + comm
    samples_per_s = n * b / step
    return Projection(sc, step, t_c, comm, samples_per_s, samples_per_s / (n * b / inputs.compute_s(b)))


def cpu_share(inputs: AnalyticInputs, sc: Scenario) -> float:
    """Compute slow-down when the N workers share C cores of one machine: max(1, N/C). 1 when each
    worker has its own machine (cores = 0), as in every projection."""
    return max(1.0, sc.workers / inputs.cores) if inputs.cores and sc.system != "single" else 1.0


# ---- validation against measured runs ------------------------------------------------------

@dataclass(frozen=True)
class MeasuredRun:
    system: str
    workers: int
    batch_size: int
    samples_per_s: float
    servers: int = 1
    consistency: str = "bsp"
    staleness: int = 0
    label: str = ""
    samples_per_step: float | None = None  # mean per worker step (a last partial batch lowers it)

    def scenario(self) -> Scenario:
        return Scenario(self.system, self.workers, self.batch_size, self.servers, self.consistency, self.staleness)


@dataclass
class Validation:
    rows: list[dict[str, Any]]
    max_error: float      # max |predicted - measured| / measured
    mean_error: float
    bound: float = DEFAULT_ERROR_BOUND

    @property
    def ok(self) -> bool:
        return self.max_error <= self.bound


def validate(measured_runs: Iterable[MeasuredRun], inputs: AnalyticInputs, bound: float = DEFAULT_ERROR_BOUND) -> Validation:
    """Relative error of the model's samples/s against measured runs (the lead calls this with
    measured 1-4 worker PS/DDP runs, e.g. from `measured_from_results`). Repeats of one configuration
    (same scenario) are compared through their median, as timings on a shared machine are noisy;
    each row also gives the repeats' spread, (max - min) / median."""
    groups: dict[Scenario, list[MeasuredRun]] = {}
    for run in measured_runs:
        groups.setdefault(run.scenario(), []).append(run)
    if not groups:
        raise ConfigError("validate: no measured runs given")
    rows = []
    for scenario, runs in groups.items():
        predicted = project(inputs, scenario).samples_per_s
        per_step = [r.samples_per_step for r in runs if r.samples_per_step]
        if per_step:  # same step times, the samples the runs really had per step
            predicted *= statistics.median(per_step) / scenario.batch_size
        values = [r.samples_per_s for r in runs]
        measured = statistics.median(values)
        rows.append({**asdict(scenario), "repeats": len(runs), "measured_samples_per_s": measured,
                     "spread": (max(values) - min(values)) / measured, "predicted_samples_per_s": predicted,
                     "error": abs(predicted - measured) / measured})
    errors = [row["error"] for row in rows]
    return Validation(rows, max(errors), sum(errors) / len(errors), bound)


def measured_from_results(suite_dir: Path) -> list[MeasuredRun]:
    """MeasuredRuns from a results suite folder (every run's manifest.json). PS option names are read
    leniently (servers|shards, consistency|mode, staleness|ssp_bound) since systems name their own."""
    from psbench.workloads import get_workload

    runs = []
    from psbench.bench.harness import store

    for m in store.suite_manifests(Path(suite_dir)):
        spec, opts = m["spec"], m["spec"].get("options", {})
        system = spec["system"]
        if system not in SYSTEM_MODELS or not m["summary"].get("samples_per_s"):
            continue
        runs.append(MeasuredRun(
            system=system, workers=spec["workers"],
            batch_size=spec.get("batch_size") or get_workload(spec["workload"]).batch_size,
            samples_per_s=m["summary"]["samples_per_s"],
            servers=int(opts.get("servers", opts.get("shards", 1))),
            consistency=str(opts.get("consistency", opts.get("mode", "bsp"))).lower(),
            staleness=int(opts.get("staleness", opts.get("ssp_bound", 0))), label=m["run_id"],
            samples_per_step=m["summary"]["samples"] / m["summary"]["steps"] if m["summary"].get("steps") else None))
    return runs


# ---- inputs measured on this machine ------------------------------------------------------------

def measure_single(workload: str, batch_size: int, steps: int, seed: int = 0,
                   results_dir: Path | None = None) -> dict[str, float]:
    """One `single` run through the harness: its samples/s and mean step time."""
    from psbench.bench.harness.runner import plan, run_one
    from psbench.core.spec import RunSpec

    spec = RunSpec("single", workload, seed=seed, batch_size=batch_size, max_steps=steps, epochs=1000,
                   evals_per_epoch=1)
    with tempfile.TemporaryDirectory() as tmp:
        result = run_one(plan(spec), Path(results_dir or tmp), INPUT_SUITE)
    s = result.summary
    return {"samples_per_s": s["samples_per_s"], "step_s": s["train_s"] / s["steps"], "steps": s["steps"],
            "samples_per_step": s["samples"] / s["steps"]}


def measure_compute_points(workload: str, batch_sizes: Sequence[int], steps: int = 100, repeats: int = 3,
                           results_dir: Path | None = None) -> dict[int, list[dict[str, float]]]:
    """`single` runs at each batch size, `repeats` times, interleaved so that slow spells of a shared
    machine hit every size alike; one discarded warm-up run first. Repeat k uses seed k (distinct
    run ids when results_dir keeps them, suite INPUT_SUITE)."""
    from psbench.systems.common import configure_threads

    configure_threads(1)
    measure_single(workload, batch_sizes[0], max(10, steps // 4))  # warm-up: data, caches, allocator
    points: dict[int, list[dict[str, float]]] = {b: [] for b in batch_sizes}
    for k in range(repeats):
        for b in batch_sizes:
            points[b].append(measure_single(workload, b, steps, seed=k, results_dir=results_dir))
    return points


def fit_compute(points: dict[int, list[dict[str, float]]]) -> tuple[float, float]:
    """(a, t) of T_c = a + t*b by least squares over the median step time at each batch size, against
    the samples a step really had (below b when an epoch ends in a partial batch)."""
    import numpy as np

    if len(points) < 2:
        raise ConfigError("analytic model: give at least two different batch sizes")
    xs = np.array([statistics.median(r["samples_per_step"] for r in runs) for runs in points.values()])
    ys = np.array([statistics.median(r["step_s"] for r in runs) for runs in points.values()])
    slope, intercept = np.polyfit(xs, ys, 1)
    return max(float(intercept), 0.0), max(float(slope), 1e-12)


def measure_inputs(workload: str, batch_sizes: Sequence[int] = (16, 128), steps: int = 100, repeats: int = 3,
                   measure_link: bool = True, points: dict[int, list[dict[str, float]]] | None = None) -> AnalyticInputs:
    """Fit T_c = a + t*b from `single` runs (or given `points`), and measure loopback RTT and bandwidth
    with a pyzmq ping-pong."""
    from psbench.bench.lab.netprobe import zmq_pingpong

    if len(set(batch_sizes)) < 2:
        raise ConfigError("analytic model: give at least two different batch sizes")
    points = points or measure_compute_points(workload, batch_sizes, steps, repeats)
    intercept, slope = fit_compute({b: points[b] for b in batch_sizes})
    link = zmq_pingpong("127.0.0.1") if measure_link else None
    return AnalyticInputs(step_overhead_s=intercept, compute_s_per_sample=slope, model_bytes=model_bytes(workload),
                          bandwidth_Bps=link.bandwidth_Bps if link else 1.25e8, rtt_s=link.rtt_s if link else 1e-4,
                          workload=workload, source=f"single runs at batch {list(batch_sizes)}, pyzmq loopback")


def measure_spark_job_overhead(jobs: int = 20) -> float:
    """Median wall time of a trivial Spark job in local[2] mode (needs pyspark and Java; slow to start)."""
    import time

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").appName("psbench-spark-job-cost").getOrCreate()
    try:
        rdd = spark.sparkContext.parallelize(range(2), 2).cache()
        rdd.count()
        times = []
        for _ in range(jobs):
            t = time.perf_counter()
            rdd.map(lambda x: x).sum()
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    finally:
        spark.stop()


PRESETS = {
    # Sergeev & Del Balso 2018 setting, approximately: ResNet-101 (44.5 M params), 25 Gbit/s RoCE,
    # P100 at ~110 images/s, RDMA-class latency. Spark numbers are our assumptions.
    "horovod-paper": AnalyticInputs(step_overhead_s=0.0, compute_s_per_sample=1 / 110, model_bytes=178_000_000,
                                    bandwidth_Bps=25e9 / 8, rtt_s=50e-6, spark_job_overhead_s=0.1,
                                    spark_task_overhead_s=0.002, workload="resnet-101 (preset)",
                                    source="preset: Horovod paper setting"),
}


# ---- projection table and plot ---------------------------------------------------------------

def default_scenarios(batch_size: int, servers: int) -> dict[str, list[Scenario]]:
    ns = [2 ** k for k in range(3, 10)]  # 8 .. 512
    return {
        "PS BSP, 1 server": [Scenario("ps", n, batch_size, 1, "bsp") for n in ns],
        "PS ASP, 1 server": [Scenario("ps", n, batch_size, 1, "asp") for n in ns],
        f"PS BSP, {servers} servers": [Scenario("ps", n, batch_size, servers, "bsp") for n in ns],
        "ring allreduce": [Scenario("allreduce", n, batch_size) for n in ns],
        "Spark job per step": [Scenario("spark", n, batch_size) for n in ns],
    }


def projection_table(inputs: AnalyticInputs, curves: dict[str, list[Scenario]]) -> list[dict[str, Any]]:
    rows = []
    for label, scenarios in curves.items():
        for sc in scenarios:
            p = project(inputs, sc)
            rows.append({"curve": label, "workers": sc.workers, "batch_size": sc.batch_size, "servers": sc.servers,
                         "consistency": sc.consistency, "step_s": p.step_s, "samples_per_s": p.samples_per_s,
                         "efficiency": p.efficiency})
    return rows


def assumptions_text(inputs: AnalyticInputs, batch_size: int) -> str:
    return (f"{inputs.workload or 'workload'} ({inputs.source})\n"
            f"compute/step = {inputs.step_overhead_s * 1e3:.3g} ms + {inputs.compute_s_per_sample * 1e6:.3g} us x b, b = {batch_size}\n"
            f"model {inputs.model_bytes / 1e6:.3g} MB, link {inputs.bandwidth_Bps * 8 / 1e9:.3g} Gbit/s full duplex, "
            f"rtt {inputs.rtt_s * 1e6:.3g} us\n"
            f"Spark: job {inputs.spark_job_overhead_s * 1e3:.3g} ms + task {inputs.spark_task_overhead_s * 1e3:.3g} ms x N; "
            f"no compute/comm overlap, no stragglers")


def plot(rows: list[dict[str, Any]], inputs: AnalyticInputs, batch_size: int, out_base: Path, source: str = "") -> list[Path]:
    """The projection as PNG and SVG; `source` (the commit that drew it) goes in their metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(12, 5.6))
    for label in dict.fromkeys(r["curve"] for r in rows):
        sub = [r for r in rows if r["curve"] == label]
        ns = [r["workers"] for r in sub]
        ax_t.plot(ns, [r["samples_per_s"] for r in sub], marker="o", label=label)
        ax_e.plot(ns, [100 * r["efficiency"] for r in sub], marker="o", label=label)
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.grid(True, alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("projected samples/s")
    ax_e.set_ylabel("scaling efficiency (%)")
    ax_e.set_ylim(0, 105)
    ax_e.legend(fontsize=8)
    fig.suptitle("psbench scale projection (analytic model, bench/sim/analytic.py)")
    fig.text(0.01, 0.01, "Assumptions: " + assumptions_text(inputs, batch_size), fontsize=7.5, family="monospace",
             va="bottom")
    fig.tight_layout(rect=(0, 0.14, 1, 0.95))
    from psbench.core.atomic import atomic_write

    paths = [out_base.with_suffix(".png"), out_base.with_suffix(".svg")]
    for path in paths:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format=path.suffix[1:], dpi=120,
                                                   metadata={"Source": source} if source else None))
    plt.close(fig)
    return paths


def write_validation(validations: list[tuple[str, Validation]], path: Path, git_sha: str | None = None) -> None:
    import pandas as pd

    from psbench.core.atomic import atomic_write_csv

    frames = []
    for name, v in validations:
        frame = pd.DataFrame(v.rows)
        frame.insert(0, "set", name)
        frames.append(frame)
        print(f"model error vs {name}: max {v.max_error:.1%}, mean {v.mean_error:.1%} "
              f"({'within' if v.ok else 'OUTSIDE'} the stated {v.bound:.0%})")
        cols = [c for c in ("system", "consistency", "workers", "cap_mbit", "measured_samples_per_s",
                            "predicted_samples_per_s", "error", "spread") if c in frame]
        with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
            print(frame[cols].to_string(index=False))
    atomic_write_csv(path, pd.concat(frames, ignore_index=True).assign(git_sha=git_sha))
