"""`psbench pack`: a suite's run folders as one compressed table a kind, read back as the same suite."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psbench.bench.cli import main
from psbench.bench.harness import store
from psbench.bench.harness.pack import pack_suite
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import is_complete
from psbench.bench.harness.slim import drop_steps
from psbench.bench.report import thesis
from psbench.core.errors import ConfigError
from psbench.core.records import TABLES
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



# ---- the packed encoding: times in whole ticks of their clock, float32 losses, read back as the folders ----

def _float32_losses(suite: Path) -> None:
    """Each run's step losses as the systems record them: a float32 tensor's value."""
    for file in suite.glob("*/steps.parquet"):
        frame = pd.read_parquet(file)
        frame["loss"] = frame["loss"].astype("float32").astype("float64")
        frame.to_parquet(file, index=False)


def _tables(suite: Path) -> dict[str, pd.DataFrame]:
    """Every run's rows of each kind, as packing gathers them."""
    records = store.suite_records(suite, set())
    return {name: pd.concat([r.tables[name] for r in records if name in r.tables], ignore_index=True)[columns]
            for name, columns in TABLES.items()}


def _switch_suite(root: Path) -> Path:
    """A suite whose times are no whole microseconds, with float32 step losses, staleness and events."""
    suite = _suite(root, seeds=[1])
    fake_run(root, "s", RunSpec("switch", "mlp-digits", workers=2, seed=1), step_s=0.0123457, switch_at=9,
             parts={"compute_s": 0.3137, "comm_s": 0.2}, staleness=[0, 1, 2])
    _float32_losses(suite)
    return suite


def test_packed_times_are_whole_ticks_and_losses_float32_read_back_as_the_folders(tmp_path):
    suite = _switch_suite(tmp_path)
    before = load_suite(suite)
    pack_suite(suite)
    steps = pq.read_table(suite / store.PACKED_DIR / "steps.parquet")
    assert {steps.schema.field(c).type for c in store.TIME_COLUMNS} == {pa.int64()}
    assert steps.schema.field("loss").type == pa.float32()
    assert json.loads(steps.schema.metadata[store.ENCODING_KEY])["version"] == store.ENCODING_VERSION
    evals = pq.read_table(suite / store.PACKED_DIR / "evals.parquet")
    assert evals.schema.field("loss").type == pa.float64()  # a mean over a split is no float32: kept whole
    after = load_suite(suite)
    # a run's figures are of its times: a step of 12 ms between two times each within 0.5 us moves by 1e-4 at most
    pd.testing.assert_frame_equal(_frames(after)["runs"], _frames(before)["runs"], rtol=1e-4)
    for name, old in _frames(before).items():
        new = _frames(after)[name]
        assert list(new.dtypes) == list(old.dtypes), name  # the folders' dtypes and units: float seconds
        if name == "runs":
            continue
        times = [c for c in store.TIME_COLUMNS if c in old.columns]
        for col in times:  # within half a tick of its clock
            off = (new[col] - old[col]).abs()
            half_tick = 0.5 / store.TICKS_PER_S[col] * (1 + 1e-9)
            assert (off.isna() == old[col].isna()).all() and not (off > half_tick).any(), (name, col)
        pd.testing.assert_frame_equal(new.drop(columns=times), old.drop(columns=times), check_exact=True)
    for col in ("t_wall", "compute_s"):  # the fixture's times are no whole ticks: rounded, within bounds
        assert (_frames(after)["steps"][col] != _frames(before)["steps"][col]).any()
    again = tmp_path / "again"
    store.write_packed(again, store.read_packed(suite))  # packing what was read back changes nothing
    for name in TABLES:
        assert pq.read_table(again / store.PACKED_DIR / f"{name}.parquet").equals(
            pq.read_table(suite / store.PACKED_DIR / f"{name}.parquet")), name


def test_a_table_packed_before_the_encoding_still_reads_and_a_newer_one_is_refused(tmp_path):
    suite = _switch_suite(tmp_path)
    folders = load_suite(suite)
    tables = _tables(suite)
    pack_suite(suite)
    for name, frame in tables.items():  # as packing wrote them before: each frame as it was, zstd
        frame.to_parquet(suite / store.PACKED_DIR / f"{name}.parquet", index=False, compression="zstd")
    old = load_suite(suite)
    for name, frame in _frames(folders).items():
        pd.testing.assert_frame_equal(_frames(old)[name], frame, check_exact=True)
    steps = suite / store.PACKED_DIR / "steps.parquet"
    table = store.encode_table(tables["steps"])
    pq.write_table(table.replace_schema_metadata({store.ENCODING_KEY: b'{"version": 3, "columns": {}}'}), steps)
    with pytest.raises(ConfigError, match="newer psbench .encoding version 3; this one reads 1 to 2"):
        load_suite(suite)
    pq.write_table(table.replace_schema_metadata({store.ENCODING_KEY: b'{"version": 2, "columns": {"t_wall": "ly"}}'}),
                   steps)
    with pytest.raises(ConfigError, match="unknown column encoding.s. t_wall: ly .allowed: int, float32, ticks"):
        load_suite(suite)


def test_a_row_off_by_more_than_half_a_tick_fails_the_pack_and_keeps_the_folders(tmp_path, monkeypatch):
    suite = _switch_suite(tmp_path)
    runs = sorted(p.name for p in suite.iterdir())
    frame = _tables(suite)["steps"]
    for column, sign in (("t_wall", 1), ("compute_s", -1)):
        near, row, half_tick = frame.copy(), frame[column].last_valid_index(), 0.5 / store.TICKS_PER_S[column]
        near.loc[row, column] += sign * 0.9 * half_tick
        assert store.table_difference(frame, near) is None
        near.loc[row, column] += sign * 0.3 * half_tick
        assert store.table_difference(frame, near).startswith(f"{column} row {row}:")
    near = frame.copy()
    near.loc[3, "loss"] = float(np.nextafter(np.float32(near.loc[3, "loss"]), np.float32(9)))
    assert "loss" in store.table_difference(frame, near)

    encode = store.encode_table

    def one_microsecond_late(table: pd.DataFrame):
        if "n_samples" in table.columns and len(table):  # the steps table
            table = table.copy()
            table.loc[7, "t_wall"] += 1e-6
        return encode(table)

    monkeypatch.setattr(store, "encode_table", one_microsecond_late)
    fails = re.escape(f"at {store.PRECISION} (1 differ, e.g. ") + r".*: steps t_wall row 7: 0.16 against 0.1600010"
    with pytest.raises(ConfigError, match=fails):
        pack_suite(suite)
    assert sorted(p.name for p in suite.iterdir() if p.name != store.PACKED_DIR) == runs


def test_packed_steps_take_well_under_the_old_encodings_bytes(tmp_path):
    suite = _switch_suite(tmp_path)
    old = tmp_path / "steps-old.parquet"
    _tables(suite)["steps"].to_parquet(old, index=False, compression="zstd")  # as packed before the encoding
    pack_suite(suite)
    ratio = (suite / store.PACKED_DIR / "steps.parquet").stat().st_size / old.stat().st_size
    assert ratio < 0.6, ratio
