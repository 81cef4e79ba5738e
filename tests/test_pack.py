"""`psbench pack`: a suite's run folders as one compressed table a kind, read back as the same suite."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from psbench.bench.cli import main
from psbench.bench.harness import store
from psbench.bench.harness.pack import pack_suite
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import is_complete
from psbench.bench.harness.slim import drop_steps
from psbench.bench.report import thesis
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from tests.report_fixtures import fake_run


def _suite(root: Path, seeds=range(3)) -> Path:
    for seed in seeds:
        for system in ("ps", "ddp"):
            fake_run(root, "s", RunSpec(system, "mlp-digits", workers=2, seed=seed), step_s=0.01 * (1 + seed),
                     shards=True)
    return root / "s"


def _frames(res) -> dict[str, pd.DataFrame]:
    runs = res.runs.drop(columns="dir").sort_values("run_id").reset_index(drop=True)
    out = {"runs": runs}
    for name in ("steps", "evals", "events", "shard_counts"):
        frame = getattr(res, name)
        out[name] = frame.sort_values(list(frame.columns)).reset_index(drop=True)
    return out


def test_a_packed_suite_reads_back_as_its_folders(tmp_path):
    suite = _suite(tmp_path)
    drop_steps(next(p for p in sorted(suite.iterdir()) if p.name.startswith("ps-")))  # one slimmed run
    before = load_suite(suite)
    report = pack_suite(suite)
    assert report.runs == report.folders_packed == 6
    assert sorted(p.name for p in suite.iterdir()) == [store.PACKED_DIR]
    assert sorted(p.name for p in (suite / store.PACKED_DIR).iterdir()) == [
        "evals.parquet", "events.parquet", "runs.parquet", "steps.parquet"]
    after = load_suite(suite)
    for name, frame in _frames(before).items():
        pd.testing.assert_frame_equal(frame, _frames(after)[name], check_dtype=False)
    assert after.manifests == before.manifests and (~after.runs["steps_kept"]).sum() == 1
    assert [f.verdict for f in thesis.findings(after)] == [f.verdict for f in thesis.findings(before)]


def test_runs_added_after_packing_join_the_pack_and_resume_counts_packed_runs(tmp_path):
    suite = _suite(tmp_path, seeds=[0])
    pack_suite(suite)
    spec = RunSpec("ps", "mlp-digits", workers=2, seed=0)
    assert is_complete(tmp_path, "s", spec)  # packed: done, not rerun
    _suite(tmp_path, seeds=[1])
    assert len(load_suite(suite).runs) == 4  # packed and folders read together
    assert pack_suite(suite).folders_packed == 2 and len(load_suite(suite).runs) == 4


def test_a_run_both_packed_and_in_a_folder_is_an_error_naming_it(tmp_path):
    suite = _suite(tmp_path, seeds=[0])
    keep = tmp_path / "copy"
    shutil.copytree(suite, keep)
    pack_suite(suite)
    run = next(p for p in keep.iterdir())
    shutil.copytree(run, suite / run.name)
    with pytest.raises(ConfigError, match=f"run {run.name} appears twice"):
        load_suite(suite)


def test_a_damaged_pack_is_an_error_and_the_command_reports_sizes(tmp_path, capsys):
    suite = _suite(tmp_path, seeds=[0])
    assert main(["pack", str(suite)]) == 0
    assert "2 runs (2 folders packed now)" in capsys.readouterr().out
    runs_file = suite / store.PACKED_DIR / "runs.parquet"
    frame = pd.read_parquet(runs_file)
    frame.loc[0, "manifest"] = json.dumps({"run_id": "someone-else"})
    frame.to_parquet(runs_file)
    with pytest.raises(ConfigError, match="names another run"):
        load_suite(suite)
    runs_file.write_bytes(b"not parquet")
    assert main(["report", str(suite)]) == 2
    assert "corrupt Parquet" in capsys.readouterr().err
