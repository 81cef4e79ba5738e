"""`psbench compare A B`: two result sets side by side, as asv and pytest-benchmark users compare two
commits or two machines.

A and B are each a suite folder (results/<suite>), a run folder, a results root (every suite in it;
suites are then matched by name too) or a report's file (report.md / report.html: its suite's
records). Runs are matched by their spec without the seed; each match gets, per metric, the ratio
B ÷ A of the means over seeds, a 95% bootstrap interval (scipy.stats.bootstrap, percentile method;
paired by seed when both sides ran the same seeds), and a verdict: 'better' or 'worse' when the
interval excludes 1, else '~' (within noise). With one run a side, samples/s is bootstrapped over
the runs' step intervals instead (repeats within a run: a narrower, within-run notion of noise,
named in the `basis` column); the other metrics then get no interval. With few seeds the
percentile bootstrap is optimistic (3 seeds give 10 distinct resamples): use 5 or more where a
verdict matters, and run A and B close together in time, since drift between them is no noise
either interval can see.
Writes compare.md, compare.csv and compare.png/.svg (the ratios with their intervals) to --out.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from psbench.bench.harness import store
from psbench.bench.harness.results import (INCLUDE_LOST_FLAG, REPORT_OUTPUTS, OnlyLostRuns, SuiteResults, load_suite,
                                            lost_left_out_line)
from psbench.core.atomic import atomic_write_csv, atomic_write_text
from psbench.core.errors import ConfigError
from psbench.core.spec import workload_label

# metric (a run summary field) -> (heading, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "samples_per_s": ("samples/s", True),
    "time_to_target_s": ("time to target (s)", False),
    "final_val_accuracy": ("final val accuracy", True),
}
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 17  # the bootstrap is seeded: one comparison gives one table
NOT_MATCHED = ("seed", "data_dir")  # spec fields that do not tell two configurations apart


@dataclass
class Side:
    """One side of the comparison: its runs (one row per run) and step rows, from one or more suites."""
    name: str
    runs: pd.DataFrame      # run_id, suite, match, seed, the METRICS columns
    steps: pd.DataFrame     # run_id, worker, step, t_wall
    about: dict[str, Any]   # git shas, machines: what the side was measured on
    lost_left_out: int = 0  # its runs that lost a worker, left out by load_suite


# ---- reading a side ----------------------------------------------------------------------------

def load_side(path: Path | str, include_lost: bool = False) -> Side:
    path = Path(path)
    if path.is_file() and path.name in REPORT_OUTPUTS:
        path = path.parent  # a report's records are its suite folder
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist (give a suite folder, a run folder, a results root or a report)")
    only_run = None
    if (path / "manifest.json").is_file():  # one run folder: its suite, that run alone
        only_run, path = path.name, path.parent
    suites, left_out = [], 0
    for suite in [path] if _is_suite(path) else [p for p in sorted(path.iterdir()) if p.is_dir() and _is_suite(p)]:
        try:
            suites.append(load_suite(suite, include_lost))
            left_out += len(suites[-1].lost_left_out)
        except OnlyLostRuns as only_lost:
            if suite == path:
                raise
            left_out += only_lost.n_runs  # a fault experiment's suite in a results root
    if not suites:
        raise ConfigError(f"{path}: no psbench runs (not a suite folder, a run folder or a results root)")
    runs, steps, about = [], [], {"git_sha": set(), "machine": set()}
    for res in suites:
        rows = _runs(res)
        if only_run:  # a run folder is named by its run id
            left_out = int(only_run in res.lost_left_out)
            rows = rows[rows["dir"].map(lambda d: Path(d).name) == only_run]
        runs.append(rows)
        steps.append(res.steps[res.steps["run_id"].isin(rows["run_id"])][["run_id", "worker", "step", "t_wall"]])
        for manifest in res.manifests.values():
            if manifest["run_id"] in set(rows["run_id"]):
                about["git_sha"].add((manifest.get("git_sha") or "?")[:10])
                machine = manifest.get("machine") or {}
                about["machine"].add(f"{machine.get('cores', '?')} cores, {machine.get('platform', '?')}")
    return Side(str(path if not only_run else path / only_run), pd.concat(runs, ignore_index=True),
                pd.concat(steps, ignore_index=True), {k: sorted(v) for k, v in about.items()}, left_out)


def _is_suite(path: Path) -> bool:
    return store.is_suite(path)


def _runs(res: SuiteResults) -> pd.DataFrame:
    rows = []
    for run_id, manifest in res.manifests.items():
        spec = {k: v for k, v in manifest["spec"].items() if k not in NOT_MATCHED}
        rows.append({"run_id": run_id, "suite": res.suite, "match": json.dumps(spec, sort_keys=True, default=str),
                     "label": spec_label(spec), "seed": manifest["spec"].get("seed", 0)})
    frame = pd.DataFrame(rows)
    summary = res.runs.set_index("run_id")
    for metric in METRICS:
        frame[metric] = frame["run_id"].map(summary[metric]) if metric in summary else np.nan
        frame[metric] = pd.to_numeric(frame[metric], errors="coerce")
    frame["dir"] = frame["run_id"].map(summary["dir"])
    return frame


def spec_label(spec: dict[str, Any]) -> str:
    """'ps (consistency=asp) mlp-digits w2 b16': what a match is, in one line."""
    options = ", ".join(f"{k}={v}" for k, v in sorted((spec.get("options") or {}).items()))
    parts = [spec["system"] + (f" ({options})" if options else ""), workload_label(str(spec["workload"])),
             f"w{spec.get('workers', 1)}"]
    for key, short in (("batch_size", "b"), ("epochs", "e"), ("max_steps", "steps "), ("lr", "lr ")):
        if spec.get(key) is not None:
            parts.append(f"{short}{spec[key]}")
    if spec.get("sharding", "random") != "random":
        parts.append(str(spec["sharding"]))
    return " ".join(parts)


# ---- statistics --------------------------------------------------------------------------------

def ratio_interval(a: np.ndarray, b: np.ndarray, paired: bool = False) -> tuple[float, float]:
    """95% bootstrap interval of mean(b) / mean(a) (percentile method; resampling pairs if paired)."""
    from scipy.stats import bootstrap

    def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(y, axis=axis) / np.mean(x, axis=axis)

    if np.all(a == a[0]) and np.all(b == b[0]):  # no spread: the interval is the point
        value = float(b[0] / a[0])
        return value, value
    result = bootstrap((a, b), stat, paired=paired, vectorized=True, n_resamples=RESAMPLES,
                       confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(SEED))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def step_intervals(steps: pd.DataFrame) -> np.ndarray:
    """Seconds between each worker's consecutive steps, over the given runs."""
    ordered = steps.sort_values(["run_id", "worker", "step"])
    return ordered.groupby(["run_id", "worker"])["t_wall"].diff().dropna().to_numpy(dtype=float)


def verdict(low: float | None, high: float | None, higher_is_better: bool) -> str:
    if low is None or high is None or np.isnan(low) or np.isnan(high):
        return "n/a"
    if low > 1:
        return "better" if higher_is_better else "worse"
    if high < 1:
        return "worse" if higher_is_better else "better"
    return "~"


def compare_sides(a: Side, b: Side, by_suite: bool = False) -> tuple[pd.DataFrame, list[str], list[str]]:
    """One row per (match, metric): means, ratio B ÷ A, its interval and basis, verdict. Also the
    labels of configurations only in A and only in B."""
    keys = ["suite", "match"] if by_suite else ["match"]
    groups_a = dict(tuple(a.runs.groupby(keys)))
    groups_b = dict(tuple(b.runs.groupby(keys)))
    rows: list[dict[str, Any]] = []
    for key in sorted(set(groups_a) & set(groups_b), key=str):
        ra, rb = groups_a[key], groups_b[key]
        label = ra["label"].iloc[0] + (f" [{ra['suite'].iloc[0]}]" if by_suite else "")
        for metric, (heading, higher) in METRICS.items():
            rows.append(_metric_row(label, metric, heading, higher, ra, rb, a.steps, b.steps))
    only = lambda x, y: sorted({g["label"].iloc[0] for k, g in x.items() if k not in y})  # noqa: E731
    return pd.DataFrame(rows), only(groups_a, groups_b), only(groups_b, groups_a)


def _metric_row(label: str, metric: str, heading: str, higher: bool, ra: pd.DataFrame, rb: pd.DataFrame,
                steps_a: pd.DataFrame, steps_b: pd.DataFrame) -> dict[str, Any]:
    va, vb = ra[[metric, "seed"]].dropna(), rb[[metric, "seed"]].dropna()
    row: dict[str, Any] = {"configuration": label, "metric": heading, "n A": len(va), "n B": len(vb),
                           "A": va[metric].mean() if len(va) else None, "B": vb[metric].mean() if len(vb) else None,
                           "ratio B/A": None, "low": None, "high": None, "basis": "", "verdict": "n/a"}
    if not len(va) or not len(vb) or va[metric].mean() <= 0:
        row["basis"] = "missing on a side" if not (len(va) and len(vb)) else ""
        return row
    row["ratio B/A"] = vb[metric].mean() / va[metric].mean()
    if len(va) >= 2 and len(vb) >= 2:
        paired = sorted(va["seed"]) == sorted(vb["seed"]) and va["seed"].is_unique
        if paired:
            va, vb = va.sort_values("seed"), vb.sort_values("seed")
        row["low"], row["high"] = ratio_interval(va[metric].to_numpy(float), vb[metric].to_numpy(float), paired)
        row["basis"] = "seeds, paired" if paired else "runs"
    elif metric == "samples_per_s":
        ia = step_intervals(steps_a[steps_a["run_id"].isin(ra["run_id"])])
        ib = step_intervals(steps_b[steps_b["run_id"].isin(rb["run_id"])])
        if len(ia) >= 2 and len(ib) >= 2:
            # Throughput goes as 1 / step time: B's samples/s over A's is mean(A's intervals) / mean(B's).
            low, high = ratio_interval(ib, ia)
            row["low"], row["high"] = low, high
            row["basis"] = f"step intervals ({len(ia)}, {len(ib)})"
        else:
            row["basis"] = "one run a side, too few steps"
    else:
        row["basis"] = "one run a side"
    row["verdict"] = verdict(row["low"], row["high"], higher)
    return row


# ---- output ------------------------------------------------------------------------------------

def format_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "(no configuration in both A and B)"

    def num(v: Any) -> str:
        return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.4g}"

    shown = pd.DataFrame({
        "configuration": table["configuration"], "metric": table["metric"],
        "n A/B": table["n A"].astype(str) + "/" + table["n B"].astype(str),
        "A": table["A"].map(num), "B": table["B"].map(num), "B/A": table["ratio B/A"].map(num),
        "95% interval": [f"[{num(lo)}, {num(hi)}]" if lo is not None and not pd.isna(lo) else "–"
                         for lo, hi in zip(table["low"], table["high"])],
        "basis": table["basis"], "": table["verdict"]})
    return shown.to_string(index=False)


def plot(table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Per metric, each configuration's ratio B/A with its interval; the line at 1 is 'no change'."""
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator

    from psbench.bench.report.plots import facets, save

    table = table.dropna(subset=["ratio B/A"])
    if table.empty:
        return []
    metrics = [heading for heading, _ in METRICS.values() if heading in set(table["metric"])]
    configs = list(dict.fromkeys(table["configuration"]))
    fig, axes = facets(len(metrics), width=5.0, height=0.45 * len(configs) + 1.6)
    colours = {"better": "#2ca02c", "worse": "#d62728", "~": "#4d4d4d", "n/a": "#9e9e9e"}
    for ax, heading in zip(axes, metrics):
        rows = table[table["metric"] == heading].set_index("configuration").reindex(configs)
        for y, (config, r) in enumerate(rows.iterrows()):
            if pd.isna(r["ratio B/A"]):
                continue
            colour = colours[r["verdict"]]
            if r["low"] is not None and not pd.isna(r["low"]):
                # the interval as computed, drawn on its own: a bootstrap percentile interval of a ratio
                # need not contain the ratio of the means (matplotlib's xerr refuses that case)
                ax.plot([r["low"], r["high"]], [y, y], color=colour, marker="|", markersize=9, linewidth=1.2)
            ax.plot([r["ratio B/A"]], [y], "o", color=colour)
        ax.axvline(1.0, color="#888", linestyle="--", linewidth=1)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FormatStrFormatter("%.4g"))
        ax.set_yticks(range(len(configs)))
        ax.set_yticklabels(configs if ax is axes[0] else [""] * len(configs), fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{heading}: B ÷ A", fontsize=9)
    return save(fig, out_dir, "compare")


def render_markdown(a: Side, b: Side, table: pd.DataFrame, only_a: list[str], only_b: list[str]) -> str:
    out = ["# psbench compare", "",
           f"- A: `{a.name}` (git {', '.join(a.about['git_sha'])}; {'; '.join(a.about['machine'])})",
           f"- B: `{b.name}` (git {', '.join(b.about['git_sha'])}; {'; '.join(b.about['machine'])})", "",
           f"Ratios are B ÷ A of the means over seeds, with {CONFIDENCE:.0%} bootstrap intervals; 'better' or "
           "'worse' marks an interval that excludes 1 (a difference beyond noise), '~' one within it. With "
           "few seeds these intervals are optimistic.", "",
           "```", format_table(table), "```", ""]
    lost = lost_lines(a, b)
    out += [f"- {line}." for line in lost] + ([""] if lost else [])
    if only_a or only_b:
        out += ["Not compared (in one side only):", ""]
        out += [f"- only in A: {x}" for x in only_a] + [f"- only in B: {x}" for x in only_b] + [""]
    out += ["![ratios B ÷ A with intervals](compare.png)", ""]
    return "\n".join(out)


# ---- CLI ---------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", type=Path, metavar="A", help="suite folder, run folder, results root or report file (the base)")
    p.add_argument("b", type=Path, metavar="B", help="the same for the other side (ratios are B ÷ A)")
    p.add_argument("--out", type=Path, help="where compare.md/.csv/.png go (default results/compare/<A>-vs-<B>)")
    p.add_argument("--fail-on-worse", action="store_true",
                   help="exit 1 when any metric of B is worse than A beyond noise (for CI)")
    p.add_argument(INCLUDE_LOST_FLAG, dest="include_lost", action="store_true",
                   help="count runs that lost a worker (left out of ratios and intervals by default)")


def lost_lines(a: Side, b: Side) -> list[str]:
    """One line a side that left runs out because they lost a worker."""
    return [line for side, name in ((a, "A"), (b, "B"))
            if (line := lost_left_out_line(side.lost_left_out, f"{name} ({side.name})"))]


def main(args: argparse.Namespace) -> int:
    include_lost = getattr(args, "include_lost", False)
    a, b = load_side(args.a, include_lost), load_side(args.b, include_lost)
    for line in lost_lines(a, b):  # first: it may be why nothing matches
        print(line)
    by_suite = not _is_suite_or_run(Path(args.a)) and not _is_suite_or_run(Path(args.b))  # two results roots
    table, only_a, only_b = compare_sides(a, b, by_suite=by_suite)
    if table.empty:
        raise ConfigError(f"no configuration (run spec without the seed) is in both {a.name} and {b.name}; "
                          f"only in A: {', '.join(only_a[:5]) or 'none'}; only in B: {', '.join(only_b[:5]) or 'none'}")
    out = args.out or Path("results") / "compare" / f"{_short(args.a)}-vs-{_short(args.b)}"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out / "compare.csv", table)
    plot(table, out)
    atomic_write_text(out / "compare.md", render_markdown(a, b, table, only_a, only_b))
    print(format_table(table))
    for label in only_a:
        print(f"only in A: {label}")
    for label in only_b:
        print(f"only in B: {label}")
    print(f"wrote {out / 'compare.md'}, compare.csv, compare.png")
    worse = table[table["verdict"] == "worse"]
    if args.fail_on_worse and len(worse):
        print(f"psbench compare: B is worse beyond noise in {len(worse)} metric(s)")
        return 1
    return 0


def _is_suite_or_run(path: Path) -> bool:
    path = path.parent if path.is_file() else path
    return (path / "manifest.json").is_file() or (path.is_dir() and _is_suite(path))


def _short(path: Path) -> str:
    path = Path(path).resolve()
    name = path.parent.name if path.is_file() else path.name
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
