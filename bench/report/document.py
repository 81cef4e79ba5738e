"""`psbench report RESULTS/SUITE [...]`: tables + plots of a suite as report.md and report.html.

The report is composed once as a list of blocks (heading, paragraph, table, image) and rendered
twice: Markdown (images linked from plots/) and self-contained HTML (images inlined as base64).
Where the suite holds the data for one of the thesis' claims, its figure stands beside ours.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from psbench.core.atomic import atomic_write_text
from psbench.bench.report.plots import (SHARDING_GROUP, SHARDING_METRICS, _strategy_order, draw_all, scaling_table,
                         sharding_runs)
from psbench.bench.harness.results import SuiteResults, load_suite

PLOT_CAPTIONS = {
    "throughput_vs_workers": "Throughput (training samples per second, all workers together) against the number of workers.",
    "ps_vs_peers": "Samples/s of our parameter server (ps) and the peer parameter servers on Ray (ray-ps) and "
                   "torch.distributed.rpc (rpc-ps) against the number of workers.",
    "step_time_vs_batch": "Time per mini-batch against mini-batch size, log-log. Kassela et al. (2019): the PS's "
                          "per-mini-batch cost fell up to 14x as batches shrank, Spark MLlib's at most 1.36x.",
    "time_to_accuracy": "Validation accuracy against training wall time (evaluation time excluded).",
    "scaling_efficiency": "Samples/s at N workers divided by N times the single-process samples/s (1 = linear).",
    "staleness_hist": "How many server versions behind each applied update was (0 = fresh).",
    "strategy_switch": "Validation accuracy against time; the star marks where Strategy-Switch moved from "
                       "synchronous all-reduce to asynchronous PS training.",
    "sharding_variance": "Final training/validation loss and accuracy over seeds, per sharding strategy "
                         "(dots are individual seeds).",
    "shard_class_counts": "Examples of each class per worker shard: a tight box means every worker sees the "
                          "global class mix.",
}

THESIS = {
    "kassela": "PS per-mini-batch cost fell up to 14x as batches shrank; Spark MLlib's at most 1.36x "
               "(Kassela et al., IEEE BigData 2019)",
    "sharding": "variance of final metrics, random ÷ strategy: distribution-aware up to ~8x (training) and ~2x "
                "(validation); stratified up to ~6x (validation); means barely move (Provatas et al., BigData 2021)",
    "switch": "accuracy comparable to synchronous all-reduce while training much faster "
              "(Provatas et al., IEEE Access 2025)",
}


@dataclass
class Block:
    kind: str  # "h2" | "h3" | "p" | "table" | "image"
    text: str = ""
    table: pd.DataFrame | None = None
    path: Path | None = None


@dataclass
class Report:
    suite_dir: Path
    markdown: Path
    html: Path
    plots: dict[str, list[Path]] = field(default_factory=dict)


def build_report(suite_dir: Path | str) -> Report:
    res = load_suite(suite_dir)
    plots = draw_all(res)
    blocks = compose(res, plots)
    md_path, html_path = res.path / "report.md", res.path / "report.html"
    atomic_write_text(md_path, render_markdown(res, blocks))
    atomic_write_text(html_path, render_html(res, blocks))
    return Report(res.path, md_path, html_path, plots)


# ---- tables ------------------------------------------------------------------------------

def summary_table(res: SuiteResults) -> pd.DataFrame:
    runs = res.runs
    keys = ["workload", "label", "batch_size", "sharding", "workers"]
    scaling = scaling_table(runs).set_index(keys)
    rows = []
    for key, group in runs.groupby(keys, sort=True):
        hit = group["time_to_target_s"].dropna() if "time_to_target_s" in group else pd.Series(dtype=float)
        sc = scaling.loc[key] if key in scaling.index else None
        rows.append({
            "workload": key[0], "system": key[1], "batch/worker": key[2], "sharding": key[3], "workers": key[4],
            "runs": len(group),
            "samples/s": group["samples_per_s"].mean(),
            "speed-up vs single": None if sc is None else sc["speedup"],
            "scaling eff.": None if sc is None else sc["efficiency"],
            "time to target (s)": hit.mean() if len(hit) else None,
            "reached target": f"{len(hit)}/{len(group)}",
            "final val acc": _mean_sd(group.get("final_val_accuracy")),
            "final train loss": _mean_sd(group.get("final_train_loss")),
        })
    return pd.DataFrame(rows)


def batch_sweep_table(res: SuiteResults) -> pd.DataFrame:
    """Per variant: step time at the smallest and the largest batch, and the fall between them."""
    runs = res.runs.dropna(subset=["median_step_s"])
    rows = []
    for key, group in runs.groupby(["workload", "label", "workers", "sharding"], sort=True):
        by_batch = group.groupby("batch_size")["median_step_s"].median()
        if len(by_batch) < 2:
            continue
        rows.append({"workload": key[0], "system": key[1], "workers": key[2], "sharding": key[3],
                     "smallest batch": by_batch.index[0], "ms/step": by_batch.iloc[0] * 1000,
                     "largest batch": by_batch.index[-1], "ms/step ": by_batch.iloc[-1] * 1000,
                     "cost fall (largest ÷ smallest)": by_batch.iloc[-1] / by_batch.iloc[0],
                     "per-example cost ratio": (by_batch.iloc[0] / by_batch.index[0])
                     / (by_batch.iloc[-1] / by_batch.index[-1])})
    return pd.DataFrame(rows)


def staleness_table(res: SuiteResults) -> pd.DataFrame:
    steps = res.steps.dropna(subset=["staleness"])
    if steps.empty:
        return pd.DataFrame()
    steps = steps.drop(columns=["system", "workload"]).merge(res.runs[["run_id", "workload", "label", "workers"]], on="run_id")
    rows = []
    for key, group in steps.groupby(["workload", "label", "workers"], sort=True):
        values = group["staleness"].to_numpy(dtype=float)
        rows.append({"workload": key[0], "system": key[1], "workers": key[2], "runs": group["run_id"].nunique(),
                     "updates": len(values), "mean": values.mean(), "p50": np.percentile(values, 50),
                     "p95": np.percentile(values, 95), "max": int(values.max()),
                     "fresh (0)": f"{(values == 0).mean():.0%}"})
    return pd.DataFrame(rows)


def sharding_table(res: SuiteResults) -> pd.DataFrame:
    """Mean and variance over seeds of the final metrics per strategy, and random's variance ÷ the
    strategy's (the thesis' variability reduction; > 1 means less variable than random)."""
    runs = sharding_runs(res.runs)
    metrics = [m for m, _ in SHARDING_METRICS if m in runs.columns]
    if runs.empty or not metrics:
        return pd.DataFrame()
    rows = []
    for key, group in runs.groupby(SHARDING_GROUP, sort=True):
        variances = {s: g[metrics].var(ddof=1) for s, g in group.groupby("sharding")}
        for strategy in _strategy_order(variances):
            g = group[group["sharding"] == strategy]
            row: dict[str, Any] = {"workload": key[0], "system": key[1], "workers": key[2],
                                   "batch/worker": key[3], "sharding": strategy, "seeds": g["seed"].nunique()}
            for m in metrics:
                short = m.replace("final_", "").replace("accuracy", "acc")
                row[f"{short} mean"] = g[m].mean()
                row[f"{short} var"] = variances[strategy][m]
            for m in metrics:
                short = m.replace("final_", "").replace("accuracy", "acc")
                base = variances.get("random")
                var = variances[strategy][m]
                row[f"{short} var ratio"] = (base[m] / var) if base is not None and var and var > 0 else None
            rows.append(row)
    return pd.DataFrame(rows)


PEERS = ("ray-ps", "rpc-ps")  # the peer parameter servers set beside ours (issue 18: ps >= 2x each at 4 workers)


def peers_table(res: SuiteResults) -> pd.DataFrame:
    """Our PS beside the peer parameter servers run alike (workload, consistency, shards, batch, workers):
    mean samples/s over seeds, ps ÷ each peer, and time to the workload's target accuracy."""
    runs = res.runs[res.runs["system"].isin(("ps",) + PEERS)]
    if not runs["system"].isin(PEERS).any():
        return pd.DataFrame()
    runs = runs.assign(consistency=runs.get("opt_consistency", pd.Series("asp", index=runs.index)).fillna("asp"),
                       servers=runs.get("opt_servers", pd.Series(1, index=runs.index)).fillna(1).astype(int))
    rows = []
    keys = ["workload", "consistency", "servers", "batch_size", "workers"]
    for key, group in runs.groupby(keys, sort=True):
        speed = group.groupby("system")["samples_per_s"].mean()
        ttt = group.groupby("system")["time_to_target_s"].mean() if "time_to_target_s" in group else {}
        row: dict[str, Any] = dict(zip(["workload", "consistency", "servers", "batch/worker", "workers"], key))
        for system in ("ps",) + PEERS:
            row[f"{system} samples/s"] = speed.get(system)
        for peer in PEERS:
            row[f"ps ÷ {peer}"] = _ratio_of(speed.get("ps"), speed.get(peer))
        for system in ("ps",) + PEERS:
            row[f"{system} time to target (s)"] = ttt.get(system)
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio_of(a: Any, b: Any) -> float | None:
    return None if _missing(a) or _missing(b) or not b else a / b


def switch_table(res: SuiteResults) -> pd.DataFrame:
    switches = res.events[res.events["kind"] == "switch"]
    if switches.empty:
        return pd.DataFrame()
    # Compare with the runs set up alike: same workload, workers, batch size and sharding.
    alike = ["workload", "workers", "batch_size", "sharding"]
    setups = res.runs[res.runs["run_id"].isin(switches["run_id"])][alike].drop_duplicates()
    runs = res.runs.merge(setups, on=alike)
    first_switch = switches.sort_values("t_wall").groupby("run_id")["t_wall"].first()
    rows = []
    for key, group in runs.groupby(["workload", "label", "workers"], sort=True):
        sw = group["run_id"].map(first_switch).dropna()
        hit = group["time_to_target_s"].dropna()
        rows.append({"workload": key[0], "system": key[1], "workers": key[2], "runs": len(group),
                     "switch at (s)": sw.mean() if len(sw) else None,
                     "time to target (s)": hit.mean() if len(hit) else None,
                     "reached target": f"{len(hit)}/{len(group)}",
                     "train time (s)": group["train_s"].mean(),
                     "final val acc": group["final_val_accuracy"].mean() if "final_val_accuracy" in group else None,
                     "has switch": len(sw) > 0})
    return pd.DataFrame(rows)


def environment_table(res: SuiteResults) -> pd.DataFrame:
    rows = {}
    for manifest in res.manifests.values():
        machine = manifest.get("machine") or {}
        versions = manifest.get("versions") or {}
        key = json.dumps([machine, versions, manifest.get("git_sha")], sort_keys=True)
        entry = rows.setdefault(key, {
            "cores": machine.get("cores"), "memory (GiB)": machine.get("memory_gib"),
            "platform": machine.get("platform"),
            **{k: v for k, v in sorted(versions.items()) if v is not None},
            "git sha": (manifest.get("git_sha") or "")[:10], "runs": 0})
        entry["runs"] += 1
    return pd.DataFrame(list(rows.values()))


def thesis_table(res: SuiteResults, batch: pd.DataFrame, sharding: pd.DataFrame,
                 switch: pd.DataFrame) -> pd.DataFrame:
    rows = []
    if not batch.empty:
        ours = "; ".join(f"{r['system']}{_where(r)}: {r['cost fall (largest ÷ smallest)']:.2f}x "
                         f"(batch {r['largest batch']}→{r['smallest batch']})" for _, r in batch.iterrows())
        rows.append({"claim": "per-mini-batch cost falls as batches shrink", "thesis": THESIS["kassela"],
                     "ours": ours})
    if not sharding.empty:
        parts = []
        for strategy, g in sharding[sharding["sharding"] != "random"].groupby("sharding"):
            train = _max_ratio(g, "train")
            val = _max_ratio(g, "val")
            parts.append(f"{strategy}: up to {_fmt(train)}x (training), {_fmt(val)}x (validation)")
        rows.append({"claim": "smarter sharding lowers run-to-run variance", "thesis": THESIS["sharding"],
                     "ours": "; ".join(parts) or "only random sharding in this suite"})
    if not switch.empty and switch["has switch"].any():
        parts = []
        for workload, g in switch.groupby("workload"):
            sw = g[g["has switch"]].iloc[0]
            for _, other in g[~g["has switch"]].iterrows():
                acc = _diff(sw["final val acc"], other["final val acc"])
                speed = _ratio(other["time to target (s)"], sw["time to target (s)"])
                parts.append(f"{sw['system']} vs {other['system']}: final val acc {acc}, "
                             f"time to target {speed}")
        rows.append({"claim": "Strategy-Switch: sync accuracy at async speed", "thesis": THESIS["switch"],
                     "ours": "; ".join(parts) or "no pure sync/async runs to compare with in this suite"})
    return pd.DataFrame(rows)


def _where(row: pd.Series) -> str:
    return f" ({row['workload']}, {row['workers']} workers)"


def _max_ratio(group: pd.DataFrame, split: str) -> float | None:
    cols = [c for c in group.columns if c.startswith(split) and c.endswith("var ratio")]
    values = group[cols].to_numpy(dtype=float).ravel() if cols else np.array([])
    values = values[np.isfinite(values)]
    return float(values.max()) if len(values) else None


def _diff(a: Any, b: Any) -> str:
    if _missing(a) or _missing(b):
        return "n/a"
    return f"{a:.3f} vs {b:.3f} ({a - b:+.3f})"


def _ratio(slow: Any, fast: Any) -> str:
    if _missing(slow) or _missing(fast) or fast <= 0:
        return "n/a (target not reached by both)"
    return f"{slow / fast:.2f}x faster" if slow >= fast else f"{fast / slow:.2f}x slower"


def _mean_sd(values: pd.Series | None) -> str | None:
    if values is None:
        return None
    values = values.dropna()
    if not len(values):
        return None
    return f"{values.mean():.3f}" + (f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else "")


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any) -> str:
    if _missing(value):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return f"{v:.3g}" if abs(v) >= 1e-3 else f"{v:.2e}"
    return str(value)


def _compact(table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Drop columns that hold one value in every row; say those values once instead."""
    if len(table) < 2:
        return table, ""
    constant = [c for c in ("workload", "batch/worker", "sharding", "workers") if c in table.columns
                and table[c].astype(str).nunique() == 1]
    note = ", ".join(f"{c} = {table[c].iloc[0]}" for c in constant)
    return table.drop(columns=constant), (f"All rows: {note}." if note else "")


# ---- composing -----------------------------------------------------------------------------

def compose(res: SuiteResults, plots: dict[str, list[Path]]) -> list[Block]:
    blocks: list[Block] = []
    systems = ", ".join(res.labels)
    blocks.append(Block("p", f"{len(res.runs)} runs of {len(res.systems)} system(s) ({systems}) on "
                             f"{', '.join(sorted(res.runs['workload'].unique()))}."))

    def table(title: str, frame: pd.DataFrame, intro: str = "") -> None:
        if frame.empty:
            return
        frame, note = _compact(frame)
        blocks.append(Block("h2", title))
        if intro or note:
            blocks.append(Block("p", " ".join(t for t in (intro, note) if t)))
        blocks.append(Block("table", table=frame))

    batch, sharding, switch = batch_sweep_table(res), sharding_table(res), switch_table(res)
    thesis = thesis_table(res, batch, sharding, switch)
    table("Systems", summary_table(res),
          "Samples/s is the throughput of all workers together over training wall time. Speed-up and "
          "efficiency compare with the `single` system on the same workload and batch size (or the "
          "variant's own 1-worker runs); efficiency = samples/s ÷ (N × single samples/s).")
    table("Thesis figures beside ours", thesis,
          "Our runs are small and on one machine; the shape of a finding is what carries over, not its size.")
    table("Per-mini-batch cost vs batch size", batch,
          "Median time between a worker's consecutive mini-batches (launch and start-up excluded) at the smallest and largest batch size of each variant.")
    table("Parameter servers: ours vs peers", peers_table(res),
          "`ps` beside `ray-ps` (Ray actors as shards and workers, Ray's parameter-server example) and `rpc-ps` "
          "(torch.distributed.rpc, PyTorch's parameter-server tutorials), run alike: same workload, data shards, "
          "server-side SGD and evaluation. Samples/s is the mean over seeds; ps ÷ peer > 1 means ours is faster "
          "(goal: >= 2 at 4 workers). Time to target: mean over the seeds that reached it.")
    table("Staleness", staleness_table(res), "Server versions between a worker's pull and the apply of its update.")
    table("Sharding variability", sharding,
          "Mean and variance (over seeds) of the final metrics; var ratio = variance under random sharding ÷ "
          "variance under the strategy (> 1: less variable than random).")
    table("Strategy-Switch", switch, "Time of the sync → async switch, time to target and final accuracy.")

    if plots:
        blocks.append(Block("h2", "Plots"))
        for name, paths in plots.items():
            blocks.append(Block("h3", name.replace("_", " ").capitalize()))
            blocks.append(Block("p", PLOT_CAPTIONS.get(name, "")))
            blocks.append(Block("image", name, path=next(p for p in paths if p.suffix == ".png")))
    table("Machine and versions", environment_table(res), "From the run manifests.")
    return blocks


def _frame_strings(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda col: col.map(_fmt)) if len(frame) else frame


def render_markdown(res: SuiteResults, blocks: list[Block]) -> str:
    out = [f"# psbench report: suite `{res.suite}`", ""]
    for b in blocks:
        if b.kind == "h2":
            out += [f"## {b.text}", ""]
        elif b.kind == "h3":
            out += [f"### {b.text}", ""]
        elif b.kind == "p" and b.text:
            out += [b.text, ""]
        elif b.kind == "table":
            cells = _frame_strings(b.table)
            esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
            out.append("| " + " | ".join(esc(c) for c in cells.columns) + " |")
            out.append("|" + "|".join("---" for _ in cells.columns) + "|")
            for _, row in cells.iterrows():
                out.append("| " + " | ".join(esc(v) for v in row) + " |")
            out.append("")
        elif b.kind == "image":
            out += [f"![{b.text}](plots/{b.path.name}) ([SVG](plots/{b.path.with_suffix('.svg').name}))", ""]
    return "\n".join(out)


HTML_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
"""


def render_html(res: SuiteResults, blocks: list[Block]) -> str:
    title = f"psbench report: suite {html.escape(res.suite)}"
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{title}</title>",
           f"<style>{HTML_STYLE}</style></head><body>", f"<h1>{title}</h1>"]
    for b in blocks:
        if b.kind in ("h2", "h3"):
            out.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p" and b.text:
            out.append(f"<p>{html.escape(b.text)}</p>")
        elif b.kind == "table":
            out.append(_frame_strings(b.table).to_html(index=False, escape=True, border=0))
        elif b.kind == "image":
            data = base64.b64encode(b.path.read_bytes()).decode("ascii")
            out.append(f"<figure><img alt='{html.escape(b.text)}' src='data:image/png;base64,{data}'></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ---- CLI ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suites", nargs="+", type=Path, metavar="RESULTS/SUITE",
                   help="suite folder(s), e.g. results/systems")
    p.add_argument("--browser-check", action="store_true",
                   help="open report.html in headless Chromium: fail on console errors or images that do not "
                        "load; save a full-page screenshot as report.png beside it")


def main(args: argparse.Namespace) -> int:
    for suite in args.suites:
        report = build_report(suite)
        print(f"{report.markdown}  {report.html}  ({len(report.plots)} plot(s): {', '.join(report.plots) or 'none'})")
        if getattr(args, "browser_check", False) and not browser_check(report.html):
            return 1
    return 0


def browser_check(html_path: Path) -> bool:
    """Open the report as a reader would; print what went wrong, if anything."""
    from psbench.bench.report.browser import check_page

    check = check_page(html_path, html_path.with_suffix(".png"))
    for problem in check.errors + [f"image did not load: {i['alt']}" for i in check.broken_images]:
        print(f"psbench report: {html_path}: {problem}")
    print(f"{check.screenshot}  (Chromium: {len(check.images)} image(s), {len(check.errors)} console error(s))")
    return check.ok
