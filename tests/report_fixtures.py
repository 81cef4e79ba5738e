"""Small fixture suites for the report tests: real `single` runs through the harness runner, plus runs of
other systems written through the real Recorder (same file format) from synthetic rows."""
from __future__ import annotations

import functools
import math
import zlib
from pathlib import Path
from unittest import mock

import numpy as np

from psbench.core import records
from psbench.core.records import Recorder
from psbench.bench.harness.runner import run_all
from psbench.core.spec import RunSpec
from psbench.workloads.sharding import make_shards

T0 = 1_700_000_000.0  # a fixed training-clock origin for fixture runs
# The checkout's provenance, read once for every fixture run (two git commands a run, ~15 ms, on
# thousands of synthetic runs): a fixture run's manifest says what made it, as a real one does.
_provenance_once = functools.lru_cache(maxsize=1)(records.provenance)


def fake_run(results_dir: Path, suite: str, spec: RunSpec, *, step_s: float, steps: int = 24,
             acc_max: float = 0.9, tau: float = 0.3, final_noise: float = 0.0, staleness: list[int] | None = None,
             switch_at: int | None = None, shards: bool = False, target: float = 0.85,
             parts: dict[str, float] | None = None, setup_s: float = 0.5, handover_s: float | None = None,
             conditions: dict | None = None, extra: dict | None = None) -> None:
    """One run of `spec.system` as a real Recorder would write it: `steps` steps per worker, each
    taking step_s; validation accuracy climbs to acc_max with time constant tau seconds. `parts`:
    the step's time breakdown as fractions of step_s (compute_s, emulated_s, comm_s, wait_s);
    setup_s the launch cost, handover_s a Strategy-Switch hand-over kept off the clock; `conditions`
    the manifest's (the CPU plan and what the run used); `extra` more of the manifest's extra."""
    rng = np.random.default_rng(zlib.crc32(spec.run_id.encode()))
    rec = Recorder(spec, target_accuracy=target)
    batch = spec.batch_size or 32
    tau = tau * steps * step_s  # tau is given as a fraction of the run
    noise = final_noise * rng.standard_normal()
    for worker in range(spec.workers):
        for step in range(steps):
            t = (step + 1) * step_s * (1 + 0.02 * worker)
            stale = None if staleness is None else int(staleness[(step + worker) % len(staleness)])
            split = {k: f * step_s * (1 + 0.02 * worker) for k, f in (parts or {}).items()}
            rec.step(worker, step, batch, loss=2.3 * math.exp(-t / tau) + 0.1, staleness=stale, t_wall=t, **split)
    for k in range(7):
        step = k * steps // 6
        t = step * step_s
        acc = acc_max * (1 - math.exp(-t / tau)) + (noise if k == 6 else 0.0)
        rec.eval(step, "train", 2.3 * math.exp(-t / tau) + 0.1 - noise, min(1.0, acc + 0.02), t_wall=t)
        rec.eval(step, "val", 2.3 * math.exp(-t / tau) + 0.15 - noise / 2, min(1.0, acc), t_wall=t)
    if switch_at is not None:
        rec.event("switch", step=switch_at, t_wall=switch_at * step_s, criterion="plateau", to="async")
        rec.extra["switch"] = {"handover_s": handover_s, "switch_t_wall": switch_at * step_s, "fired": True}
    if shards:
        labels = np.repeat(np.arange(10), 30)
        features = (labels[:, None] + rng.standard_normal((len(labels), 4))).astype(np.float32)
        plan = make_shards(labels, features, spec.workers, spec.sharding,
                           spec.seed)
        rec.shard_report = plan.report(labels, 10)
    if conditions is not None:
        rec.extra["conditions"] = conditions
    rec.extra.update(extra or {})
    rec.t0 = T0
    rec.extra["setup_s"] = setup_s
    rec.t_end = T0 + steps * step_s * (1 + 0.02 * (spec.workers - 1))
    with mock.patch.object(records, "provenance", lambda: dict(_provenance_once())):
        rec.finish(results_dir, suite)


def build_fixture_suite(results_dir: Path, suite: str = "fixture") -> Path:
    """A suite with every kind of data the report draws: returns results_dir / suite."""
    # Real runs of the reference system: a small batch-size sweep.
    specs = [RunSpec("single", "mlp-digits", batch_size=b, max_steps=12, evals_per_epoch=1) for b in (16, 64)]
    run_all(specs, results_dir, suite, progress=False)
    # The PS: asp with staleness, bsp without, at 2 and 4 workers; a batch-size sweep at 2 workers.
    split = {"asp": {"compute_s": 0.5, "comm_s": 0.45}, "bsp": {"compute_s": 0.5, "comm_s": 0.25, "wait_s": 0.2}}
    for consistency, stale in (("asp", [0, 1, 1, 2, 3]), ("bsp", [0])):
        for workers in (2, 4):
            for batch in ((16, 64) if workers == 2 else (16,)):
                spec = RunSpec("ps", "mlp-digits", workers=workers, batch_size=batch,
                               options={"consistency": consistency})
                fake_run(results_dir, suite, spec, step_s=0.002 * (batch / 16) ** 0.2, staleness=stale,
                         parts=split[consistency])
    # The peer parameter servers beside the PS (asp, batch 16, 2 and 4 workers), slower per step.
    for system, step_s in (("ray-ps", 0.006), ("rpc-ps", 0.003)):
        for workers in (2, 4):
            fake_run(results_dir, suite, RunSpec(system, "mlp-digits", workers=workers, batch_size=16,
                                                 options={"consistency": "asp"}), step_s=step_s, staleness=[0, 1])
    # Allreduce at 2 workers.
    fake_run(results_dir, suite, RunSpec("ddp", "mlp-digits", workers=2, batch_size=16), step_s=0.003,
             parts={"compute_s": 0.4, "comm_s": 0.4, "wait_s": 0.15})
    # Strategy-Switch with its switch event; at 4 workers too, beside ddp, for the regime map.
    fake_run(results_dir, suite, RunSpec("strategy-switch", "mlp-digits", workers=2, batch_size=16),
             step_s=0.0025, switch_at=10, handover_s=0.2)
    fake_run(results_dir, suite, RunSpec("ddp", "mlp-digits", workers=4, batch_size=16), step_s=0.004)
    fake_run(results_dir, suite, RunSpec("strategy-switch", "mlp-digits", workers=4, batch_size=16),
             step_s=0.003, switch_at=10, handover_s=0.2)
    # Sharding variance: three strategies, three seeds, with shard reports; random is the noisiest.
    for strategy, spread in (("random", 0.04), ("stratified", 0.015), ("distribution-aware:3", 0.01)):
        for seed in range(3):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            fake_run(results_dir, suite, spec, step_s=0.002, final_noise=spread, staleness=[0, 1, 2], shards=True)
    return results_dir / suite
