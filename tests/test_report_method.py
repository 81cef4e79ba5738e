"""The report's method on suites whose answers are known: intervals, MLPerf time to target,
variance-ratio tests, warm-up, too-short flags, budgets, costs, code versions, the switch row and
the time-breakdown plot. Suites are written through the real Recorder (report_fixtures.fake_run)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from psbench.core.tables import read_table, table_file

from psbench.bench.harness.results import load_suite
from psbench.bench.report import measures
from psbench.bench.report.document import build_report, compose, warnings_text
from psbench.bench.report.tables import (_ci, accuracy_table, breakdown_table, runs_table, sharding_table, summary_table,
                                          switch_table, thesis_table)
from psbench.bench.report.plots import time_breakdown
from psbench.bench.report.stats import bootstrap_ci, mlperf_time_to_target
from psbench.core.spec import RunSpec
from report_fixtures import fake_run

PARTS = {"compute_s": 0.5, "comm_s": 0.3, "wait_s": 0.2}


@pytest.fixture(scope="module")
def fixture_suite(tmp_path_factory) -> Path:
    """single, ps bsp (3 seeds) and asp, ddp and a Strategy-Switch run; all but single with a time
    breakdown."""
    results = tmp_path_factory.mktemp("results")
    fake_run(results, "light", RunSpec("single", "mlp-digits", batch_size=16), step_s=0.001)
    for seed in range(3):
        spec = RunSpec("ps", "mlp-digits", workers=2, seed=seed, batch_size=16, options={"consistency": "bsp"})
        fake_run(results, "light", spec, step_s=0.002, parts={"compute_s": 0.5, "comm_s": 0.25, "wait_s": 0.2})
    fake_run(results, "light", RunSpec("ps", "mlp-digits", workers=2, batch_size=16, options={"consistency": "asp"}),
             step_s=0.002, parts={"compute_s": 0.5, "comm_s": 0.45})
    fake_run(results, "light", RunSpec("ddp", "mlp-digits", workers=2, batch_size=16), step_s=0.003, parts=PARTS)
    fake_run(results, "light", RunSpec("switch", "mlp-digits", workers=2, batch_size=16), step_s=0.0025,
             switch_at=10, handover_s=0.2, parts=PARTS)
    return results / "light"


@pytest.fixture(scope="module")
def seeds_suite(tmp_path_factory) -> Path:
    """ps asp at 2 workers over 5 seeds with different speeds (so different times to target), and
    sharding over 10 seeds each: random noisy (sd 0.05), stratified calm (sd 0.005)."""
    results = tmp_path_factory.mktemp("results")
    for seed in range(5):
        spec = RunSpec("ps", "mlp-digits", workers=2, seed=seed, batch_size=16, options={"consistency": "asp"})
        fake_run(results, "seeds", spec, step_s=0.002 * (1 + 0.25 * seed), setup_s=0.5 + 0.1 * seed, parts=PARTS)
    for strategy, spread in (("random", 0.05), ("stratified", 0.005)):
        for seed in range(10):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            fake_run(results, "seeds", spec, step_s=0.002, final_noise=spread)
    return results / "seeds"


def _report_res(suite: Path):
    return measures.annotate(load_suite(suite))


# ---- intervals --------------------------------------------------------------------------------

def test_every_summary_table_carries_n_and_interval_columns(fixture_suite):
    res = _report_res(fixture_suite)
    for table, figures in ((summary_table(res), ["samples/s", "speed-up", "scaling eff."]),
                           (accuracy_table(res), ["launch (s)", "final val acc", "final train loss"]),
                           (breakdown_table(res), ["step (ms)"]), (switch_table(res), ["final val acc"])):
        assert "runs" in table.columns
        for figure in figures:
            assert f"{figure} 95% CI" in table.columns, figure


def test_interval_columns_hold_the_bootstrap_over_seeds(seeds_suite):
    res = _report_res(seeds_suite)
    runs = res.runs[(res.runs["workers"] == 2)]
    row = accuracy_table(res).query("workers == 2").iloc[0]
    acc = runs["final_val_accuracy"]
    assert row["runs"] == 5
    assert row["final val acc"] == pytest.approx(acc.mean())
    assert row["final val acc 95% CI"] == _ci(bootstrap_ci(acc))
    summary = summary_table(res).query("workers == 2").iloc[0]
    ci = bootstrap_ci(runs["steady_samples_per_s"])
    assert summary["samples/s"] == pytest.approx(ci.estimate)
    assert summary["samples/s 95% CI"] == _ci(ci) and ci.lo < ci.estimate < ci.hi


def test_time_to_target_is_mlperf_with_launch_included(seeds_suite):
    res = _report_res(seeds_suite)
    runs = res.runs[res.runs["workers"] == 2].sort_values("seed")
    clock = runs["time_to_target_s"].to_numpy()
    assert len(set(np.round(clock, 6))) == 5  # the five seeds reach the target at different times
    with_launch = clock + runs["setup_s"].to_numpy()
    assert runs["tta_with_costs_s"].to_numpy() == pytest.approx(with_launch)
    row = accuracy_table(res).query("workers == 2").iloc[0]
    kept = np.sort(with_launch)[1:-1]  # fastest and slowest dropped
    assert row["time to target incl. launch + hand-over (s)"] == pytest.approx(kept.mean())
    assert row["time to target, training clock (s)"] == pytest.approx(np.sort(clock)[1:-1].mean())
    assert row["reached target"] == "5/5"
    assert mlperf_time_to_target(with_launch).fastest == pytest.approx(with_launch.min())
    assert row["spread (s)"].count("–") == 1


def test_sharding_variance_ratio_has_interval_and_tests(seeds_suite):
    table = sharding_table(_report_res(seeds_suite))
    row = table[(table["metric"] == "validation accuracy") & (table["sharding"] == "stratified")].iloc[0]
    assert row["seeds"] == 10
    assert row["var ratio (random ÷ this)"] > 10  # true ratio 100
    lo = float(row["ratio 95% CI"].split(" – ")[0].replace(",", ""))
    assert lo > 1
    assert row["p (Brown–Forsythe)"] < 0.05 and row["p (F)"] < 0.05
    thesis = thesis_table(_report_res(seeds_suite), pd.DataFrame(), table, pd.DataFrame())
    assert "Brown–Forsythe p=" in thesis["ours"].iloc[0] and "95% CI" in thesis["ours"].iloc[0]


# ---- warm-up, too short, budget ---------------------------------------------------------------

def test_warmup_is_kept_out_of_throughput():
    # 2 workers, 20 steps of 10 ms each, but each worker's first step took 1 s; worker 1 stops 2 steps early.
    rows = []
    for worker, n in ((0, 20), (1, 18)):
        t = 1.0
        for step in range(n):
            t += 0.01 if step else 0.0
            rows.append({"worker": worker, "step": step, "t_wall": t, "n_samples": 10})
    steps = pd.DataFrame(rows)
    kept = measures.warmup_mask(steps)
    assert (~kept).sum() == 2 + 2  # ceil(10% of 20) and ceil(10% of 18) steps
    start, end, samples = measures.steady_window(steps)
    assert start == pytest.approx(1.01) and end == pytest.approx(1.17)  # worker 1's last step ends the window
    assert samples / (end - start) == pytest.approx(2 * 10 / 0.01)
    whole = steps["n_samples"].sum() / steps["t_wall"].max()
    assert whole < 0.2 * samples / (end - start)  # the 1 s first step would have dominated


def test_too_short_runs_are_flagged_and_budgets_named(tmp_path):
    long = RunSpec("ps", "mlp-digits", workers=2, batch_size=16, options={"consistency": "asp"}, budget="updates=500")
    short = RunSpec("ddp", "mlp-digits", workers=2, batch_size=16, max_steps=20)
    fake_run(tmp_path, "len", long, step_s=0.025, steps=250, parts=PARTS)  # 250 steps/worker, 6.4 s
    fake_run(tmp_path, "len", short, step_s=0.01, steps=20)
    res = _report_res(tmp_path / "len")
    flags = runs_table(res).set_index("system")["too short"]
    assert flags["ps"] == "no"
    assert "20 steps/worker < 200" in flags["ddp"] and "s < 5 s" in flags["ddp"]
    summary = summary_table(res).set_index("system")
    assert summary.loc["ps", "too short"] == "0/1" and summary.loc["ddp", "too short"] == "1/1"
    assert summary.loc["ps", "budget"] == "updates=500" and summary.loc["ddp", "budget"] == "steps per worker"
    assert any("1 of 2 runs are too short" in w for w in warnings_text(res))
    md = build_report(tmp_path / "len").markdown.read_text()
    assert "too short to compare" in md and "updates=500" in md and "steps per worker" in md


def test_runs_whose_measured_cpu_filled_the_cores_or_beat_the_plan_are_flagged(tmp_path):
    """The Runs table puts each run's planned cores beside those its processes used; a run that kept
    >= 95% of the cores busy, or used well beyond its plan, is flagged and warned about."""
    specs = [RunSpec("ps", "mlp-digits", workers=w, batch_size=16, seed=w) for w in (1, 2, 4)]
    used = {1: (0.4, 0.45), 2: (0.9, 1.96), 4: (0.5, 0.9)}  # planned, used on 2 cores
    for spec in specs:
        planned, measured = used[spec.workers]
        fake_run(tmp_path, "cpu", spec, step_s=0.01, conditions={"cores": 2.0, "cpu_demand": planned,
                                                                 "cpu_measured": measured, "oversubscribed": False})
    res = _report_res(tmp_path / "cpu")
    runs = runs_table(res).set_index("workers")
    assert list(runs["CPU planned"]) == [0.4, 0.9, 0.5] and list(runs["CPU used"]) == [0.45, 1.96, 0.9]
    assert runs.loc[1, "CPU flag"] == "no"
    assert runs.loc[2, "CPU flag"].startswith("used 1.96 of 2 cores")
    assert runs.loc[4, "CPU flag"] == "used 0.90, planned 0.50"
    assert any(w.startswith("Warning: 2 run(s) kept (nearly) all the cores busy") for w in warnings_text(res))
    fake_run(tmp_path, "old", specs[0], step_s=0.01)  # written before cpu_measured: no columns, no flag
    assert "CPU used" not in runs_table(_report_res(tmp_path / "old"))


def test_results_without_budget_or_breakdown_still_read(tmp_path):
    fake_run(tmp_path, "old", RunSpec("ddp", "mlp-digits", workers=2, batch_size=16), step_s=0.01)
    run_dir = next((tmp_path / "old").iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    del manifest["summary"]["budget"], manifest["git_dirty"]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    written = table_file(run_dir, "steps")  # an older run: steps.csv without the time breakdown
    steps = read_table(run_dir, "steps")
    written.unlink()
    steps.drop(columns=["compute_s", "emulated_s", "comm_s", "wait_s"]).to_csv(run_dir / "steps.csv", index=False)
    res = _report_res(tmp_path / "old")
    assert res.runs["budget"].iloc[0] == "epochs per worker" and res.runs["conditions"].iloc[0] == "native"
    assert breakdown_table(res).empty


# ---- costs, code versions ---------------------------------------------------------------------

@pytest.mark.parametrize("on_clock, switch_t, expected", [
    (False, 1.0, 3.0 + 0.5 + 0.7), (True, 1.0, 3.0 + 0.5), (False, 5.0, 3.0 + 0.5)])
def test_handover_is_added_when_off_the_clock_and_before_the_target(on_clock, switch_t, expected):
    run = pd.Series({"time_to_target_s": 3.0, "setup_s": 0.5, "handover_s": 0.7, "switch_t_wall": switch_t,
                     "handover_on_clock": on_clock})
    assert measures._tta_with_costs(run) == pytest.approx(expected)


def test_mixed_code_versions_are_flagged(fixture_suite, tmp_path):
    suite = Path(shutil.copytree(fixture_suite, tmp_path / "mixed"))
    manifests = sorted(suite.glob("*/manifest.json"))
    for i, path in enumerate(manifests):
        manifest = json.loads(path.read_text())
        manifest["git_sha"], manifest["git_dirty"] = ("a" * 40 if i else "b" * 40), False
        path.write_text(json.dumps(manifest))
    assert measures.mixed_versions_warning(load_suite(suite)).startswith("Warning: the runs come from 2 code versions")
    assert "bbbbbbbbbb (1 runs)" in measures.mixed_versions_warning(load_suite(suite))
    for path in manifests:  # one clean version: nothing to flag
        manifest = json.loads(path.read_text())
        manifest["git_sha"] = "a" * 40
        path.write_text(json.dumps(manifest))
    assert measures.mixed_versions_warning(load_suite(suite)) == ""
    manifest = json.loads(manifests[0].read_text())
    manifest["git_dirty"] = True
    manifests[0].write_text(json.dumps(manifest))
    assert "1 run(s) were made from a working tree with uncommitted changes" in \
        measures.mixed_versions_warning(load_suite(suite))


# ---- Strategy-Switch thesis row ---------------------------------------------------------------

def test_switch_thesis_row_compares_with_pure_sync_and_async_only(tmp_path):
    def run(system, step_s, **kw):
        options = kw.pop("options", {})
        fake_run(tmp_path, "sw", RunSpec(system, "mlp-digits", workers=2, batch_size=16, options=options), step_s=step_s,
                 **kw)
    run("ddp", 0.004)
    run("ps", 0.002, options={"consistency": "asp"})
    run("ps", 0.003, options={"consistency": "bsp"})
    run("switch", 0.0025, switch_at=10, handover_s=0.3, options={"criterion": "fixed:fraction=0.3"})
    # a second switch variant whose criterion never fired: still a switch, never a baseline
    run("switch", 0.0035, options={"criterion": "plateau:window=30,threshold=0.05"})
    run("switch", 0.0025, switch_at=8, options={"criterion": "fixed:fraction=0.3", "sync": "ps-bsp"})
    res = _report_res(tmp_path / "sw")
    table = switch_table(res)
    roles = dict(zip(table["system"], table["role"]))
    assert roles["ddp"] == "sync" and roles["ps (bsp)"] == "sync" and roles["ps (asp)"] == "async"
    assert sum(r == "switch" for r in roles.values()) == 3
    ours = thesis_table(res, pd.DataFrame(), pd.DataFrame(), table)["ours"].iloc[0]
    verdicts = ours.split("; ")
    assert len(verdicts) == 6  # 3 switch variants x (sync, async)
    for verdict in verdicts:
        _, _, baseline = verdict.partition(" vs pure ")
        assert baseline.split(":")[0] in ("sync ddp", "sync ps (bsp)", "async ps (asp)"), verdict
        assert "switch" not in baseline, verdict
    # the baseline matches the switch's own phases: sync=ddp by default, ps-bsp when asked
    ddp_phase = [v for v in verdicts if "ps-bsp" not in v.split(" vs ")[0] and "vs pure sync" in v]
    assert sum("criterion never fired" in v for v in verdicts) == 2  # the plateau variant, vs sync and async
    assert ddp_phase and all("vs pure sync ddp" in v for v in ddp_phase)
    assert any("ps-bsp" in v.split(" vs ")[0] and "vs pure sync ps (bsp)" in v for v in verdicts)


# ---- breakdown --------------------------------------------------------------------------------

def test_breakdown_table_and_plot(fixture_suite, tmp_path):
    res = _report_res(fixture_suite)
    png, svg = time_breakdown(res, tmp_path)
    assert png.name == "time_breakdown.png" and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    assert svg.read_text().count("<svg") == 1
    table = breakdown_table(res)
    bsp = table[table["system"] == "ps (bsp)"].iloc[0]
    # fixture: step_s 2 ms (x1.02 on worker 1); bsp splits it 50% compute, 25% comm, 20% wait
    assert bsp["runs"] == 3
    assert bsp["compute (ms)"] == pytest.approx(1.0 * 1.01, rel=1e-3)
    assert bsp["communication (ms)"] == pytest.approx(0.5 * 1.01, rel=1e-3)
    assert bsp["waiting (ms)"] == pytest.approx(0.4 * 1.01, rel=1e-3)
    assert np.isnan(bsp["emulated (ms)"])
    assert bsp["bytes are"].startswith("measured")
    assert table.set_index("system").loc["ddp", "bytes are"].startswith("computed")
    text = " ".join(b.text for b in compose(res, {}) if b.kind == "p")
    assert "No breakdown recorded for: single." in text
    only_single = res.runs[res.runs["system"] == "single"]["run_id"]  # nothing to draw: no plot
    res_single = load_suite(fixture_suite)
    res_single.runs = res_single.runs[res_single.runs["run_id"].isin(only_single)]
    res_single.steps = res_single.steps[res_single.steps["run_id"].isin(only_single)]
    assert time_breakdown(res_single, tmp_path / "none") == []
