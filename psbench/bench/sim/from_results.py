"""`psbench simulate --from RESULTS`: the event model, its costs measured from a results folder's suites,
checked against every run of its systems and switch suites (and of `psbench netlab bench`'s
tc-capped runs, each with its links' measured goodput, when RESULTS holds them), and projected
(project.py). Writes
into the output folder: calibration.json, validation.csv (a row per run), projection.csv,
gap.csv, shards.csv, setups.csv, anchors.csv, report.md and the plots, each naming its commit."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from psbench.bench.harness import store
from psbench.bench.report.markdown import markdown_table
from psbench.bench.sim import project
from psbench.bench.sim.check import GOAL_MAX, GOAL_MEDIAN, by_variant, check_suites
from psbench.bench.sim.costs import costs_from_suites
from psbench.bench.sim.model_size import model_bytes
from psbench.core.atomic import atomic_write, atomic_write_csv, atomic_write_text
from psbench.core.errors import ConfigError

# per-step costs at 1 worker, allreduce, Spark's growth; netlab-calibration: the bandwidth experiment's
# workload on loopback (bench/experiments/extra/netlab_calibration.toml), when a user ran it
COST_SUITES = ("systems", "switch", "throughput", "netlab-calibration")
# every run predicted; netlab: `psbench netlab bench`'s tc-capped namespace runs, when present
CHECKED_SUITES = ("systems", "switch", "netlab")
WORKLOAD = "mlp-digits"                                  # the one every system of these suites runs
SWITCH_STRAGGLERS = "slow:1=2.5+transient:p=0.01,ms=200"  # bench/experiments/switch.toml's


def _suites(root: Path, names: tuple[str, ...]) -> list[Path]:
    return [root / n for n in names if store.is_suite(root / n)]


def _md(df: pd.DataFrame) -> str:
    return markdown_table(df) + "\n"


def netlab_goodput(root: Path) -> dict[float, float]:
    """cap Mbit/s -> the TCP goodput measured through it, from the bandwidth experiment's table."""
    table = root / "netlab" / "bandwidth.csv"
    if not table.is_file():
        return {}
    frame = pd.read_csv(table).dropna(subset=["cap_mbit", "link_goodput_mbit"])
    return {float(c): float(g) for c, g in zip(frame["cap_mbit"], frame["link_goodput_mbit"])}


def simulate_results(root: Path, out: Path, stamp: dict[str, Any], max_workers: int = 1024) -> dict[str, Any]:
    cost_dirs = _suites(root, COST_SUITES)
    checked_dirs = _suites(root, CHECKED_SUITES)
    if not cost_dirs:
        raise ConfigError(f"--from {root}: none of the suites {', '.join(COST_SUITES)} has runs there "
                          f"(`make bench` writes them)")
    measured = costs_from_suites(cost_dirs)
    check = check_suites(checked_dirs, measured, netlab_goodput(root)) if checked_dirs else None
    out.mkdir(parents=True, exist_ok=True)
    sha = stamp.get("git_sha")
    atomic_write_text(out / "calibration.json", measured.to_json(stamp))
    figures = pd.DataFrame([f.__dict__ for f in measured.figures])
    summary: dict[str, Any] = {}
    if check is not None:
        atomic_write_csv(out / "validation.csv", check.frame().assign(git_sha=sha))
        summary = check.summary()
    batch = int(measured.compute_by_batch.get(("ps", WORKLOAD), (0, 32))[1])
    workers = tuple(n for n in project.WORKERS if n <= max_workers)
    scaling = project.scaling_table(measured, WORKLOAD, batch, workers)
    gap = project.gap_table(scaling)
    sizes = {f"{WORKLOAD} ({model_bytes(WORKLOAD) / 1e6:.2g} MB)": model_bytes(WORKLOAD),
             "cnn-mnist1d": model_bytes("cnn-mnist1d"), "10 MB": 10_000_000, "ResNet-101 (178 MB)": 178_000_000}
    shards = project.shard_saturation(measured, WORKLOAD, batch, sizes, workers=workers)
    setups = project.thesis_setups(measured, WORKLOAD, batch, root / "kassela" / "cost_model.json", SWITCH_STRAGGLERS)
    anchors = project.anchors(measured)
    for name, frame in (("projection", scaling), ("gap", gap), ("shards", shards), ("setups", setups), ("anchors", anchors)):
        atomic_write_csv(out / f"{name}.csv", frame.assign(git_sha=sha))
    plots = _plot(scaling, gap, out, f"psbench {sha or 'unknown commit'}")
    atomic_write_text(out / "report.md", _report(root, measured, figures, check, summary, scaling, gap, shards, setups,
                                                  anchors, sha, stamp.get("git_dirty")))
    return {"summary": summary, "files": sorted(p.name for p in out.iterdir() if p.is_file()), "plots": plots}


def _report(root: Path, measured, figures: pd.DataFrame, check, summary: dict[str, Any], scaling: pd.DataFrame,
            gap: pd.DataFrame, shards: pd.DataFrame, setups: pd.DataFrame, anchors: pd.DataFrame,
            sha: str | None, dirty: bool | None) -> str:
    parts = [f"# Scale model: costs measured from {root}, checked against its suites, projected\n",
             f"Commit {sha or 'unknown'}{' + uncommitted changes' if dirty else ''}. Model: a discrete-event "
             "simulation of each run (bench/sim/events.py) with the suites' device profiles and seeded stragglers; "
             "costs from the records (bench/sim/costs.py). Cost suites: "
             + ", ".join(measured.suites) + ".\n",
             "## Measured costs (each figure from the runs named; 95% intervals)\n"]
    if len(figures):
        shown = figures.assign(value_ms=figures["value"] * 1e3, lo_ms=figures["lo"].astype(float) * 1e3,
                               hi_ms=figures["hi"].astype(float) * 1e3)
        shown["source"] = shown["source"].str.slice(0, 90)
        parts.append(_md(shown[["system", "workload", "name", "value_ms", "lo_ms", "hi_ms", "n", "source"]]))
        parts.append("allreduce_beta and Spark's per-byte terms are seconds per byte (shown x1000).\n")
    if check is not None:
        parts.append("## Validation against the suites\n")
        parts.append(f"Error of predicted samples/s (and median step interval) against measured, per run, over the "
                     f"{summary['validated_runs']} runs the costs did not come from (1-worker runs are their "
                     f"inputs): median {summary['samples_per_s_error_median']:.1%} (step "
                     f"{summary['step_s_error_median']:.1%}), maximum {summary['samples_per_s_error_max']:.1%} (step "
                     f"{summary['step_s_error_max']:.1%}); goal: median ≤ {GOAL_MEDIAN:.0%}, maximum ≤ {GOAL_MAX:.0%}: "
                     f"**{'met' if summary['meets_goal'] else 'not met'}**. Runs not simulated: {summary['skipped']}.\n")
        parts.append(_md(by_variant(check)))
        for run_id, why in check.skipped[:10]:
            parts.append(f"- not simulated: {run_id}: {why}\n")
    parts.append("\n## Projection\n")
    parts.append("Assumptions: " + project.ASSUMPTIONS + ".\n")
    if len(scaling):
        pivot = scaling.pivot_table(index=["link_gbit", "workers"], columns="system", values="efficiency").reset_index()
        parts.append("Scaling efficiency (samples/s ÷ N x one worker's):\n\n" + _md(pivot))
    parts.append("\n## Specialised ÷ general-purpose throughput against workers\n")
    if len(gap):
        pivot = gap.pivot_table(index=["link_gbit", "workers"], columns="general", values="ratio").reset_index()
        parts.append("The fastest of " + ", ".join(project.SPECIALISED) + " ÷ each Spark path:\n\n" + _md(pivot))
    parts.append("\n## Where one PS shard saturates, and the shards a model needs\n" + _md(shards))
    parts.append("\n## The thesis' setups\n" + _md(setups))
    parts.append("\n## Anchors (a sanity check, not a cost input)\n" + _md(anchors))
    return "\n".join(parts)


def _plot(scaling: pd.DataFrame, gap: pd.DataFrame, out: Path, source: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = sorted(scaling["link_gbit"].unique()) if len(scaling) else []
    if not links:
        return []
    fig, axes = plt.subplots(1, len(links) + 1, figsize=(5 * (len(links) + 1), 4.6))
    for ax, gbit in zip(axes, links):
        sub = scaling[scaling["link_gbit"] == gbit]
        for system, rows in sub.groupby("system"):
            ax.plot(rows["workers"], 100 * rows["efficiency"], marker="o", label=system)
        ax.set(xscale="log", xlabel="workers", ylabel="scaling efficiency (%)", title=f"{gbit:g} Gbit/s links",
               ylim=(0, 105))
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    for (gbit, general), rows in gap.groupby(["link_gbit", "general"]) if len(gap) else ():
        ax.plot(rows["workers"], rows["ratio"], marker="o", label=f"÷ {general}, {gbit:g} Gbit/s")
    ax.set(xscale="log", yscale="log", xlabel="workers", ylabel="specialised ÷ general-purpose", title="throughput gap")
    ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    if len(gap):
        ax.legend(fontsize=6)
    fig.suptitle("psbench scale model (event simulation, costs measured from the suites' records)")
    fig.tight_layout()
    paths = [out / "projection.png", out / "projection.svg"]
    for path in paths:
        atomic_write(path, lambda tmp, path=path: fig.savefig(tmp, format=path.suffix[1:], dpi=110,
                                                             metadata={"Source": source}))
    plt.close(fig)
    return [p.name for p in paths]
