"""A run that lost a worker is no sample of its configuration: the PS fails such a run unless told
to tolerate the loss (a fault experiment), a tolerated loss is in the run's summary (lost_workers),
and report, compare and thesis leave such runs out (load_suite) and say so, unless asked."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from psbench.bench import cli
from psbench.bench.harness.results import INCLUDE_LOST_FLAG, OnlyLostRuns, load_suite
from psbench.bench.report import thesis
from psbench.bench.report.claims import Verdict
from psbench.bench.report.compare import compare_sides, load_side
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.systems.ps.adapter import PSOptions
from report_fixtures import fake_run

SEEDS = (0, 1, 2)
LOST_SEED = 3
LEFT_OUT = re.compile(r"Left out 1 run\(s\) of .* that lost a worker \(summary lost_workers: fewer workers trained "
                      r"than the spec says\); --include-lost-workers counts them")


def _ps_suite(results: Path, speed: float = 1.0, lost_seed: int | None = LOST_SEED) -> Path:
    """ps asp at 2 workers over 3 seeds; seed 3 lost worker 1 and ran at a third of the speed
    (pooled, it would move the mean and widen the interval)."""
    for seed in SEEDS:
        spec = RunSpec("ps", "mlp-digits", workers=2, seed=seed, batch_size=16, options={"consistency": "asp"})
        fake_run(results, "s", spec, step_s=0.002 * (1 + 0.02 * seed) / speed)
    if lost_seed is not None:
        spec = RunSpec("ps", "mlp-digits", workers=2, seed=lost_seed, batch_size=16, options={"consistency": "asp"})
        fake_run(results, "s", spec, step_s=0.006 / speed, lost=(1,))
    return results / "s"


def _lost_run_id(suite: Path) -> str:
    return next(p.name for p in suite.iterdir() if p.name.startswith(f"ps-mlp-digits-w2-s{LOST_SEED}-"))


def test_load_suite_leaves_out_runs_that_lost_a_worker(tmp_path):
    suite = _ps_suite(tmp_path)
    lost_id = _lost_run_id(suite)
    assert json.loads((suite / lost_id / "manifest.json").read_text())["summary"]["lost_workers"] == [1]
    res = load_suite(suite)
    assert sorted(res.runs["seed"]) == list(SEEDS) and res.lost_left_out == [lost_id]
    for frame in (res.runs, res.steps, res.evals, res.events):
        assert lost_id not in set(frame["run_id"])
    assert lost_id not in res.manifests
    everything = load_suite(suite, include_lost=True)
    assert len(everything.runs) == 4 and everything.lost_left_out == []
    assert everything.runs.set_index("run_id")["lost_workers"].to_dict()[lost_id] == 1
    # a run written before the summary carried lost_workers: its worker_lost event says it
    manifest = json.loads((suite / lost_id / "manifest.json").read_text())
    del manifest["summary"]["lost_workers"]
    (suite / lost_id / "manifest.json").write_text(json.dumps(manifest))
    assert load_suite(suite).lost_left_out == [lost_id]


def test_a_suite_of_lost_runs_only_is_one_line(tmp_path):
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0, batch_size=16, options={"consistency": "asp"})
    fake_run(tmp_path, "faults", spec, step_s=0.002, lost=(0,))
    with pytest.raises(OnlyLostRuns, match=rf"every run \(1\) lost a worker .*; {INCLUDE_LOST_FLAG} reads them"):
        load_suite(tmp_path / "faults")
    assert len(load_suite(tmp_path / "faults", include_lost=True).runs) == 1
    assert cli.main(["report", str(tmp_path / "faults")]) == 2


def _systems_row(report_md: str) -> list[str]:
    line = next(x for x in report_md.splitlines() if x.startswith("| mlp-digits | ps |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_report_leaves_the_run_out_and_says_so(tmp_path, capsys):
    suite = _ps_suite(tmp_path)
    assert cli.main(["report", str(suite)]) == 0
    printed = capsys.readouterr().out
    assert LEFT_OUT.search(printed), printed
    md = (suite / "report.md").read_text()
    assert "3 runs of 1 system(s)" in md and LEFT_OUT.search(md)
    without = _systems_row(md)
    assert without[7] == "3"  # the runs column
    assert cli.main(["report", str(suite), INCLUDE_LOST_FLAG]) == 0
    assert not LEFT_OUT.search(capsys.readouterr().out)
    md = (suite / "report.md").read_text()
    assert "4 runs of 1 system(s)" in md and not LEFT_OUT.search(md)
    pooled = _systems_row(md)
    assert pooled[7] == "4"
    # the slow lost run moves the mean samples/s when pooled
    assert float(pooled[8].replace(",", "")) < 0.9 * float(without[8].replace(",", ""))


def test_compare_leaves_the_run_out_and_says_so(tmp_path, capsys):
    a, b = _ps_suite(tmp_path / "a"), _ps_suite(tmp_path / "b", speed=2.0, lost_seed=None)
    table, _, _ = compare_sides(load_side(a), load_side(b))
    speed = table.set_index("metric").loc["samples/s"]
    assert speed["n A"] == 3 and 1.9 < speed["ratio B/A"] < 2.1
    assert load_side(a).lost_left_out == 1 and load_side(b).lost_left_out == 0
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "ab")]) == 0
    printed = capsys.readouterr().out
    assert len(LEFT_OUT.findall(printed)) == 1 and f"of A ({a})" in printed
    assert LEFT_OUT.search((tmp_path / "ab" / "compare.md").read_text())
    # asked, the lost run is counted, and pulls A's mean down (B/A rises)
    pooled, _, _ = compare_sides(load_side(a, include_lost=True), load_side(b, include_lost=True))
    pooled_speed = pooled.set_index("metric").loc["samples/s"]
    assert pooled_speed["n A"] == 4 and pooled_speed["ratio B/A"] > 2.2
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "ab2"), INCLUDE_LOST_FLAG]) == 0
    assert not LEFT_OUT.search(capsys.readouterr().out)
    # a run folder that lost a worker is no side at all
    assert load_side(a / _lost_run_id(a)).lost_left_out == 1


def _throughput_suite(root: Path) -> Path:
    """ps bsp at 20 ms a step, spark-mllib and spark-barrier slower with more workers, over 3 seeds;
    spark-mllib's seed-2 run at 8 workers lost a worker and ran far faster (pooled, it would close the gap)."""
    for seed in range(3):
        for workers in (1, 8):
            for system, step_s in (("ps", 0.02), ("spark-mllib", 0.3 * (1 + 0.2 * workers)),
                                   ("spark-barrier", 0.1 * (1 + 0.2 * workers))):
                spec = RunSpec(system, "mlp-digits", workers=workers, seed=seed, batch_size=8,
                               options={"consistency": "bsp"} if system == "ps" else {})
                lost = (7,) if (system, workers, seed) == ("spark-mllib", 8, 2) else ()
                fake_run(root, "throughput", spec, step_s=0.01 if lost else step_s * (1 + 0.01 * seed * (system == "ps")),
                         steps=60, lost=lost)
    return root / "throughput"


TWIN_ROW = r"\| mlp-digits \| 8 \| ps \(bsp\) ÷ spark-mllib \|[^\n]*\(n={}\)"


def test_thesis_leaves_the_run_out_and_says_so(tmp_path, capsys):
    _throughput_suite(tmp_path)
    fake_run(tmp_path, "faults", RunSpec("ps", "mlp-digits", workers=2, batch_size=8), step_s=0.002, lost=(1,))
    found, left_out = thesis.collect(tmp_path)
    assert left_out == 2  # the throughput suite's lost run, and the faults suite (every run lost)
    (kept,) = found
    assert kept.verdict == Verdict.REPRODUCED and re.search(TWIN_ROW.format(2), kept.detail), kept.detail
    assert cli.main(["thesis", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if "that lost a worker" in x)
    assert line.startswith("psbench thesis: Left out 2 run(s) of ") and INCLUDE_LOST_FLAG in line
    assert "that lost a worker" in (tmp_path / "thesis.md").read_text()
    # asked, the lost runs count: the fast spark-mllib run is paired with its seed at 8 workers and
    # pulls that twin's interval under the margin
    (pooled,), left_out = thesis.collect(tmp_path, include_lost=True)
    assert left_out == 0 and re.search(TWIN_ROW.format(3), pooled.detail), pooled.detail
    assert pooled.verdict != Verdict.REPRODUCED
    assert cli.main(["thesis", str(tmp_path), INCLUDE_LOST_FLAG]) == 0
    assert "that lost a worker" not in capsys.readouterr().out
    assert "that lost a worker" not in (tmp_path / "thesis.md").read_text()


def test_tolerating_a_loss_is_an_explicit_asp_or_ssp_option():
    assert PSOptions().tolerate_worker_loss is False
    assert PSOptions(consistency="ssp:2", tolerate_worker_loss=True).faults(2).tolerate_worker_loss
    assert not PSOptions(consistency="asp").faults(2).tolerate_worker_loss
    with pytest.raises(ConfigError, match="tolerate_worker_loss needs consistency asp or ssp:S"):
        PSOptions(consistency="bsp", tolerate_worker_loss=True)
