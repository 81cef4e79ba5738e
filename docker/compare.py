"""The same PS job in containers (docker compose: server, N workers, ps-job) and on loopback
(`psbench run --system ps`), interleaved, N repeats each: samples/s and median step time side by side.

    .venv/bin/python docker/compare.py --repeats 5 --workers 2 --workload mlp-higgs-synthetic \
        --max-steps 600 --epochs 10            # needs the image (make docker-image) and root

Both read the same summary fields of an ordinary run folder. The compose clock spans the first
worker's start to the last one's end (workers start as their containers come up, no common go
signal), the loopback launcher starts all workers at once; the median step time is free of that.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compose_base() -> list[str]:
    ok = subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    return ["docker", "compose"] if ok else ["docker-compose"]


def summary(run_root: Path) -> dict:
    (manifest,) = run_root.glob("*/*/manifest.json")
    return json.loads(manifest.read_text())["summary"]


def run_compose(args: argparse.Namespace, out: Path) -> dict:
    env = {**os.environ, "RESULTS_DIR": str(out), "PSBENCH_PS_TOKEN": secrets.token_hex(16),
           "PSBENCH_SPARK_TOKEN": secrets.token_hex(16), "WORKERS": str(args.workers),
           "WORKLOAD": args.workload, "MAX_STEPS": str(args.max_steps), "CONSISTENCY": args.consistency,
           "JOB_ARGS": f"--epochs {args.epochs}"}
    base = [*compose_base(), "-f", str(ROOT / "docker" / "docker-compose.yml"), "-p", "psbcompare"]
    try:
        subprocess.run([*base, "up", "--scale", f"worker={args.workers}"], env=env, check=True,
                       capture_output=True, timeout=1200)
    finally:
        subprocess.run([*base, "down", "-t", "5"], env=env, capture_output=True, timeout=300)
    return summary(out)


def run_loopback(args: argparse.Namespace, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "psbench", "run", "--system", "ps", "-np", str(args.workers),
                    "--consistency", args.consistency, "--workload", args.workload, "--max-steps", str(args.max_steps),
                    "--epochs", str(args.epochs), "--results-dir", str(out), "--suite", "loopback", "--no-progress",
                    "--no-resume"], check=True, capture_output=True, timeout=1200, cwd=ROOT)
    return summary(out)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4g} [{min(values):.4g}, {max(values):.4g}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--workload", default="mlp-higgs-synthetic")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--consistency", default="asp")
    args = p.parse_args()
    rows: dict[str, list[dict]] = {"compose": [], "loopback": []}
    for i in range(args.repeats):
        for name, fn in (("compose", run_compose), ("loopback", run_loopback)):
            out = Path(tempfile.mkdtemp(prefix=f"psb-{name}-"))
            try:
                s = fn(args, out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
            rows[name].append(s)
            print(f"repeat {i} {name}: {s['samples_per_s']:.1f} samples/s, median step {s['median_step_s'] * 1e3:.2f} ms, "
                  f"{s['steps']} steps", flush=True)
    print(f"\n{args.workload}, {args.workers} workers, {args.consistency}, {rows['compose'][0]['steps']} steps; "
          f"median [min, max] over n={args.repeats}")
    print("| where | samples/s | median step ms | final val acc |\n|---|---|---|---|")
    for name, ss in rows.items():
        print(f"| {name} | {spread([s['samples_per_s'] for s in ss])} | "
              f"{spread([s['median_step_s'] * 1e3 for s in ss])} | {spread([s['final_val_accuracy'] for s in ss])} |")
    ratio = [c["samples_per_s"] / lo["samples_per_s"] for c, lo in zip(rows["compose"], rows["loopback"])]
    print(f"compose / loopback samples/s, per interleaved pair: {spread(ratio)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
