"""Thesis-style plots of one suite (PNG + SVG under results/<suite>/plots/).

Every plot function takes a SuiteResults and the plots folder, draws only when the suite holds
the data it needs, and returns the files it wrote ([] when it drew nothing). One colour per
system in every plot (PALETTE); variants of a system (e.g. 'ps (asp)' vs 'ps (bsp)') share the
colour and differ in line style and marker.
"""
from __future__ import annotations

import json
import math
import textwrap
import zlib
from pathlib import Path
from typing import Callable, Iterator

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from psbench.core.atomic import atomic_write  # noqa: E402
from psbench.core.records import HOST_GPU_COPIES, STEP_TIME_COLUMNS  # noqa: E402
from psbench import systems  # noqa: E402
from psbench.bench.harness.results import SuiteResults  # noqa: E402
from psbench.bench.report.sharding import SHARDING_METRICS, sharding_runs, strategy_order  # noqa: E402
from psbench.bench.report.measures import annotate, fall_ratio, run_step_means, time_breakdown as run_breakdowns  # noqa: E402

plt.rcParams.update({"svg.hashsalt": "psbench", "figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3,
                     "axes.spines.top": False, "axes.spines.right": False, "legend.fontsize": 8})

PALETTE: dict[str, str] = systems.by_name("colour")  # every system's fixed colour (the registry's)
FALLBACK_COLOURS = ["#17becf", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
                    "#e6550d", "#31a354"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def system_colour(system: str) -> str:
    """The fixed colour of a system; unknown names get a stable colour from a hash of the name."""
    if system in PALETTE:
        return PALETTE[system]
    return FALLBACK_COLOURS[zlib.crc32(system.encode()) % len(FALLBACK_COLOURS)]


class Styles:
    """Colour by system, line style and marker by variant: the same label looks alike in every plot."""

    def __init__(self, runs: pd.DataFrame):
        self.system_of = dict(zip(runs["label"], runs["system"]))
        self.variant: dict[str, int] = {}
        for system, group in runs.groupby("system"):
            for i, label in enumerate(sorted(group["label"].unique())):
                self.variant[label] = i

    def __call__(self, label: str, sub: int = 0) -> dict:
        """`sub` numbers the series of one label (other workers or batch sizes): hollow markers."""
        i = self.variant.get(label, 0)
        style = {"color": system_colour(self.system_of.get(label, label)),
                 "linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)]}
        if sub:
            style.update(markerfacecolor="white", linewidth=1.0 + 0.6 * (sub % 2))
        return style


# ---- helpers -----------------------------------------------------------------------------

DIM_FORMAT: dict[str, Callable[[object], str]] = {
    "workers": lambda v: f"{v} worker{'s' if v != 1 else ''}",
    "batch_size": lambda v: f"b={v}",
    "sharding": str,
    "workload": str,
    "conditions": str,
}


def series(df: pd.DataFrame, dims: list[str]) -> Iterator[tuple[str, str, pd.DataFrame, int]]:
    """Split runs into plotted series: one per label and per value of each of `dims` that varies
    within df; the name names only what varies. Yields (name, label, rows, k), k numbering the
    series of one label."""
    varying = [d for d in dims if d in df.columns and df[d].nunique() > 1]
    sub: dict[str, int] = {}
    for key, rows in df.groupby(["label"] + varying, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        extra = [DIM_FORMAT.get(d, str)(v) for d, v in zip(varying, key[1:])]
        k = sub[key[0]] = sub.get(key[0], -1) + 1
        yield (key[0] + (f", {', '.join(extra)}" if extra else "")), key[0], rows, k


def facets(n: int, width: float = 6.0, height: float = 4.2, cols: int = 3) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, cols)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def save(fig: plt.Figure, out_dir: Path, name: str) -> list[Path]:
    out_dir = Path(out_dir)
    paths = []
    fig.tight_layout()
    _place_legends(fig)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    atomic_write(png, lambda tmp: _save_png(fig, tmp))
    atomic_write(svg, lambda tmp: fig.savefig(tmp, format="svg", bbox_inches="tight", metadata={"Date": None}))
    plt.close(fig)
    return [png, svg]


PNG_COLOURS = 256  # a plot's flat colours and their anti-aliased edges; a third of an RGBA PNG's bytes


def _save_png(fig: plt.Figure, path: Path) -> None:
    """The figure as a palette PNG: median-cut colours, no dithering (which would speckle flat areas)."""
    import io

    from PIL import Image

    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=110, bbox_inches="tight")
    drawn.seek(0)
    with Image.open(drawn) as image:
        image.convert("RGB").quantize(PNG_COLOURS, dither=Image.Dither.NONE).save(path, format="PNG", optimize=True)


def legend(ax: plt.Axes, **kwargs) -> None:
    """Mark an axes for a legend; `save` places them once the figure is complete."""
    ax.figure._psbench_legend = kwargs  # type: ignore[attr-defined]
    ax._psbench_legend = True  # type: ignore[attr-defined]


def _place_legends(fig: plt.Figure) -> None:
    """One panel: its own legend, beside it when long. Several panels: one legend for the figure,
    beside them (the series are the same systems in every panel)."""
    kwargs = getattr(fig, "_psbench_legend", {})
    marked = [ax for ax in fig.axes if getattr(ax, "_psbench_legend", False)]
    if len(marked) == 1:
        ax = marked[0]
        n = len(ax.get_legend_handles_labels()[0])
        if n > 5:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), **kwargs)
        elif n:
            ax.legend(**kwargs)
    elif marked:
        seen: dict[str, object] = {}
        for ax in marked:
            for handle, text in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(text, handle)
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.95), **kwargs)


def log2_x(ax: plt.Axes, ticks) -> None:
    """Log-2 x axis labelled with the plain values (workers, batch sizes)."""
    ticks = sorted(int(t) for t in ticks)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def one_sharding(runs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Throughput and convergence plots compare systems, not shardings: when a suite varies the
    sharding, keep random (the baseline) or else the most common strategy, and say so."""
    if runs.empty or runs["sharding"].nunique() < 2:
        return runs, ""
    keep = "random" if (runs["sharding"] == "random").any() else runs["sharding"].mode().iloc[0]
    return runs[runs["sharding"] == keep], f", {keep} sharding"


def first_seed(runs: pd.DataFrame) -> pd.DataFrame:
    return runs.sort_values("seed").groupby(
        ["label", "workload", "workers", "batch_size", "sharding", "conditions"], sort=False).head(1)


def throughput_column(runs: pd.DataFrame) -> str:
    """Throughput after warm-up (measures.WARMUP_RULE) where the step rows give it, else whole-run."""
    steady = "steady_samples_per_s"
    return steady if steady in runs.columns and runs[steady].notna().any() else "samples_per_s"


def _val_curves(res: SuiteResults, run_ids) -> pd.DataFrame:
    val = res.evals[(res.evals["split"] == "val") & (res.evals["run_id"].isin(list(run_ids)))]
    return val.sort_values(["run_id", "t_wall"])


def _suite_title(res: SuiteResults, text: str) -> str:
    return f"{text} — suite '{res.suite}'"


def facet_figure(res: SuiteResults, out_dir: Path, name: str, title: str, panels: list,
                 draw: Callable[[plt.Axes, object, Styles], None], **size) -> list[Path]:
    """The skeleton of every plot: one panel per item of `panels`, drawn by draw(ax, panel, style),
    the suite's title above, saved as `name` (png + svg). `size`: facets' width/height/cols."""
    style = Styles(res.runs)
    fig, axes = facets(len(panels), **size)
    for ax, panel in zip(axes, panels):
        draw(ax, panel, style)
    fig.suptitle(_suite_title(res, title))
    return save(fig, out_dir, name)


# ---- the plots ---------------------------------------------------------------------------

def throughput_vs_workers(res: SuiteResults, out_dir: Path) -> list[Path]:
    value = throughput_column(res.runs)
    runs, note = one_sharding(res.runs.dropna(subset=[value]))
    if runs.empty or runs["workers"].nunique() < 2:
        return []

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        for name, label, rows, k in series(runs[runs["workload"] == workload], ["batch_size", "sharding", "conditions"]):
            agg = rows.groupby("workers")[value].agg(["mean", "std"]).reset_index()
            ax.errorbar(agg["workers"], agg["mean"], yerr=agg["std"].fillna(0), capsize=3, label=name, **style(label, k))
        log2_x(ax, runs["workers"].unique())
        ax.set(title=workload, xlabel="workers (processes)", ylabel="throughput (samples/s)")
        legend(ax)

    return facet_figure(res, out_dir, "throughput_vs_workers", f"Throughput vs workers (mean ± sd over seeds{note})",
                        sorted(runs["workload"].unique()), draw)


def ps_vs_peers(res: SuiteResults, out_dir: Path) -> list[Path]:
    """Our PS and the peer parameter servers (ray-ps, rpc-ps): samples/s against workers, one panel
    per workload and consistency."""
    runs = res.runs[res.runs["system"].isin(["ps", "ray-ps", "rpc-ps"])].dropna(subset=["samples_per_s"])
    if not runs["system"].isin(["ray-ps", "rpc-ps"]).any():
        return []
    runs = runs.assign(consistency=runs.get("opt_consistency", pd.Series("asp", index=runs.index)).fillna("asp"))
    panels = sorted(runs.groupby(["workload", "consistency"]).groups)

    def draw(ax: plt.Axes, panel: tuple[str, str], style: Styles) -> None:
        rows_p = runs[(runs["workload"] == panel[0]) & (runs["consistency"] == panel[1])]
        for label, rows in rows_p.groupby("label"):
            agg = rows.groupby("workers")["samples_per_s"].agg(["mean", "std"]).reset_index()
            ax.errorbar(agg["workers"], agg["mean"], yerr=agg["std"].fillna(0), capsize=3, label=label,
                        **style(label))
        log2_x(ax, rows_p["workers"].unique())
        ax.set(title=f"{panel[0]}, {panel[1]}", xlabel="workers (processes)", ylabel="throughput (samples/s)")
        legend(ax)

    return facet_figure(res, out_dir, "ps_vs_peers", "Our PS vs peer parameter servers (mean ± sd over seeds)",
                        panels, draw)


def step_time_vs_batch(res: SuiteResults, out_dir: Path) -> list[Path]:
    """Per-mini-batch time vs batch size, log-log: the shape of Kassela et al. 2019's figure."""
    runs, note = one_sharding(res.runs.dropna(subset=["median_step_s"]))
    if runs.empty or runs.groupby("label")["batch_size"].nunique().max() < 2:
        return []

    means = run_step_means(res)

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        for name, label, rows, k in series(runs[runs["workload"] == workload], ["workers", "sharding", "conditions"]):
            agg = rows.groupby("batch_size")["median_step_s"].median().reset_index()
            if len(agg) < 2:
                continue
            reduction = fall_ratio(rows, means).estimate  # the report table's definition (FALL_RULE)
            ax.plot(agg["batch_size"], agg["median_step_s"] * 1000, label=_with_ratio(name, reduction, ".2f"),
                    **style(label, k))
        log2_x(ax, runs["batch_size"].unique())
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # decades only: labels stay legible
        ax.set(title=workload, xlabel="mini-batch size per worker (examples)", ylabel="time per mini-batch (ms)")
        legend(ax, title="system (cost at largest ÷ smallest batch)")

    return facet_figure(res, out_dir, "step_time_vs_batch",
                        f"Per-mini-batch time vs batch size (log-log{note}; cf. Kassela et al. 2019)",
                        sorted(runs["workload"].unique()), draw)


def _with_ratio(name: str, ratio: float, spec: str) -> str:
    """A legend entry with its fall ratio; no ratio where no seed ran both ends."""
    return f"{name} ({ratio:{spec}}x)" if math.isfinite(ratio) else f"{name} (no seed at both ends)"


def step_time_vs_fraction(res: SuiteResults, out_dir: Path) -> list[Path]:
    """Per-mini-batch time vs the mini-batch as a fraction of the data, log-log (Kassela et al. 2019
    vary MLlib's miniBatchFraction); a system's legend gives its fall ratio (largest ÷ smallest)."""
    from psbench.bench.report.measures import batch_fractions

    means = run_step_means(res)
    runs = res.runs.dropna(subset=["median_step_s"]).copy()
    runs["fraction"] = runs["run_id"].map(batch_fractions(res))
    runs = runs.dropna(subset=["fraction"])
    if runs.empty or runs.groupby("label")["fraction"].nunique().max() < 2:
        return []

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        for name, label, rows, k in series(runs[runs["workload"] == workload], ["workers"]):
            agg = rows.groupby("fraction")["median_step_s"].median().reset_index()
            if len(agg) < 2:
                ax.plot(agg["fraction"] * 100, agg["median_step_s"] * 1000, label=f"{name} (one size)",
                        **style(label, k))
                continue
            fall = fall_ratio(rows, means).estimate  # the report table's definition (FALL_RULE)
            ax.plot(agg["fraction"] * 100, agg["median_step_s"] * 1000, label=_with_ratio(name, fall, ".3g"),
                    **style(label, k))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(title=workload, xlabel="mini-batch (% of the training rows)", ylabel="time per mini-batch (ms)")
        legend(ax, title="system (largest ÷ smallest)")

    return facet_figure(res, out_dir, "step_time_vs_fraction",
                        "Per-mini-batch time vs mini-batch fraction (log-log; cf. Kassela et al. 2019)",
                        sorted(runs["workload"].unique()), draw)


def time_to_accuracy(res: SuiteResults, out_dir: Path) -> list[Path]:
    runs, note = one_sharding(res.runs)
    runs = first_seed(runs)
    val = _val_curves(res, runs["run_id"])
    if val.empty:
        return []

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        rows_w = runs[runs["workload"] == workload]
        for name, label, rows, k in series(rows_w, ["workers", "batch_size", "sharding", "conditions"]):
            run_id = rows["run_id"].iloc[0]
            curve = val[val["run_id"] == run_id]
            ax.plot(curve["t_wall"], curve["accuracy"], label=name, markevery=max(1, len(curve) // 8),
                    markersize=4, **style(label, k))
        _target_line(ax, rows_w)
        ax.set(title=workload, xlabel="training wall time (s)", ylabel="validation accuracy")
        legend(ax)

    return facet_figure(res, out_dir, "time_to_accuracy", f"Time to accuracy (first seed of each configuration{note})",
                        sorted(runs[runs["run_id"].isin(val["run_id"])]["workload"].unique()), draw)


def _target_line(ax: plt.Axes, runs: pd.DataFrame) -> None:
    target = runs["target_accuracy"].dropna()
    if len(target):
        ax.axhline(target.iloc[0], color="black", linewidth=0.8, linestyle=(0, (4, 4)),
                   label=f"target {target.iloc[0]:.2f}")


def baseline_runs(runs: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The runs a configuration's speed-up is measured against: the `single` system on the same
    workload, batch size and conditions, or else the variant's own 1-worker runs."""
    alike = (runs["workload"] == row["workload"]) & (runs["batch_size"] == row["batch_size"]) & \
        (runs["conditions"] == row["conditions"])
    single = runs[alike & (runs["system"] == "single")]
    if len(single):
        return single
    return runs[alike & (runs["label"] == row["label"]) & (runs["sharding"] == row["sharding"]) & (runs["workers"] == 1)]


def scaling_table(runs: pd.DataFrame, value: str | None = None) -> pd.DataFrame:
    """Mean throughput (`value`, by default throughput_column) per (workload, label, batch,
    sharding, conditions, workers) with speed-up and scaling efficiency against baseline_runs.
    Efficiency = samples/s at N / (N * single samples/s)."""
    value = value or throughput_column(runs)
    runs = runs.dropna(subset=[value])
    keys = ["workload", "label", "system", "batch_size", "sharding", "conditions", "workers"]
    agg = runs.groupby(keys, dropna=False)[value].mean().rename("samples_per_s").reset_index()

    def base(row: pd.Series) -> float:
        rows = baseline_runs(runs, row)
        return float(rows[value].mean()) if len(rows) else np.nan

    agg["baseline_samples_per_s"] = agg.apply(base, axis=1) if len(agg) else []
    agg["speedup"] = agg["samples_per_s"] / agg["baseline_samples_per_s"]
    agg["efficiency"] = agg["speedup"] / agg["workers"]
    return agg


def scaling_efficiency(res: SuiteResults, out_dir: Path) -> list[Path]:
    runs, note = one_sharding(res.runs)
    table = scaling_table(runs)
    table = table[(table["system"] != "single") & table["efficiency"].notna()]
    # A scaling curve needs two worker counts at least: a design at one count (the kassela suite's 2
    # workers) answers no scaling question, and its points would stack over one x.
    if table.empty or (table["workers"] > 1).sum() == 0 or table["workers"].nunique() < 2:
        return []

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        for name, label, rows, k in series(table[table["workload"] == workload], ["batch_size", "sharding", "conditions"]):
            rows = rows.sort_values("workers")
            ax.plot(rows["workers"], rows["efficiency"], label=name, **style(label, k))
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=(0, (4, 4)), label="ideal (linear)")
        log2_x(ax, table["workers"].unique())
        ax.set_ylim(bottom=0)
        ax.set(title=workload, xlabel="workers (processes)", ylabel="scaling efficiency (samples/s ÷ (N × single))")
        legend(ax)

    return facet_figure(res, out_dir, "scaling_efficiency",
                        f"Scaling efficiency{note.replace(', ', ' (', 1) + ')' if note else ''}",
                        sorted(table["workload"].unique()), draw)


def staleness_hist(res: SuiteResults, out_dir: Path) -> list[Path]:
    steps = res.steps.dropna(subset=["staleness"])
    if steps.empty:
        return []
    steps = steps.drop(columns=["system", "workload"]).merge(
        res.runs[["run_id", "label", "workers", "workload", "batch_size", "sharding", "conditions"]], on="run_id")

    def draw(ax: plt.Axes, group: tuple, style: Styles) -> None:
        name, label, rows, _ = group
        values = rows["staleness"].astype(int).to_numpy()
        levels, counts = np.unique(values, return_counts=True)
        ax.bar(levels, counts / counts.sum(), color=style(label)["color"], width=0.85)
        ax.set_xlim(min(0, int(steps["staleness"].min())) - 0.6,  # one x range: panels compare
                    max(3, int(steps["staleness"].max())) + 0.6)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set(title=f"{name}\nmean {values.mean():.2f}, p95 {np.percentile(values, 95):.0f}, max {values.max()}",
               xlabel="staleness (server versions behind)", ylabel="fraction of updates")

    return facet_figure(res, out_dir, "staleness_hist", "Staleness of applied updates (pooled over workers and seeds)",
                        list(series(steps, ["workload", "workers", "conditions"])), draw, width=4.8, height=3.6)


def strategy_switch(res: SuiteResults, out_dir: Path) -> list[Path]:
    switches = res.events[res.events["kind"] == "switch"]
    if switches.empty:
        return []
    switch_runs = res.runs[res.runs["run_id"].isin(switches["run_id"])]
    alike = ["workload", "workers", "batch_size", "sharding"]  # compare with runs set up alike
    setups = switch_runs[alike].drop_duplicates()

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        rows_w = first_seed(res.runs.merge(setups[setups["workload"] == workload], on=alike))
        val = _val_curves(res, rows_w["run_id"])
        for name, label, rows, k in series(rows_w, ["workers", "batch_size", "sharding", "conditions"]):
            run_id = rows["run_id"].iloc[0]
            curve = val[val["run_id"] == run_id]
            st = style(label, k)
            ax.plot(curve["t_wall"], curve["accuracy"], label=name, markevery=max(1, len(curve) // 8),
                    markersize=4, **st)
            for _, ev in switches[switches["run_id"] == run_id].iterrows():
                acc = np.interp(ev["t_wall"], curve["t_wall"], curve["accuracy"]) if len(curve) else np.nan
                ax.axvline(ev["t_wall"], color=st["color"], linewidth=1, linestyle=(0, (2, 2)))
                ax.plot([ev["t_wall"]], [acc], marker="*", markersize=14, color=st["color"],
                        markeredgecolor="black", linestyle="none")
                ax.annotate(_switch_text(ev), (ev["t_wall"], acc), textcoords="offset points", xytext=(6, -14),
                            fontsize=8)
        _target_line(ax, rows_w)
        ax.set(title=workload, xlabel="training wall time (s)", ylabel="validation accuracy")
        legend(ax)

    return facet_figure(res, out_dir, "strategy_switch", "Strategy-Switch: sync → async (★ = switch)",
                        sorted(switch_runs["workload"].unique()), draw, width=7.0, height=4.6)


HANDOVER_WINDOW = (-30, 60)  # steps around the switch the hand-over plot shows


def handover_loss(res: SuiteResults, out_dir: Path) -> list[Path]:
    """The training loss around each hand-over: per switch configuration, the mean over workers of
    each step's mini-batch loss against steps since the switch (one thin line a seed, the median
    bold), with the spike threshold (systems/switch/adapter.py) as a dashed line."""
    switches = res.events[res.events["kind"] == "switch"]
    if switches.empty:
        return []
    at = switches.set_index("run_id")["step"].astype(float)
    steps = res.steps[res.steps["run_id"].isin(at.index)]
    steps = steps.assign(rel=steps["step"] - steps["run_id"].map(at))
    steps = steps[steps["rel"].between(*HANDOVER_WINDOW)]
    runs = res.runs[res.runs["run_id"].isin(at.index)]

    def draw(ax: plt.Axes, workload: str, style: Styles) -> None:
        for name, label, rows, k in series(runs[runs["workload"] == workload], ["workers", "batch_size", "conditions"]):
            st = style(label, k)
            curves = steps[steps["run_id"].isin(rows["run_id"])].groupby(["run_id", "rel"])["loss"].mean()
            for run_id in rows["run_id"]:
                if run_id in curves.index.get_level_values(0):
                    one = curves.loc[run_id]
                    ax.plot(one.index, one.values, color=st["color"], linewidth=0.6, alpha=0.35)
            median = curves.groupby(level="rel").median()
            ax.plot(median.index, median.values, label=name, color=st["color"], linewidth=2)
        ax.axvline(0, color="black", linewidth=1, linestyle=(0, (2, 2)))
        ax.set(title=workload, xlabel="steps since the switch", ylabel="training loss (mean over workers)")
        ax.set_yscale("log")
        legend(ax)

    return facet_figure(res, out_dir, "handover_loss", "Training loss around the hand-over (sync → async)",
                        sorted(runs["workload"].unique()), draw, width=6.5, height=4.2)


def switch_map(res: SuiteResults, out_dir: Path) -> list[Path]:
    """The regime map: per workload, the speed-up to target over the fastest sync system (log colour)
    of the best switch variant and of pure ASP, across worker counts (x) and straggler conditions
    (y), each cell annotated with the speed-up and the accuracy difference (pp). Drawn when the
    suite spans more than one cell."""
    from psbench.bench.report.switching import switch_comparisons

    found = switch_comparisons(res)
    frame = pd.DataFrame([{"workload": c.workload, "workers": c.workers, "conditions": c.conditions,
                           "who": "switch (best variant)" if c.never_switched != "–" else "pure ASP",
                           "speedup": c.speedup.estimate, "acc": c.accuracy_pp.estimate,
                           "acted": c.switched or c.never_switched == "–"} for c in found])
    if frame.empty or len(frame[["workers", "conditions"]].drop_duplicates()) < 2:
        return []
    frame = frame[frame["acted"]]
    best = frame.sort_values("speedup", ascending=False).drop_duplicates(["workload", "workers", "conditions", "who"])
    panels = sorted(best.groupby(["workload", "who"]).groups)

    def draw(ax: plt.Axes, panel: tuple[str, str], style: Styles) -> None:
        cells = best[(best["workload"] == panel[0]) & (best["who"] == panel[1])]
        xs, ys = sorted(cells["workers"].unique()), sorted(cells["conditions"].unique())
        grid = np.full((len(ys), len(xs)), np.nan)
        for _, c in cells.iterrows():
            grid[ys.index(c["conditions"]), xs.index(c["workers"])] = np.log2(c["speedup"])
        image = ax.imshow(grid, cmap="RdBu", vmin=-2, vmax=2, aspect="auto")
        for _, c in cells.iterrows():
            ax.text(xs.index(c["workers"]), ys.index(c["conditions"]), f"{c['speedup']:.2f}x\n{c['acc']:+.1f} pp",
                    ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        # wrapped: a conditions label ('device ..., stragglers ...') would run into the next panel
        ax.set_yticks(range(len(ys)), [textwrap.fill(y, 24) for y in ys], fontsize=7)
        ax.set(title=f"{panel[0]}: {panel[1]}", xlabel="workers")
        plt.colorbar(image, ax=ax, label="log2 speed-up to target vs fastest sync")

    return facet_figure(res, out_dir, "switch_map", "Where switching pays: speed-up to target over the fastest "
                        "sync system (blue: faster), accuracy difference in pp", panels, draw, width=6.5, height=4.2)


def _switch_text(event: pd.Series) -> str:
    try:
        detail = json.loads(event["detail"]) if isinstance(event["detail"], str) else {}
    except json.JSONDecodeError:
        detail = {}
    rule = detail.get("criterion") or detail.get("rule") or detail.get("reason")
    step = f" @ step {int(event['step'])}" if pd.notna(event.get("step")) else ""
    return f"switch{step}" + (f" ({rule})" if rule else "")


def sharding_variance(res: SuiteResults, out_dir: Path) -> list[Path]:
    runs = sharding_runs(res.runs)
    metrics = [(m, t) for m, t in SHARDING_METRICS if m in runs.columns and runs[m].notna().any()]
    if runs.empty or not metrics:
        return []
    strategies = strategy_order(runs["sharding"].unique())
    groups = list(series(runs, ["workload", "workers", "batch_size", "conditions"]))
    width = 0.8 / len(groups)

    def draw(ax: plt.Axes, panel: tuple[str, str], style: Styles) -> None:
        metric, title = panel
        for g, (name, label, rows, _) in enumerate(groups):
            data = [rows.loc[rows["sharding"] == s, metric].dropna().to_numpy() for s in strategies]
            positions = [i + (g - (len(groups) - 1) / 2) * width for i in range(len(strategies))]
            keep = [(d, p) for d, p in zip(data, positions) if len(d)]
            if not keep:
                continue
            colour = style(label)["color"]
            ax.boxplot([d for d, _ in keep], positions=[p for _, p in keep], widths=width * 0.8, patch_artist=True,
                       boxprops={"facecolor": colour, "alpha": 0.45, "edgecolor": colour},
                       medianprops={"color": "black"}, whiskerprops={"color": colour}, capprops={"color": colour},
                       flierprops={"markeredgecolor": colour})
            for d, p in keep:  # the seeds themselves: 5 points say more than a box alone
                ax.scatter(np.full(len(d), p), d, s=10, color=colour, zorder=3)
            ax.plot([], [], color=colour, linewidth=6, alpha=0.45, label=name)
        ax.set_xticks(range(len(strategies)), strategies, rotation=15)
        unit = "accuracy (fraction)" if "accuracy" in metric else "loss (cross-entropy)"
        ax.set(title=title, xlabel="sharding strategy", ylabel=unit)
        legend(ax)

    return facet_figure(res, out_dir, "sharding_variance", "Sharding variability over seeds (cf. Provatas et al. 2021)",
                        metrics, draw, width=5.5, height=4.0, cols=2)


def shard_class_counts(res: SuiteResults, out_dir: Path) -> list[Path]:
    counts = res.shard_counts.merge(res.runs[["run_id", "workload", "workers", "sharding"]], on="run_id")
    counts = counts[counts["workers"] >= 2]
    if counts.empty:
        return []
    panels = [(w, s) for w in sorted(counts["workload"].unique())
              for s in strategy_order(counts[counts["workload"] == w]["sharding"].unique())]

    def draw(ax: plt.Axes, panel: tuple[str, str], _style: Styles) -> None:
        workload, strategy = panel
        rows = counts[(counts["workload"] == workload) & (counts["sharding"] == strategy)]
        classes = sorted(rows["class"].unique())
        data = [rows.loc[rows["class"] == c, "count"].to_numpy() for c in classes]
        ax.boxplot(data, positions=range(len(classes)), widths=0.6, patch_artist=True,
                   boxprops={"facecolor": "#9ecae1"}, medianprops={"color": "black"})
        ax.set_xticks(range(len(classes)), [str(c) for c in classes])
        n_workers = sorted(rows["workers"].unique())
        ax.set(title=f"{workload}: {strategy} ({'/'.join(map(str, n_workers))} workers)",
               xlabel="class", ylabel="examples per worker")

    return facet_figure(res, out_dir, "shard_class_counts",
                        "Per-class examples per worker shard (spread over workers and seeds)",
                        panels, draw, width=5.0, height=3.6)


BREAKDOWN_PARTS = {"compute_s": ("compute (real)", "#4c72b0"), "emulated_s": ("emulated device / straggler", "#a6cee3"),
                   "comm_s": ("communication", "#dd8452"), "wait_s": ("waiting on others", "#c44e52"),
                   "update_s": ("update (optimizer step)", "#55a868"),
                   "data_s": ("batch assembly", "#8c8c8c"), "h2d_d2h_s": ("host-GPU copies", "#937860")}


def breakdown_groups(res: SuiteResults) -> pd.DataFrame:
    """Runs with a per-step time breakdown (measures.time_breakdown) and the keys to group them by."""
    per_run = run_breakdowns(res)
    # the copies' column is 0 on cpu for every system: only copies made tell a breakdown
    told = [c for c in STEP_TIME_COLUMNS if c != HOST_GPU_COPIES]
    per_run = per_run[per_run[told].notna().any(axis=1) | (per_run[HOST_GPU_COPIES] > 0)]
    keys = ["run_id", "workload", "label", "system", "workers", "batch_size", "sharding", "conditions"]
    keys += [k for k in ("allreduce_alone_s",) if k in res.runs]
    return res.runs[keys].merge(per_run, on="run_id")


def time_breakdown(res: SuiteResults, out_dir: Path) -> list[Path]:
    """Stacked bars: the median seconds per step of each part, per system and worker count, after
    warm-up (median over steps of each run, then over its seeds); ◆ marks the median step time."""
    runs = breakdown_groups(res)
    if runs.empty:
        return []
    panels = sorted(runs[["workload", "conditions"]].drop_duplicates().itertuples(index=False, name=None))
    parts = {p: v for p, v in BREAKDOWN_PARTS.items() if runs[p].notna().any()  # parts some system tells
             and (p != HOST_GPU_COPIES or (runs[p] > 0).any())}  # copies: only where a run copied (a GPU)

    def draw(ax: plt.Axes, panel: tuple[str, str], style: Styles) -> None:
        rows_p = runs[(runs["workload"] == panel[0]) & (runs["conditions"] == panel[1])]
        names, medians = [], []
        for name, label, rows, _ in series(rows_p, ["batch_size", "sharding"]):
            for workers, rows_w in rows.groupby("workers"):
                names.append((f"{name}\n{workers} w", label))
                medians.append(rows_w[STEP_TIME_COLUMNS + ["step_s"]].apply(lambda c: c.dropna().median()
                                                                            if c.notna().any() else np.nan))
        x = np.arange(len(names))
        bottom = np.zeros(len(names))
        for part, (text, colour) in parts.items():
            heights = np.array([m[part] for m in medians], dtype=float) * 1000
            heights = np.nan_to_num(heights)  # a part the system cannot tell draws as 0 (see the table)
            ax.bar(x, heights, bottom=bottom, color=colour, width=0.7, label=text, edgecolor="white", linewidth=0.5)
            bottom += heights
        ax.plot(x, [m["step_s"] * 1000 for m in medians], linestyle="none", marker="D", color="black",
                markersize=5, label="median step time")
        ax.set_xticks(x, [n for n, _ in names], rotation=30, ha="right", fontsize=8)
        top = np.nanmax([bottom.max(), *(m["step_s"] * 1000 for m in medians)])
        ax.set_ylim(0, top * 1.45)  # headroom: the legend sits above the bars
        for tick, (_, label) in zip(ax.get_xticklabels(), names):
            tick.set_color(style(label)["color"])
        title = panel[0] if panel[1] == "native" else f"{panel[0]} ({panel[1]})"
        ax.set(title=title, ylabel="time per step (ms, median)")
        legend(ax)

    bars = runs.drop_duplicates(["workload", "conditions", "label", "batch_size", "sharding", "workers"])
    width = max(5.0, 2.0 + 0.6 * bars.groupby(["workload", "conditions"]).size().max())
    return facet_figure(res, out_dir, "time_breakdown", "Per-step time breakdown (median per step, after warm-up)",
                        panels, draw, width=width, height=4.6)


PLOTS: dict[str, Callable[[SuiteResults, Path], list[Path]]] = {
    "throughput_vs_workers": throughput_vs_workers,
    "ps_vs_peers": ps_vs_peers,
    "step_time_vs_batch": step_time_vs_batch,
    "step_time_vs_fraction": step_time_vs_fraction,
    "time_to_accuracy": time_to_accuracy,
    "scaling_efficiency": scaling_efficiency,
    "staleness_hist": staleness_hist,
    "strategy_switch": strategy_switch,
    "handover_loss": handover_loss,
    "switch_map": switch_map,
    "sharding_variance": sharding_variance,
    "shard_class_counts": shard_class_counts,
    "time_breakdown": time_breakdown,
}


def draw_all(res: SuiteResults, out_dir: Path | None = None) -> dict[str, list[Path]]:
    """Draw every plot the suite has data for; returns name -> files written."""
    out_dir = Path(out_dir) if out_dir else res.path / "plots"
    res = annotate(res)  # throughput after warm-up, for the throughput and scaling plots
    drawn = {}
    for name, plot in PLOTS.items():
        paths = plot(res, out_dir)
        if paths:
            drawn[name] = paths
    return drawn
