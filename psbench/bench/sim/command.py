"""`psbench simulate`: two models, one command. With `--from RESULTS`, the event model: its costs
measured from a results folder's suites, checked against their runs, projected (from_results.py).
Otherwise the analytic model (analytic.py): its inputs measured here (`--calibrate WORKLOAD`),
loaded (`--calibration FILE`) or a preset, optionally checked against runs measured here
(analytic_check.py), and its projection table and plot written. Both write calibration.json (the
model's inputs and where they came from), projection.csv/png/svg and provenance.json."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from psbench.bench.sim.analytic import (PRESETS, AnalyticInputs, Validation, assumptions_text, default_scenarios,
                                        measure_inputs, measure_spark_job_overhead, plot, projection_table,
                                        write_validation)
from psbench.bench.sim.analytic_check import validate_local, validate_netlab
from psbench.core.atomic import atomic_write_csv, atomic_write_json, atomic_write_text
from psbench.core.cpu import usable_cores
from psbench.core.errors import ConfigError
from psbench.core.records import provenance


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from", dest="from_results", type=Path, metavar="RESULTS",
                     help="the event model: costs measured from the suites in RESULTS (systems, switch, throughput, and "
                          "kassela's cost_model.json), checked against every run of systems and switch, projected "
                          "to 8-1024 workers and the thesis' setups (bench/sim/from_results.py)")
    src.add_argument("--calibrate", metavar="WORKLOAD", default=None,
                     help="the analytic model (the default), its inputs measured here: compute time of WORKLOAD with "
                          "the single system, loopback bandwidth and round trip (default cnn-mnist1d)")
    src.add_argument("--calibration", type=Path, metavar="FILE",
                     help="the analytic model, its inputs read from the calibration.json an earlier run wrote")
    src.add_argument("--preset", choices=sorted(PRESETS), help="the analytic model in a published setting")
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size projected (default 64)")
    p.add_argument("--servers", type=int, default=8, help="shards of the sharded-PS curve (default 8)")
    p.add_argument("--bandwidth-mbit", type=float, help="override the link bandwidth (Mbit/s), e.g. a cluster's")
    p.add_argument("--rtt-us", type=float, help="override the round-trip time (microseconds)")
    p.add_argument("--spark-job-ms", type=float, help="override Spark's per-job overhead (ms)")
    p.add_argument("--measure-spark", action="store_true", help="with --calibrate: also time Spark jobs (slow)")
    p.add_argument("--spark-from", type=Path, metavar="JSON",
                   help="Spark's job cost from the kassela suite's fit (results/kassela/cost_model.json): "
                        "spark-mllib's fixed cost per mini-batch, less its tasks' assumed launch cost")
    p.add_argument("--validate", action="store_true",
                   help="with --calibrate: also run ps (bsp, asp) and ddp at 1-4 workers here, interleaved with the "
                        "runs of its inputs, and report the model's error against them (bench/sim/analytic_check.py)")
    p.add_argument("--validate-steps", type=int, default=40, help="steps per validation run (default 40)")
    p.add_argument("--validate-repeats", type=int, default=3, help="repeats per validation run (default 3)")
    p.add_argument("--netlab", type=Path, metavar="CSV",
                   help="also validate against the bandwidth experiment's table (results/netlab/bandwidth.csv)")
    p.add_argument("--max-workers", type=int, default=1024,
                   help="with --from: project to this many workers at most (default 1024)")
    p.add_argument("--out", type=Path, default=Path("results/simulate"), help="output folder")


def spark_cost_from_fit(inputs: AnalyticInputs, path: Path) -> AnalyticInputs:
    """The analytic model's inputs with Spark's job overhead from a Kassela fit (written by `psbench
    report`): the job-per-mini-batch path's (spark-mllib's) fixed cost per mini-batch is one job plus one
    task per worker, so the job's part is that fixed cost less workers x the task cost."""
    import json

    if not path.is_file():
        raise ConfigError(f"--spark-from: {path} does not exist (run the kassela suite and `psbench report` on it)")
    fits = [f for f in json.loads(path.read_text()).get("fits", []) if f.get("system") == "spark-mllib"]
    if not fits:
        raise ConfigError(f"--spark-from: {path} holds no spark-mllib fit (the kassela suite runs it)")
    fit = max(fits, key=lambda f: f["runs"])
    fixed = fit["fixed"]
    job_s = fixed["s"] - fit["workers"] * inputs.spark_task_overhead_s
    if not job_s > 0:
        raise ConfigError(f"--spark-from: spark-mllib's fitted fixed cost {fixed['s'] * 1e3:.3g} ms leaves no job cost")
    return replace(inputs, spark_job_overhead_s=job_s,
                   source=f"{inputs.source} + Spark job {job_s * 1e3:.3g} ms from the kassela fit (spark-mllib fixed "
                          f"{fixed['s'] * 1e3:.3g} ms [{fixed['lo'] * 1e3:.3g}, {fixed['hi'] * 1e3:.3g}], "
                          f"{fit['runs']} runs, {fit['workers']} workers, less {fit['workers']} x the "
                          f"{inputs.spark_task_overhead_s * 1e3:.3g} ms task cost assumed; {path})")


def main_from_results(args: argparse.Namespace) -> int:
    from psbench.bench.sim.from_results import simulate_results

    if not args.from_results.is_dir():
        raise ConfigError(f"--from: {args.from_results} is not a folder (give a results root, e.g. results/reference)")
    for name in ("validate", "measure_spark", "spark_from", "netlab", "bandwidth_mbit", "rtt_us", "spark_job_ms"):
        if getattr(args, name):
            raise ConfigError(f"--from takes its costs from the records: --{name.replace('_', '-')} belongs to the "
                              f"analytic model (--calibrate, --calibration, --preset)")
    if args.max_workers < 8:
        raise ConfigError(f"--max-workers {args.max_workers}: the projection starts at 8 workers; give >= 8")
    out: Path = args.out
    stamp = provenance()
    result = simulate_results(args.from_results, out, stamp, max_workers=args.max_workers)
    arguments = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    atomic_write_json(out / "provenance.json", {**stamp, "simulate_arguments": arguments, "files": result["files"]})
    s = result["summary"]
    if s:
        print(f"validation: {s['validated_runs']} runs, samples/s error median {s['samples_per_s_error_median']:.1%}, "
              f"max {s['samples_per_s_error_max']:.1%} (goal {'met' if s['meets_goal'] else 'not met'})")
    print(f"wrote {out}/: {', '.join(result['files'])}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.servers < 1:
        raise ConfigError("--batch-size and --servers must be >= 1")
    if args.from_results is not None:
        return main_from_results(args)
    return main_analytic(args)


def main_analytic(args: argparse.Namespace) -> int:
    if args.validate and (args.preset or args.calibration):
        raise ConfigError("--validate measures its own inputs: use it with --calibrate WORKLOAD (or alone)")
    validations: list[tuple[str, Validation]] = []
    if args.preset:
        inputs = PRESETS[args.preset]
    elif args.calibration:
        if not args.calibration.is_file():
            raise ConfigError(f"--calibration: {args.calibration} does not exist (give a calibration.json an earlier "
                              f"`psbench simulate` wrote)")
        inputs = AnalyticInputs.from_json(args.calibration.read_text())
    elif args.validate:
        inputs, validation = validate_local(args.calibrate or "mlp-wide-synthetic", args.batch_size,
                                            steps=args.validate_steps, repeats=args.validate_repeats)
        validations.append(("loopback runs, 1-4 workers", validation))
    else:
        inputs = measure_inputs(args.calibrate or "cnn-mnist1d")
        if args.measure_spark:
            inputs = replace(inputs, spark_job_overhead_s=measure_spark_job_overhead())
    if args.spark_from:
        inputs = spark_cost_from_fit(inputs, args.spark_from)
    overrides: dict[str, Any] = {}
    if args.bandwidth_mbit:
        overrides["bandwidth_Bps"] = args.bandwidth_mbit * 1e6 / 8
    if args.rtt_us:
        overrides["rtt_s"] = args.rtt_us * 1e-6
    if args.spark_job_ms:
        overrides["spark_job_overhead_s"] = args.spark_job_ms * 1e-3
    if overrides:
        inputs = replace(inputs, source=inputs.source + " + overrides " + ", ".join(overrides), **overrides)
    if args.netlab:
        import pandas as pd

        if not args.netlab.is_file():
            raise ConfigError(f"--netlab: {args.netlab} does not exist (run `psbench netlab bench` first)")
        cores = inputs.cores or usable_cores().count
        validations.append(("netns bandwidth runs", validate_netlab(pd.read_csv(args.netlab), replace(inputs, cores=cores))))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    stamp = provenance()  # every file names the commit that made it, and provenance.json says all
    if validations:
        write_validation(validations, out / "validation.csv", stamp["git_sha"])
    inputs = replace(inputs, cores=0)  # projections: a machine per worker
    rows = projection_table(inputs, default_scenarios(args.batch_size, args.servers))
    atomic_write_text(out / "calibration.json", inputs.to_json(stamp))
    import pandas as pd

    table = pd.DataFrame(rows).assign(git_sha=stamp["git_sha"])
    atomic_write_csv(out / "projection.csv", table)
    paths = plot(rows, inputs, args.batch_size, out / "projection",
                 f"psbench {stamp['git_sha'] or 'unknown commit'}{' + uncommitted changes' if stamp['git_dirty'] else ''}")
    files = sorted(p.name for p in [out / "calibration.json", out / "projection.csv", *paths,
                                    *([out / "validation.csv"] if validations else [])])
    arguments = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    atomic_write_json(out / "provenance.json", {**stamp, "simulate_arguments": arguments, "files": files})
    print("Assumptions: " + assumptions_text(inputs, args.batch_size))
    pivot = table.pivot(index="workers", columns="curve", values="efficiency")
    with pd.option_context("display.width", 200, "display.float_format", "{:.1%}".format):
        print("scaling efficiency:")
        print(pivot.to_string())
    print("wrote " + ", ".join(str(p) for p in [out / "calibration.json", out / "projection.csv", *paths]))
    return 0
