"""`psbench gpu-check` (`make gpu-check`): the GPU paths run on this machine's CUDA devices, a few
hundred steps each, and their figures printed: single on one GPU, ddp with NCCL on a GPU a rank, ps
with one shard (its workers on the GPUs, the shard on the host).

Prints one Markdown table: system, workers, device (its name), samples/s, samples/s per device and
the medians of the step's time columns (ms) after warm-up (harness/steady.py's rule), and writes
the runs to --results-dir (default: a temporary folder, removed). Exit codes: 0 every run done; 1 a
run failed (its line printed); 2 bad input; NO_CUDA_EXIT (3) torch sees no CUDA device here: one
line, nothing ran."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from psbench.core.errors import ConfigError

NO_CUDA_EXIT = 3
WORKLOAD = "resnet-synthetic"  # ResNet-8 on CIFAR-shaped synthetic data: convolutions and BatchNorm, no files
BATCH = 128
STEPS = 300
SYSTEMS = ("single", "ddp", "ps")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=STEPS, help=f"steps per worker of each run (default {STEPS})")
    p.add_argument("--batch-size", type=int, default=BATCH, help=f"mini-batch per worker (default {BATCH})")
    p.add_argument("--workload", default=WORKLOAD, help=f"workload (default {WORKLOAD})")
    p.add_argument("--results-dir", type=Path, help="keep the runs here, suite gpu-check (default: a temporary "
                                                    "folder, removed)")


def check_specs(workload: str, steps: int, batch_size: int, gpus: int) -> list:
    """The runs: single on one GPU; ddp with a rank a GPU (NCCL: one GPU per rank); ps, one shard and a
    worker a GPU."""
    from psbench.core.accelerator import CUDA
    from psbench.core.spec import RunSpec

    common = dict(workload=workload, max_steps=steps, epochs=10**6, batch_size=batch_size, evals_per_epoch=1,
                  device=CUDA)
    return [RunSpec("single", **common),
            RunSpec("ddp", workers=gpus, **common),
            RunSpec("ps", workers=gpus, options={"servers": 1, "consistency": "asp"}, **common)]


def figures(summary: dict, steps: list[dict], gpus_used: int, device_name: str, system: str, workers: int) -> dict:
    """One row of the table from a run's summary and step rows."""
    import pandas as pd

    from psbench.bench.harness.steady import steady_rate, warmup_mask
    from psbench.core.records import STEP_TIME_COLUMNS

    frame = pd.DataFrame(steps)
    kept = frame[warmup_mask(frame)] if len(frame) else frame
    rate = steady_rate(frame) if len(frame) else float("nan")
    row = {"system": system, "workers": workers, "device": device_name, "steps": summary.get("steps"),
           "samples/s": rate, "samples/s per device": rate / gpus_used}
    for column in STEP_TIME_COLUMNS:
        values = kept[column].dropna() if len(kept) else []
        row[f"{column[:-2]} ms"] = float(values.median()) * 1000 if len(values) else float("nan")
    return row


def main(args: argparse.Namespace) -> int:
    if args.steps < 20 or args.batch_size < 1:
        raise ConfigError(f"gpu-check: --steps {args.steps} --batch-size {args.batch_size}: allowed: --steps >= 20 "
                          "(a warm-up is left out), --batch-size >= 1")
    from psbench.core.accelerator import cuda_available, cuda_missing_reason

    if not cuda_available():
        print(f"psbench gpu-check: no CUDA device ({cuda_missing_reason()}); nothing ran (exit {NO_CUDA_EXIT})",
              file=sys.stderr)
        return NO_CUDA_EXIT
    import pandas as pd
    import torch

    from psbench.bench.harness.runner import plan, record_run
    from psbench.bench.report.markdown import markdown_table

    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    rows, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="psbench-gpu-check-") as tmp:
        results_dir = args.results_dir or Path(tmp)
        for spec in check_specs(args.workload, args.steps, args.batch_size, gpus):
            print(f"psbench gpu-check: {spec.system}, {spec.workers} worker(s) on {name} ...", file=sys.stderr,
                  flush=True)
            try:
                # no CPU budget: the workers' cores are not what is measured here
                recorder = record_run(plan(spec, allow_oversubscribe=True, calibrator=lambda *_: None), quiet=True)
            except (RuntimeError, ConfigError) as exc:
                failed += 1
                print(f"psbench gpu-check: {spec.system} failed: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
                continue
            recorder.finish(results_dir, "gpu-check")
            rows.append(figures(recorder.summary(), recorder.steps, min(spec.workers, gpus), name, spec.system,
                                spec.workers))
    print(f"psbench gpu-check: {args.workload}, batch {args.batch_size} a worker, {args.steps} steps a worker, "
          f"{gpus} x {name}, torch {torch.__version__} (CUDA {torch.version.cuda}); medians after warm-up")
    print(markdown_table(pd.DataFrame(rows)))
    return 1 if failed else 0
