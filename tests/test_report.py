"""The report builder on a small fixture suite: frames, plots, tables, report files, bad input."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from psbench.bench.cli import main
from psbench.bench.report.plots import PALETTE, PLOTS, Styles, system_colour
from psbench.bench.report.document import build_report
from psbench.bench.report.tables import peers_table, sharding_table, summary_table
from psbench.bench.harness.results import load_suite
from psbench.bench.report.measures import annotate
from psbench.core.records import STEP_TIME_COLUMNS
from report_fixtures import build_fixture_suite
from psbench.core.errors import ConfigError

SYSTEMS = ["single", "ps", "ddp", "strategy-switch", "ray-ps", "rpc-ps"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return build_fixture_suite(tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def report(suite):
    return build_report(suite)


@pytest.fixture
def suite_copy(suite, tmp_path) -> Path:
    return Path(shutil.copytree(suite, tmp_path / "copy"))


def test_frames_hold_every_kind_of_record(suite):
    res = load_suite(suite)
    assert set(res.systems) == set(SYSTEMS)
    assert {"opt_consistency", "label", "samples_per_s", "final_val_accuracy", "batch_size"} <= set(res.runs.columns)
    assert {"ps (asp)", "ps (bsp)", "single", "ddp"} <= set(res.labels)
    assert res.runs["batch_size"].notna().all()  # workload defaults made concrete
    real = res.runs[res.runs["system"] == "single"]
    assert len(real) == 2 and (real["samples_per_s"] > 0).all()
    assert res.steps["staleness"].dropna().max() == 3
    assert (res.events["kind"] == "switch").sum() == 2  # one per switch run (2 and 4 workers)
    assert len(res.shard_counts) and set(res.shard_counts.columns) == {"run_id", "worker", "class", "count"}


def test_every_plot_is_drawn_as_png_and_svg(report):
    assert set(report.plots) == set(PLOTS)
    for name in PLOTS:
        png, svg = report.suite_dir / "plots" / f"{name}.png", report.suite_dir / "plots" / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 10_000, name
        assert "<svg" in svg.read_text()[:2000], name


def test_report_names_every_system_and_the_thesis_figures(report):
    md = report.markdown.read_text()
    html = report.html.read_text()
    for text in (md, html):
        for name in SYSTEMS + ["ps (asp)", "ps (bsp)"]:
            assert name in text, name
        assert "14x" in text and "1.36x" in text and "8.48x" in text  # the thesis beside ours
    for name in PLOTS:  # both link the plots beside them
        assert f"plots/{name}.png" in md and f"src='plots/{name}.png'" in html
    assert "base64" not in html
    assert "<table" in html and "## Sharding variability" in md and "## Staleness" in md


def test_a_self_contained_report_inlines_its_plots(report, suite_copy, capsys):
    assert main(["report", str(suite_copy), "--self-contained"]) == 0
    html = (suite_copy / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(PLOTS) and "src='plots/" not in html
    linked = report.html.read_text()  # the same suite's report, plots linked
    pngs = sum((suite_copy / "plots" / f"{name}.png").stat().st_size for name in PLOTS)
    assert len(html) - len(linked) > pngs  # what the inlined plots weigh: 4/3 of their bytes


def test_scaling_and_sharding_tables_compute_what_they_claim(suite):
    res = annotate(load_suite(suite))
    summary = summary_table(res)
    # throughput after warm-up (measures.WARMUP_RULE)
    single16 = res.runs[(res.runs["system"] == "single") & (res.runs["batch_size"] == 16)]["steady_samples_per_s"].iloc[0]
    row = summary[(summary["system"] == "ps (asp)") & (summary["workers"] == 2) & (summary["batch/worker"] == 16)]
    ps2 = res.runs[(res.runs["label"] == "ps (asp)") & (res.runs["workers"] == 2)
                   & (res.runs["batch_size"] == 16)]["steady_samples_per_s"].mean()
    assert row["speed-up vs single"].iloc[0] == pytest.approx(ps2 / single16)
    assert row["scaling eff."].iloc[0] == pytest.approx(ps2 / (2 * single16))

    table = sharding_table(res)
    table = table[table["metric"] == "validation accuracy"]
    assert list(table["sharding"]) == ["random", "stratified", "distribution-aware:3"]
    runs = res.runs[(res.runs["workers"] == 4) & (res.runs["batch_size"] == 16) & (res.runs["label"] == "ps (asp)")]
    var = runs.groupby("sharding")["final_val_accuracy"].var(ddof=1)
    got = table.set_index("sharding")["var ratio (random ÷ this)"]
    assert got["random"] == pytest.approx(1.0)
    assert got["stratified"] == pytest.approx(var["random"] / var["stratified"])
    assert got["distribution-aware:3"] > 1  # the fixture makes random the noisiest
    # the design's power at the verdict's Bonferroni level: the ratios tested are the accuracies' (the
    # paper's metrics), a loss's is shown and marked, and neither counts nor gets a power figure
    from psbench.bench.report import variance_power
    full = sharding_table(res)
    accuracy = full["metric"].isin(["training accuracy", "validation accuracy"])
    assert set(full.loc[accuracy & (full["sharding"] != "random"), "in the verdict"]) == {"yes"}
    assert set(full.loc[~accuracy & (full["sharding"] != "random"), "in the verdict"]) == {"no: shown, not tested"}
    assert full.loc[~accuracy, "detectable ratio (80% power)"].isna().all()
    alpha = 0.05 / int((accuracy & (full["sharding"] != "random")).sum())
    power = table.set_index("sharding")["detectable ratio (80% power)"]
    seeds = int(table.set_index("sharding")["seeds"]["stratified"])
    assert pd.isna(power["random"])
    normal = table.set_index("sharding")["detectable if normal (F)"]
    assert normal["stratified"] == pytest.approx(variance_power.detectable_ratio(seeds, seeds, alpha))
    # the verdict's test's power needs the tails read from enough random-shard runs; this fixture's few
    # seeds carry no shape, so the table says nothing rather than a normal figure under its name
    from psbench.bench.report import sharding
    assert len(sharding.sharding_residuals(res)) < variance_power.MIN_POOL
    assert pd.isna(power["stratified"]) and pd.isna(table.set_index("sharding")["seeds for 2x"]["stratified"])


def test_peers_table_sets_ps_beside_each_peer(suite, report):
    res = load_suite(suite)
    table = peers_table(res)
    table = table[table["batch/worker"] == 16].set_index(["consistency", "workers"])
    runs = res.runs[res.runs["batch_size"] == 16]
    for workers in (2, 4):
        mean = runs[runs["workers"] == workers].groupby("label")["samples_per_s"].mean()
        row = table.loc[("asp", workers)]
        assert row["ps samples/s"] == pytest.approx(mean["ps (asp)"])
        assert row["ps ÷ ray-ps"] == pytest.approx(mean["ps (asp)"] / mean["ray-ps"])
        assert row["ps ÷ rpc-ps"] == pytest.approx(mean["ps (asp)"] / mean["rpc-ps"])
        assert row["ps ÷ ray-ps"] > row["ps ÷ rpc-ps"] > 1  # the fixture's ray-ps steps are the slowest
    assert pd.isna(table.loc[("bsp", 4)]["ps ÷ ray-ps"])  # no bsp peer runs: no ratio, not a made-up one
    assert "## Parameter servers: ours vs peers" in report.markdown.read_text()


def test_plots_draw_only_what_the_data_supports(suite, tmp_path):
    only_single = tmp_path / "single-only"
    only_single.mkdir()
    for run in suite.iterdir():
        if run.name.startswith("single-"):
            shutil.copytree(run, only_single / run.name)
    drawn = build_report(only_single).plots
    told = load_suite(only_single).steps[STEP_TIME_COLUMNS].notna().any().any()  # once `single` records its parts
    # 1 worker, 2 batch sizes (so 2 fractions of the data, from shards.json), no PS
    assert set(drawn) == ({"step_time_vs_batch", "step_time_vs_fraction", "time_to_accuracy"}
                          | ({"time_breakdown"} if told else set()))
    assert "single" in (only_single / "report.md").read_text()


def test_one_colour_per_system_and_styles_per_variant(suite):
    res = load_suite(suite)
    style = Styles(res.runs)
    asp, bsp = style("ps (asp)"), style("ps (bsp)")
    assert asp["color"] == bsp["color"] == PALETTE["ps"]
    assert (asp["linestyle"], asp["marker"]) != (bsp["linestyle"], bsp["marker"])
    assert style("ddp")["color"] != asp["color"]
    assert system_colour("my-new-system") == system_colour("my-new-system")  # stable fallback
    assert system_colour("my-new-system") not in PALETTE.values()


def test_corrupt_manifest_is_one_clear_error(suite_copy, capsys):
    manifest = next(suite_copy.glob("ddp-*/manifest.json"))
    manifest.write_text('{"psbench_manifest": 1, "run_id": ')
    with pytest.raises(ConfigError, match="corrupt manifest") as info:
        load_suite(suite_copy)
    assert str(manifest) in str(info.value)
    assert main(["report", str(suite_copy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(manifest) in err[0] and "Traceback" not in err[0]


def _as_csv(table: Path, text: str) -> None:
    """Replace a run's Parquet table with a CSV one holding `text`."""
    table.unlink()
    table.with_suffix(".csv").write_text(text)


@pytest.mark.parametrize("make_bad, expected", [
    (lambda d: (d / "notes.txt").write_text("hello"), "notes.txt: not a psbench run folder"),
    (lambda d: (d / "stray-dir").mkdir(), "stray-dir: not a psbench run folder"),
    (lambda d: _as_csv(next(d.glob("ps-*/steps.parquet")), "a,b\n1,2\n"), "steps.csv: not a psbench steps.csv"),
    (lambda d: next(d.glob("ps-*/evals.parquet")).write_bytes(b"PAR1"), "evals.parquet: corrupt Parquet"),
    (lambda d: next(d.glob("ps-*/shards.json")).write_text("[1, 2]"), "shards.json: corrupt shard report"),
    (lambda d: next(d.glob("ddp-*/manifest.json")).write_text('{"a": 1}'), "not a psbench manifest"),
])
def test_foreign_or_corrupt_files_are_named(suite_copy, make_bad, expected):
    make_bad(suite_copy)
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_suite(suite_copy)


def test_staging_dirs_are_ignored_and_a_results_root_is_explained(suite_copy):
    (suite_copy / ".staging-ps-x-123").mkdir()
    (suite_copy / ".staging-ps-x-123" / "steps.csv").write_text("garbage")
    assert len(load_suite(suite_copy).runs) == len(list(suite_copy.glob("*-mlp-digits-*")))
    with pytest.raises(ConfigError, match="looks like a results root"):
        load_suite(suite_copy.parent)
    with pytest.raises(ConfigError, match="does not exist"):
        load_suite(suite_copy / "nope")


def test_bench_writes_a_report_for_each_suite(tmp_path, monkeypatch):
    from psbench.bench import cli
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "tiny.toml").write_text(
        'suite = "tiny"\n[matrix]\nsystem = ["single"]\nworkload = ["logreg-digits"]\nseed = [0, 1]\n'
        '[settings]\nmax_steps = 4\nevals_per_epoch = 1\n')
    monkeypatch.setattr(cli, "EXPERIMENTS_DIR", experiments)
    assert main(["bench", "--results-dir", str(tmp_path / "results"), "--no-progress"]) == 0
    md = (tmp_path / "results" / "tiny" / "report.md").read_text()
    assert "single" in md and "time_to_accuracy.png" in md
    frame = load_suite(tmp_path / "results" / "tiny").runs
    assert isinstance(frame, pd.DataFrame) and len(frame) == 2


def test_a_scaling_plot_needs_two_worker_counts(tmp_path):
    """The kassela design: single at 1 worker and the distributed systems at 2 only. Efficiency at one
    worker count is a stack of points over one x, no curve: the report draws no scaling plot for it; a
    second worker count draws one."""
    from psbench.bench.report.plots import scaling_efficiency
    from psbench.core.spec import RunSpec
    from report_fixtures import fake_run
    for system, workers in (("single", 1), ("ps", 2)):
        for seed in range(3):
            fake_run(tmp_path, "one-count", RunSpec(system, "mlp-digits", workers=workers, seed=seed, batch_size=16),
                     step_s=0.002, steps=8)
    assert scaling_efficiency(load_suite(tmp_path / "one-count"), tmp_path / "plots") == []
    for seed in range(3):
        fake_run(tmp_path, "one-count", RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16),
                 step_s=0.002, steps=8)
    assert scaling_efficiency(load_suite(tmp_path / "one-count"), tmp_path / "plots")
