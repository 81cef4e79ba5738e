"""The bandwidth experiment: a parameter server (1 server, N workers) against DDP's ring allreduce (N
ranks), every host's link capped alike (tc tbf, both directions), on a model big enough that
communication matters (mlp-wide-synthetic, 4.3 MB). Each process is its own namespace host.

    python -m psbench.bench.lab.netbench [--quick] [--caps 100,1000,none] [--steps 30]     (or: psbench netlab bench)

The classic result: the PS server's one link carries N models in and N out per step, so under a cap
its throughput falls as 1/N of the link, while the ring moves 2(N-1)/N models per host in parallel.
Output: results/netlab/bandwidth.{csv,png} (atomic) and one run folder per (system, cap) under
results/netlab/ for the report. samples/s is the steady state under the suite's one warm-up rule
(bench/harness/steady.py: each worker past its first 10% of steps, over the span where all workers
run, so staggered process starts are excluded), the rule the report and the scale model's check use.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from psbench.bench.harness.steady import steady_rate
from psbench.bench.lab.cluster.file import ClusterFile, Host
from psbench.bench.lab.cluster.records import recorded_spec
from psbench.bench.lab.cluster.run import run_file
from psbench.core.spec import RunSpec
from psbench.core.errors import ConfigError
from psbench.core.tables import read_table

SUITE = "netlab"
MIN_STEPS = 5  # a warm-up step and a few after it, for a steady window
WORKLOAD = "mlp-wide-synthetic"


@dataclass(frozen=True)
class Setting:
    system: str            # ps | ddp
    cap_mbit: float | None
    consistency: str = "bsp"

    @property
    def label(self) -> str:
        return f"PS {self.consistency.upper()}" if self.system == "ps" else "DDP ring"


def cluster_for(s: Setting, workers: int, steps: int, port: int, seed: int = 0) -> ClusterFile:
    spec = RunSpec(s.system, WORKLOAD, workers=workers, seed=seed, max_steps=steps, epochs=100, evals_per_epoch=1,
                   # DDP's store listens on a lab address, unauthenticated: opted in (and recorded)
                   options={"consistency": s.consistency, "servers": 1} if s.system == "ps" else {"insecure": True})
    worker_hosts = [Host(f"w{k}", ("worker",), cap_mbit=s.cap_mbit) for k in range(workers)]
    hosts = ([Host("ps0", ("ps-server",), cap_mbit=s.cap_mbit)] if s.system == "ps" else []) + worker_hosts
    return ClusterFile("netns", spec, tuple(hosts), SUITE, port, 900.0, source="psbench.bench.lab.netbench")


def run_setting(s: Setting, workers: int, steps: int, results_dir: Path, port: int, resume: bool) -> dict[str, Any]:
    cf = cluster_for(s, workers, steps, port)
    run_file(cf, results_dir, resume=resume)
    run_dir = Path(results_dir) / SUITE / recorded_spec(cf).run_id
    manifest = json.loads((run_dir / "manifest.json").read_text())
    steps_df = read_table(run_dir, "steps")
    rate = steady_rate(steps_df)
    if not math.isfinite(rate):
        raise ConfigError("netbench: too few steps for a steady-state window; raise --steps")
    return {"system": s.system, "label": s.label, "consistency": s.consistency if s.system == "ps" else "",
            "cap_mbit": s.cap_mbit, "workers": workers, "steps": steps,
            "batch_size": int(steps_df["n_samples"].median()),
            "samples_per_s": rate,
            "samples_per_s_whole_run": manifest["summary"]["samples_per_s"],
            "bytes_per_step": float(steps_df["bytes"].median()), "run_id": manifest["run_id"]}


def link_goodput_mbit(cap_mbit: float, nbytes: int | None = None, port: int = 6300) -> float:
    """TCP goodput of one capped link in a two-host lab (netprobe sink/source), in Mbit/s: the
    bandwidth the model is given for that cap (tbf passes somewhat less than its nominal rate)."""
    from psbench.bench.lab.netlab import NetLab, Role

    nbytes = nbytes or int(cap_mbit * 1e6 / 8 * 0.5)  # ~0.5 s of traffic
    py = sys.executable
    with NetLab(hosts=2, caps_mbit={0: cap_mbit, 1: cap_mbit}) as lab:
        results = lab.run_cluster([
            Role("sink", 1, [py, "-m", "psbench.bench.lab.netprobe", "sink", "--bind", "{h1}", "--port", str(port)], ready_port=port),
            Role("source", 0, [py, "-m", "psbench.bench.lab.netprobe", "source", "--host", "{h1}", "--port", str(port),
                               "--bytes", str(nbytes)])], timeout=120)
    for r in results.values():
        if r.returncode != 0:
            raise RuntimeError(f"netprobe {r.name} failed: {r.stderr[-500:]}")
    return float(json.loads(results["sink"].stdout)["mbit_s"])


def settings(caps: list[float | None], consistencies: list[str]) -> list[Setting]:
    # interleaved per cap, so a slow spell of this shared machine hits both systems alike
    return [x for cap in caps for x in [Setting("ps", cap, c) for c in consistencies] + [Setting("ddp", cap)]]


def run_bench(caps: list[float | None], workers: int = 4, steps: int = 30,
              consistencies: tuple[str, ...] = ("bsp",), results_dir: Path = Path("results"),
              port: int = 29600, resume: bool = True) -> pd.DataFrame:
    rows = []
    for s in settings(list(caps), list(consistencies)):
        cap = f"{s.cap_mbit:g} Mbit/s" if s.cap_mbit else "uncapped"
        print(f"netbench: {s.label}, {workers} workers, {cap}", file=sys.stderr)
        rows.append(run_setting(s, workers, steps, results_dir, port, resume))
    table = pd.DataFrame(rows)
    goodput = {c: link_goodput_mbit(c) for c in caps if c}
    table["link_goodput_mbit"] = [goodput.get(c) if c == c else None for c in table["cap_mbit"]]
    key = table["cap_mbit"].fillna(0.0)
    ddp = dict(zip(key[table.system == "ddp"], table[table.system == "ddp"]["samples_per_s"]))
    table["ddp_over_this"] = [ddp.get(c, float("nan")) / v for c, v in zip(key, table["samples_per_s"])]
    return table


def write_outputs(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    from psbench.core.atomic import atomic_write, atomic_write_csv

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out_dir / "bandwidth.csv", out_dir / "bandwidth.png"
    atomic_write_csv(csv_path, table)
    fig = plot(table)
    atomic_write(png_path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    import matplotlib.pyplot as plt

    plt.close(fig)
    return [csv_path, png_path]


def plot(table: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = table["cap_mbit"].fillna(0.0)  # 0: uncapped (NaN would not compare equal to itself)
    caps = list(dict.fromkeys(key.tolist()))
    labels = list(dict.fromkeys(table["label"]))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = [float(table[(table.label == label) & (key == c)]["samples_per_s"].iloc[0]) for c in caps]
        xs = [k + (i - (len(labels) - 1) / 2) * width for k in range(len(caps))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(caps)), [f"{c:g} Mbit/s" if c else "uncapped" for c in caps])
    ax.set_ylabel("samples/s (steady state, all workers)")
    n = int(table["workers"].iloc[0])
    ax.set_title(f"PS (1 server) vs ring allreduce, {n} workers, every link capped\n"
                 f"{WORKLOAD} (4.3 MB), network-namespace hosts", fontsize=10)
    ax.set_yscale("log")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def parse_caps(text: str) -> list[float | None]:
    caps: list[float | None] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item in ("none", "uncapped", "0"):
            caps.append(None)
            continue
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"--caps: '{item}' is not a number of Mbit/s or 'none'") from None
        if value <= 0:
            raise ConfigError(f"--caps: {value} must be > 0")
        caps.append(value)
    return caps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a ~2 minute version: caps 100,none, 8 steps, PS BSP only")
    p.add_argument("--caps", default="100,1000,none", help="per-host caps in Mbit/s, 'none' = uncapped (default 100,1000,none)")
    p.add_argument("--workers", type=int, default=4, help="PS workers (plus one server host) and DDP ranks (default 4)")
    p.add_argument("--steps", type=int, default=30, help="steps per worker (default 30)")
    p.add_argument("--ps-consistency", default="bsp,asp", help="PS modes to run (default bsp,asp)")
    p.add_argument("--results-dir", type=Path, default=Path("results"), help="results root (default ./results)")
    p.add_argument("--no-resume", action="store_true", help="re-run settings already in results/netlab/")


def main(args: argparse.Namespace) -> int:
    from psbench.bench.lab.netlab import unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise ConfigError(f"the bandwidth experiment needs network namespaces: {reason}")
    if args.quick:
        caps, steps, modes = [100.0, None], 8, ["bsp"]
    else:
        caps, steps, modes = parse_caps(args.caps), args.steps, args.ps_consistency.split(",")
    if args.workers < 2 or steps < MIN_STEPS:
        raise ConfigError(f"need --workers >= 2 and --steps >= {MIN_STEPS}")
    for m in modes:
        if m not in ("bsp", "asp"):
            raise ConfigError(f"--ps-consistency: '{m}' is not bsp or asp")
    table = run_bench(caps, args.workers, steps, tuple(modes), args.results_dir, resume=not args.no_resume)
    paths = write_outputs(table, Path(args.results_dir) / SUITE)
    with pd.option_context("display.width", 160, "display.float_format", "{:.2f}".format):
        print(table[["label", "cap_mbit", "workers", "samples_per_s", "samples_per_s_whole_run", "ddp_over_this"]]
              .to_string(index=False))
    print("wrote " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m psbench.bench.lab.netbench", description=__doc__.splitlines()[0])
    add_arguments(p)
    try:
        sys.exit(main(p.parse_args()))
    except ConfigError as exc:
        print(f"psbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
