"""`psbench report RESULTS/SUITE [...]`: tables + plots of a suite as report.md and report.html.

The report is composed once as a list of blocks (heading, paragraph, table, image) and rendered
twice: Markdown and HTML, both linking the images in plots/ (`--self-contained` inlines them in the
HTML as base64: one file to send, a third larger than its plots).
Where the suite holds the data for one of the thesis' claims, its figure stands beside ours.
"""
from __future__ import annotations

import argparse
import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from psbench.core.atomic import atomic_write_text
from psbench.bench.report import cost_model, measures, switching, tables, throughput_gap, variance_power
from psbench.bench.report import thesis as thesis_findings
from psbench.bench.report.claims import KASSELA
from psbench.bench.report.markdown import frame_strings as _frame_strings, markdown_table
from psbench.bench.report.plots import draw_all
from psbench.bench.report.stats import CONFIDENCE, N_BOOT
from psbench.bench.harness.results import INCLUDE_LOST_FLAG, SuiteResults, load_suite, lost_left_out_line

PLOT_CAPTIONS = {
    "throughput_vs_workers": "Throughput (training samples per second, all workers together, after warm-up: see "
                             "Method) against the number of workers.",
    "ps_vs_peers": "Samples/s of our parameter server (ps) and the peer parameter servers on Ray (ray-ps) and "
                   "torch.distributed.rpc (rpc-ps) against the number of workers.",
    "step_time_vs_fraction": "Time per mini-batch against the mini-batch as a fraction of the training rows, "
                             "log-log (Kassela et al. 2019 varied MLlib's miniBatchFraction); the legend gives "
                             "each system's fall, largest ÷ smallest fraction.",
    "step_time_vs_batch": "Time per mini-batch against mini-batch size, log-log. Kassela et al. (2019): the PS's "
                          f"per-mini-batch cost fell up to {KASSELA.ps_fall:g}x as batches shrank, Spark MLlib's at "
                          f"most {KASSELA.spark_fall:g}x.",
    "time_to_accuracy": "Validation accuracy against training wall time (evaluation time excluded).",
    "scaling_efficiency": "Samples/s at N workers divided by N times the single-process samples/s (1 = linear).",
    "staleness_hist": "How many server versions behind each applied update was (0 = fresh).",
    "strategy_switch": "Validation accuracy against time; the star marks where Strategy-Switch moved from "
                       "synchronous all-reduce to asynchronous PS training.",
    "handover_loss": "Training loss around each Strategy-Switch hand-over (steps since the switch; thin lines "
                     "are seeds, bold the median): a jump after step 0 is the spike the warm-up "
                     "(lr or momentum ramp) is for; losses beyond 2x the pre-switch loss and beyond the sync "
                     "phase's own largest mini-batch loss are recorded as loss_spike events.",
    "switch_map": "The regime map: for each workload, worker count and straggler condition, the best switch "
                  "variant's (and pure ASP's) speed-up to target over the fastest sync system, with the final "
                  "accuracy difference; blue cells are where it pays. Means over the verdict seeds; the table "
                  "'Strategy-Switch against the fastest sync system' has each cell's interval.",
    "sharding_variance": "Final training/validation loss and accuracy over seeds, per sharding strategy "
                         "(dots are individual seeds).",
    "shard_class_counts": "Examples of each class per worker shard: a tight box means every worker sees the "
                          "global class mix.",
    "time_breakdown": "Median time per step of each part (compute, emulated device or straggler sleep, "
                      "communication, waiting on other workers), per system and worker count, after warm-up; "
                      "◆ = median step time. Medians of parts need not add up to the median step; a part a "
                      "system cannot tell draws as 0 (the breakdown table shows it as –); parts no system tells are "
                      "left out.",
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
    left_out: str = ""  # the runs load_suite left out, and why ('' when none)


def build_report(suite_dir: Path | str, include_lost: bool = False, self_contained: bool = False) -> Report:
    res = measures.annotate(load_suite(suite_dir, include_lost))
    plots = draw_all(res)
    fits = cost_model.suite_fits(res)
    check = cost_model.size_check(fits, cost_model.check_suite(res)) if fits else pd.DataFrame()
    blocks = compose(res, plots, fits, check)
    md_path, html_path = res.path / "report.md", res.path / "report.html"
    atomic_write_text(md_path, render_markdown(res, blocks))
    atomic_write_text(html_path, render_html(res, blocks, self_contained))
    if fits:
        falls = cost_model.predicted_falls(fits, cost_model.checked_labels(check))
        atomic_write_text(res.path / cost_model.COST_FILE, cost_model.to_json(fits, res.suite, falls))
    return Report(res.path, md_path, html_path, plots, lost_left_out_line(len(res.lost_left_out), f"suite {res.suite}"))


# ---- composing -----------------------------------------------------------------------------

def method_text() -> str:
    return (f"Every figure over runs is their mean (a median where the column says so) with n (the runs column) "
            f"and a {CONFIDENCE:.0%} percentile-bootstrap interval over the runs ({N_BOOT:,} resamples, fixed "
            f"seed; '–' where n < 2). Read an interval with its n: over 3–5 seeds a mean's interval is too narrow, "
            "and a variance ratio's very wide (3 seeds: a resample that repeats one seed has variance 0, so the "
            "ratio's interval runs from 0 to ∞; 5 seeds give finite bounds). Throughput: "
            f"{measures.WARMUP_RULE}. Speed-up: ratio of mean throughputs, both sides resampled. Time to target, "
            "as MLPerf scores it: over the runs, drop the fastest and the slowest (a run that missed the target "
            "counts as the slowest) and average the rest (under 3 runs: the plain mean), with the spread "
            "(fastest–slowest run that reached it); 'incl. launch + hand-over' adds the launch (process start, a "
            "Spark session) and a Strategy-Switch hand-over kept off the training clock. Variance ratios: "
            "random's variance ÷ the strategy's, with a bootstrap interval and two tests of equal variances: "
            "Brown–Forsythe (Levene's test on deviations from the median; robust) and F (exact only for "
            f"normal data). A run with {measures.SHORT_RULE} is too short to compare.")


def steps_kept_text(res: SuiteResults) -> str:
    """Where `psbench slim` dropped runs' per-step rows: which runs the per-step figures rest on."""
    kept = res.runs["steps_kept"]
    if kept.all():
        return ""
    seeds = sorted(res.runs.loc[kept, "seed"].astype(int).unique())
    which = f"seeds {seeds[0]}–{seeds[-1]}" if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) else \
        f"seeds {', '.join(map(str, seeds)) or 'none'}"
    return (f"Per-step records: kept for {int(kept.sum())} of {len(kept)} runs ({which} of each configuration); "
            "the others' were dropped after the run to keep the folder small (`psbench slim`; each run's "
            "steps.dropped.json gives the dropped file's rows and sha256). Evaluations, summaries, events and shard "
            "reports are kept for every run, so accuracies, variance ratios and verdicts use every run; "
            "throughput after warm-up, step-time breakdowns and staleness histograms use the runs that kept "
            "their steps (their n says so).")


def warnings_text(res: SuiteResults) -> list[str]:
    runs = measures.annotate(res).runs
    out = [measures.mixed_versions_warning(res), lost_left_out_line(len(res.lost_left_out), "this suite")]
    short = runs[runs["too_short"] != ""]
    if len(short):
        out.append(f"Warning: {len(short)} of {len(runs)} runs are too short to compare ({measures.SHORT_RULE}): "
                   "their throughput is start-up and scheduler noise. The 'too short' columns count them; the "
                   "Runs table names them.")
    over = runs[runs["oversubscribed"].map(lambda v: v is True or v is np.True_)]
    if len(over):
        out.append(f"Warning: {len(over)} run(s) oversubscribed the cores (more real compute than cores): their "
                   "timings measure contention, not the system.")
    flagged = runs[runs["cpu_flag"] != ""]
    if len(flagged):
        out.append(f"Warning: {len(flagged)} run(s) kept (nearly) all the cores busy, or used well beyond their CPU "
                   f"plan ({measures.CPU_RULE}): their timings may measure contention. The Runs table's 'CPU flag' "
                   "names them.")
    return [text for text in out if text]


def compose(res: SuiteResults, plots: dict[str, list[Path]],
            fits: list[cost_model.CostFit] | None = None, check: pd.DataFrame | None = None) -> list[Block]:
    res = measures.annotate(res)
    blocks: list[Block] = []
    systems = ", ".join(res.labels)
    blocks.append(Block("p", f"{len(res.runs)} runs of {len(res.systems)} system(s) ({systems}) on "
                             f"{', '.join(sorted(res.runs['workload'].unique()))}."))
    blocks += [Block("p", text) for text in [steps_kept_text(res), *warnings_text(res)] if text]

    def table(name: str, frame: pd.DataFrame, **fields: str) -> None:
        if frame.empty:
            return
        frame, note = tables.compact(frame)
        caption = tables.CAPTIONS[name]
        intro = caption.fill(**fields)
        blocks.append(Block("h2", caption.title))
        if intro or note:
            blocks.append(Block("p", " ".join(t for t in (intro, note) if t)))
        blocks.append(Block("table", table=frame))

    batch, sharding, switch = tables.batch_sweep_table(res), tables.sharding_table(res), tables.switch_table(res)
    breakdown = tables.breakdown_table(res)
    untold = sorted(set(res.runs["label"]) - set(breakdown["system"] if len(breakdown) else []))
    fits = cost_model.suite_fits(res) if fits is None else fits
    if check is None:
        check = cost_model.size_check(fits, cost_model.check_suite(res)) if fits else pd.DataFrame()
    comparisons = switching.switch_comparisons(res)

    table("systems", tables.summary_table(res))
    table("accuracy", tables.accuracy_table(res))
    table("verdicts", thesis_findings.findings_table(thesis_findings.findings(res)))
    table("switch_verdict", switching.switch_verdict_table(comparisons) if comparisons else pd.DataFrame())
    table("thesis", tables.thesis_table(res, batch, sharding, switch))
    table("breakdown", breakdown, untold=f"No breakdown recorded for: {', '.join(untold)}." if untold else "")
    table("batch_sweep", batch)
    table("fall", tables.fall_table(res))
    table("cost_terms", cost_model.terms_table(fits))
    table("fixed_ratios", cost_model.fixed_ratios_table(fits))
    table("size_check", cost_model.size_check_table(check), check_suite=cost_model.CHECK_SUITES.get(res.suite, ""))
    table("predicted_falls",
          cost_model.predicted_falls_table(cost_model.predicted_falls(fits, cost_model.checked_labels(check))))
    table("twins", throughput_gap.twin_table(throughput_gap.twins(res)))
    table("exchanges", throughput_gap.exchange_table(res))
    table("peers", tables.peers_table(res))
    table("staleness", tables.staleness_table(res))
    table("sharding", sharding, power=tables.sharding_power_text(res, sharding),
          paper_design=variance_power.paper_design_text() + "." if not sharding.empty else "")
    table("switch", switch)

    if plots:
        blocks.append(Block("h2", "Plots"))
        for name, paths in plots.items():
            blocks.append(Block("h3", name.replace("_", " ").capitalize()))
            blocks.append(Block("p", PLOT_CAPTIONS.get(name, "")))
            blocks.append(Block("image", name, path=next(p for p in paths if p.suffix == ".png")))
    blocks += [Block("h2", "Method"), Block("p", method_text())]
    table("bytes", tables.bytes_table(res))
    table("runs", tables.runs_table(res))
    table("workload_sources", tables.workload_sources_table(res))
    table("environment", tables.environment_table(res))
    return blocks


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
            out += [markdown_table(b.table), ""]
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


def render_html(res: SuiteResults, blocks: list[Block], self_contained: bool = False) -> str:
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
            if self_contained:
                src = "data:image/png;base64," + base64.b64encode(b.path.read_bytes()).decode("ascii")
            else:
                src = html.escape(b.path.relative_to(res.path).as_posix())
            out.append(f"<figure><img alt='{html.escape(b.text)}' src='{src}'></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# ---- CLI ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suites", nargs="+", type=Path, metavar="RESULTS/SUITE",
                   help="suite folder(s), e.g. results/systems")
    p.add_argument(INCLUDE_LOST_FLAG, dest="include_lost", action="store_true",
                   help="count runs that lost a worker (left out of tables, verdicts and intervals by default)")
    p.add_argument("--self-contained", action="store_true",
                   help="inline the plots in report.html (one file to send); by default it links plots/, as "
                        "report.md does")
    p.add_argument("--browser-check", action="store_true",
                   help="open report.html in headless Chromium: fail on console errors or images that do not "
                        "load; save a full-page screenshot as report.png beside it")


def main(args: argparse.Namespace) -> int:
    for suite in args.suites:
        report = build_report(suite, args.include_lost, args.self_contained)
        if report.left_out:
            print(f"psbench report: {report.left_out}")
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
