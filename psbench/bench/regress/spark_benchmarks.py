"""Spark benchmark figures as ratios measured side by side in one run (timings are noisy; absolute
times on a shared box mean little).

- `ratio_spark_mllib_step_vs_single()`: per-step time of spark-mllib over single, one process, one
  run each, for a CI regression check.
- `sweep_table(results_dir, suite)`: the batch-size sweep (bench/experiments/extra/batch_sweep.toml) as a
  table of per-step times and ratios; `python -m psbench.bench.regress.spark_benchmarks --suite batch-sweep`.

Per-step time is the median interval between worker 0's consecutive steps (steady state: Spark
session start, barrier/TorchDistributor launch and evaluations are excluded); mean_step_s (the
run's training time over its steps, launch included) is reported beside it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from psbench.core.tables import read_table


def median_step_s(steps: list[dict[str, Any]] | pd.DataFrame) -> float:
    from psbench.core.records import median_step_interval

    value = median_step_interval(pd.DataFrame(steps))
    return float("nan") if value is None else value


def _run(system: str, workers: int, options: dict[str, Any], **settings: Any) -> dict[str, float]:
    from psbench.bench.harness.runner import plan, record_run
    from psbench.core.spec import RunSpec

    spec = RunSpec(system=system, workers=workers, options=options, **settings)
    # local[2] and the driver share 2 cores (said so): a per-step cost, measured side by side
    recorder = record_run(plan(spec, allow_oversubscribe=True))
    return {"median_step_s": median_step_s(recorder.steps), "mean_step_s": recorder.summary()["mean_step_s"]}


def ratio_spark_mllib_step_vs_single(workload: str = "logreg-higgs-synthetic", batch_size: int = 64,
                                     steps: int = 20, workers: int = 2) -> dict[str, float]:
    """spark-mllib (workers in local[workers]) and single, same workload and per-worker batch, run
    one after the other in this process. Returns the per-step times and their ratio."""
    settings = {"workload": workload, "batch_size": batch_size, "max_steps": steps, "epochs": 50,
                "evals_per_epoch": 1}
    single = _run("single", 1, {}, **settings)
    mllib = _run("spark-mllib", workers, {"spark_master": f"local[{workers}]"}, **settings)
    return {"single_step_s": single["median_step_s"], "spark_mllib_step_s": mllib["median_step_s"],
            "ratio": mllib["median_step_s"] / single["median_step_s"],
            "ratio_mean_step": mllib["mean_step_s"] / single["mean_step_s"]}


def sweep_table(results_dir: Path, suite: str) -> pd.DataFrame:
    """One row per (workload, system, batch_size): per-step times, the ratio to single at the same
    batch size, and the ratio of the smallest-batch to the largest-batch step time per system
    (Kassela 2019's measure: how far a system's per-step time falls as batches shrink)."""
    rows = []
    for manifest_path in sorted(Path(results_dir, suite).glob("*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        spec = manifest["spec"]
        steps = read_table(manifest_path.parent, "steps")
        overheads = manifest.get("extra", {}).get("spark_overheads", {})
        rows.append({"workload": spec["workload"], "system": spec["system"], "batch_size": spec["batch_size"],
                     "workers": spec["workers"], "median_step_s": median_step_s(steps),
                     "mean_step_s": manifest["summary"]["mean_step_s"],
                     "spark_overhead_s": overheads.get("overhead_s_median", overheads.get("allgather_s_median")),
                     "launch_s": overheads.get("launch_s")})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    single = table[table["system"] == "single"].set_index(["workload", "batch_size"])["median_step_s"]
    table["vs_single"] = [row.median_step_s / single.get((row.workload, row.batch_size), np.nan)
                          for row in table.itertuples()]
    largest_over_smallest = {}
    for (workload, system), group in table.groupby(["workload", "system"]):
        by_batch = group.set_index("batch_size")["median_step_s"]
        largest_over_smallest[(workload, system)] = by_batch[by_batch.index.max()] / by_batch[by_batch.index.min()]
    table["step_fall_largest_to_smallest_batch"] = [largest_over_smallest[(r.workload, r.system)]
                                                    for r in table.itertuples()]
    return table.sort_values(["workload", "system", "batch_size"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-step time vs batch size table (ratios) of a sweep suite")
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--suite", default="batch-sweep")
    parser.add_argument("--ratio", action="store_true", help="instead: measure spark-mllib/single now")
    args = parser.parse_args(argv)
    if args.ratio:
        print(json.dumps(ratio_spark_mllib_step_vs_single(), indent=1))
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4f}".format):
        print(sweep_table(args.results_dir, args.suite).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
