"""`psbench slim`: a suite's per-step records dropped but for its first seeds; what is kept, what the
report reads from the rest, and what it says."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from psbench.bench.cli import main
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.slim import slim_suite
from psbench.bench.report.document import build_report, steps_kept_text
from psbench.bench.report.tables import sharding_table, summary_table
from psbench.bench.report.measures import annotate
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.core.tables import STEPS_DROPPED
from report_fixtures import fake_run

SEEDS = 6


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """A sharding suite: 3 strategies x 6 seeds, with shard reports, staleness and a time breakdown."""
    root = tmp_path_factory.mktemp("results")
    for strategy, spread in (("random", 0.04), ("stratified", 0.015), ("distribution-aware:3", 0.01)):
        for seed in range(SEEDS):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            # seed 5 runs 10 steps a worker, seeds 0-4 24: the too-short rule must read a dropped run's count
            fake_run(root, "sharding", spec, step_s=0.002, steps=10 if seed == 5 else 24, final_noise=spread,
                     staleness=[0, 1, 2], shards=True, parts={"compute_s": 0.5, "comm_s": 0.45})
    return root / "sharding"


@pytest.fixture
def slim(full, tmp_path) -> Path:
    suite = Path(shutil.copytree(full, tmp_path / "sharding"))
    slim_suite(suite, keep_seeds=2)
    return suite


def test_only_the_later_seeds_lose_their_steps_and_the_mark_names_the_file(full, slim):
    for run_dir in sorted(d for d in slim.iterdir() if d.is_dir()):
        seed = json.loads((run_dir / "manifest.json").read_text())["seed"]
        kept = (run_dir / "steps.parquet").is_file()
        assert kept == (seed < 2), run_dir.name
        assert (run_dir / STEPS_DROPPED).is_file() == (not kept)
        for name in ("manifest.json", "evals.parquet", "events.parquet", "shards.json"):
            assert (run_dir / name).read_bytes() == (full / run_dir.name / name).read_bytes()
        if not kept:
            mark = json.loads((run_dir / STEPS_DROPPED).read_text())
            original = (full / run_dir.name / "steps.parquet").read_bytes()
            assert mark["sha256"] == "sha256:" + hashlib.sha256(original).hexdigest()
            assert mark["bytes"] == len(original)
            assert mark["rows"] == len(pd.read_parquet(full / run_dir.name / "steps.parquet"))


def test_a_second_call_drops_nothing_more(slim):
    again = slim_suite(slim, keep_seeds=2)
    assert (again.runs, again.kept, again.dropped_now, again.bytes_freed) == (3 * SEEDS, 6, 0, 0)


def test_an_interrupted_drop_reads_as_kept_and_the_next_call_finishes_it(full, tmp_path):
    suite = Path(shutil.copytree(full, tmp_path / "sharding"))
    run_dir = next(d for d in sorted(suite.iterdir()) if d.is_dir() and "-s3-" in d.name)
    (run_dir / STEPS_DROPPED).write_text("{}")  # the mark written, the table not yet removed
    assert load_suite(suite).runs.set_index("run_id").loc[run_dir.name, "steps_kept"]
    slim_suite(suite, keep_seeds=2)
    assert not (run_dir / "steps.parquet").exists()
    assert json.loads((run_dir / STEPS_DROPPED).read_text())["rows"] > 0


def test_a_run_folder_without_steps_or_a_mark_is_an_error(full, tmp_path):
    suite = Path(shutil.copytree(full, tmp_path / "sharding"))
    victim = next(d for d in sorted(suite.iterdir()) if d.is_dir())
    (victim / "steps.parquet").unlink()
    with pytest.raises(ConfigError, match="no steps table"):
        load_suite(suite)
    with pytest.raises(ConfigError, match="no steps table"):
        slim_suite(suite, keep_seeds=0)


def test_verdict_inputs_are_the_same_and_per_step_figures_say_their_n(full, slim):
    before, after = load_suite(full), load_suite(slim)
    assert after.runs["steps_kept"].sum() == 6 and before.runs["steps_kept"].all()
    assert set(after.steps["run_id"]) == set(after.runs.loc[after.runs["steps_kept"], "run_id"])
    # what the sharding verdict reads comes from every run, unchanged
    pd.testing.assert_frame_equal(sharding_table(before), sharding_table(after))
    # a dropped run keeps its summary's median step and step count (not too short, not zero steps)
    a, b = annotate(before).runs.set_index("run_id"), annotate(after).runs.set_index("run_id")
    pd.testing.assert_series_equal(a["median_step_s"], b["median_step_s"], check_exact=False)
    pd.testing.assert_series_equal(a["steps_per_worker"], b["steps_per_worker"])
    pd.testing.assert_series_equal(a["too_short"], b["too_short"])
    assert b.loc[b["seed"] == 5, "too_short"].str.startswith("10 steps/worker").all()  # a dropped run's own count
    assert set(summary_table(after)["runs"]) == {"2 of 6 with steps"}
    assert set(summary_table(before)["runs"]) == {6}


def test_the_report_says_which_runs_kept_their_steps(slim, full):
    text = build_report(slim).markdown.read_text()
    assert "Per-step records: kept for 6 of 18 runs (seeds 0–1 of each configuration)" in text
    assert "| 2 of 6 with steps |" in text
    assert steps_kept_text(load_suite(full)) == ""  # nothing said where nothing was dropped


def test_cli_slims_and_bad_input_is_one_line(full, tmp_path, capsys):
    suite = Path(shutil.copytree(full, tmp_path / "sharding"))
    assert main(["slim", str(suite), "--keep-seeds", "5"]) == 0
    assert f"{3 * SEEDS} runs, 15 keep their steps, 3 dropped now" in capsys.readouterr().out
    assert main(["slim", str(suite), "--keep-seeds", "-1"]) == 2
    assert main(["slim", str(tmp_path / "nowhere"), "--keep-seeds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"psbench: error: --keep-seeds -1: give 0 or more (the runs of seeds 0..N-1 keep their steps)",
                   f"psbench: error: {tmp_path / 'nowhere'} holds no completed runs (no <run>/manifest.json); "
                   "give results/<suite>"]
