"""Record tables as Parquet by default, CSV on request, readers taking either,
and one documented schema (psbench.core.records.COLUMNS) that the written files follow."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psbench.bench import cli
from psbench.bench.harness.results import load_suite
from psbench.core.records import COLUMNS, DEFAULT_FORMAT, RECORD_FORMATS, TABLES, Recorder
from psbench.core.spec import RunSpec
from psbench.core.tables import read_table

ROOT = Path(__file__).resolve().parent.parent
ARROW_TYPES = {"string": {pa.string(), pa.large_string()}, "Int64": {pa.int64()}, "float64": {pa.float64()}}


def _recorder(spec: RunSpec) -> Recorder:
    """Every kind of value: nulls in nullable columns, an event with JSON detail."""
    rec = Recorder(spec, target_accuracy=0.5)
    rec.start_clock()
    rec.step(0, 0, 32, 2.0, staleness=None, nbytes=None, t_wall=0.1)
    rec.step(1, 0, 32, 1.5, staleness=2, nbytes=4096, t_wall=0.2)
    rec.eval(1, "val", 1.2, 0.6, t_wall=0.3)
    rec.event("switch", step=1, t_wall=0.25, criterion="plateau")
    rec.event("note", t_wall=0.26)  # no step, no worker
    rec.stop_clock()
    return rec


def test_every_table_column_is_documented_once_with_a_type() -> None:
    for table, columns in TABLES.items():
        assert len(set(columns)) == len(columns), table
        for column in columns:
            assert column in COLUMNS, f"{table}.{column} has no line in psbench.core.records.COLUMNS"
            dtype, meaning = COLUMNS[column]
            assert dtype in ARROW_TYPES and meaning.strip(), (column, dtype)
    assert set(COLUMNS) == {c for columns in TABLES.values() for c in columns}, "documented but in no table"
    records_page = (ROOT / "docs" / "results.md").read_text()
    assert "psbench/core/records.py" in records_page and "COLUMNS" in records_page  # the docs point to the one place


def test_parquet_is_the_default_and_follows_the_schema(tmp_path: Path) -> None:
    assert DEFAULT_FORMAT == "parquet" and set(RECORD_FORMATS) == {"parquet", "csv"}
    run = _recorder(RunSpec("ps", "mlp-digits", workers=2)).finish(tmp_path, "s")
    names = {p.name for p in run.out_dir.iterdir()}
    assert {"steps.parquet", "evals.parquet", "events.parquet", "manifest.json"} <= names
    assert not any(n.endswith(".csv") for n in names)
    for table, columns in TABLES.items():
        schema = pq.read_schema(run.out_dir / f"{table}.parquet")
        assert schema.names == columns
        for column in columns:
            assert schema.field(column).type in ARROW_TYPES[COLUMNS[column][0]], (table, column)
    steps = pq.read_table(run.out_dir / "steps.parquet").to_pydict()
    assert steps["staleness"] == [None, 2] and steps["bytes"] == [None, 4096]  # nulls, not NaN floats


def test_csv_and_parquet_read_back_into_the_same_frames(tmp_path: Path) -> None:
    spec = RunSpec("ps", "mlp-digits", workers=2)
    parquet = _recorder(spec).finish(tmp_path / "a", "s")
    csv = _recorder(spec).finish(tmp_path / "b", "s", record_format="csv")
    assert (csv.out_dir / "steps.csv").is_file() and not (csv.out_dir / "steps.parquet").exists()
    for table in TABLES:
        pd.testing.assert_frame_equal(read_table(parquet.out_dir, table), read_table(csv.out_dir, table))
    events = read_table(parquet.out_dir, "events")
    assert json.loads(events["detail"].iloc[0]) == {"criterion": "plateau"}
    with pytest.raises(ValueError, match="allowed parquet, csv"):
        _recorder(spec).finish(tmp_path / "c", "s", record_format="xlsx")


def test_a_suite_mixing_formats_loads_whole(tmp_path: Path) -> None:
    _recorder(RunSpec("ps", "mlp-digits", workers=2, seed=0)).finish(tmp_path, "mixed")
    _recorder(RunSpec("ps", "mlp-digits", workers=2, seed=1)).finish(tmp_path, "mixed", record_format="csv")
    res = load_suite(tmp_path / "mixed")
    assert len(res.runs) == 2 and len(res.steps) == 4 and len(res.evals) == 2 and len(res.events) == 4
    assert res.steps["staleness"].dtype == float and res.steps["run_id"].nunique() == 2


def test_cli_format_flag(tmp_path: Path, capsys) -> None:
    base = ["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "5", "--no-progress"]
    assert cli.main([*base, "--results-dir", str(tmp_path / "csv"), "--format", "csv"]) == 0
    (run,) = (tmp_path / "csv" / "runs").iterdir()
    assert {"steps.csv", "evals.csv", "events.csv"} <= {p.name for p in run.iterdir()}
    assert len(read_table(run, "steps")) == 5
    with pytest.raises(SystemExit) as info:
        cli.main([*base, "--results-dir", str(tmp_path / "x"), "--format", "xlsx"])
    assert info.value.code == 2 and re.search(r"--format: invalid choice: 'xlsx'", capsys.readouterr().err)


def test_both_files_of_one_table_is_an_error(tmp_path: Path) -> None:
    from psbench.core.errors import ConfigError

    run = _recorder(RunSpec("single", "mlp-digits")).finish(tmp_path, "s")
    (run.out_dir / "steps.csv").write_text("run_id\n")
    with pytest.raises(ConfigError, match="both steps.parquet and steps.csv"):
        load_suite(tmp_path / "s")
