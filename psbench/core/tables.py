"""Reading a run's record tables back, whichever format they were written in (Parquet or CSV).

Both formats read into the same frame: the schema's columns with plain numpy types, as pandas
reads a CSV (text as object, an integer column with a missing value as float64 with NaN), so
code built on the frames never cares which format a run was written in. A file that does not
parse, lacks a schema column or holds text in a numeric column is a ConfigError naming the file.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from psbench.core.errors import ConfigError
from psbench.core.records import COLUMNS, RECORD_FORMATS, STEP_TIME_COLUMNS, TABLES

NUMERIC_TYPES = {"Int64", "int64", "float64"}
# In a run folder in place of its steps table: the table was dropped after the run to keep a results
# folder small (`psbench slim`, bench/harness/slim.py); it names the file, its rows, size and sha256.
STEPS_DROPPED = "steps.dropped.json"


def table_file(run_dir: Path, table: str) -> Path | None:
    """The file holding `table` in a run folder (steps.parquet or steps.csv), None if neither."""
    found = [Path(run_dir) / f"{table}.{fmt}" for fmt in RECORD_FORMATS if (Path(run_dir) / f"{table}.{fmt}").is_file()]
    if len(found) > 1:
        raise ConfigError(f"{run_dir}: both {found[0].name} and {found[1].name}; a run's table is one file")
    return found[0] if found else None


def steps_kept(run_dir: Path) -> bool:
    """Whether a run folder holds its steps table (True) or the mark of its drop (False); a folder
    with neither is incomplete: an error naming it."""
    if table_file(run_dir, "steps") is not None:
        return True
    if (Path(run_dir) / STEPS_DROPPED).is_file():
        return False
    raise ConfigError(f"{run_dir}: no steps table (steps.parquet or steps.csv) and no {STEPS_DROPPED} "
                      "(`psbench slim` writes it where it drops one); the run folder is incomplete")


def table_files(run_dir: Path) -> dict[str, Path]:
    """table name -> file, for the tables this run folder holds."""
    return {table: file for table in TABLES if (file := table_file(run_dir, table)) is not None}


def read_table(run_dir: Path, table: str) -> pd.DataFrame:
    """One table of one run folder; a missing table reads as an empty frame with its columns."""
    file = table_file(run_dir, table)
    return pd.DataFrame(columns=TABLES[table]) if file is None else read_table_file(file)


def read_table_file(file: Path) -> pd.DataFrame:
    """A steps/evals/events file (.parquet or .csv), checked against the schema."""
    file = Path(file)
    table, _, fmt = file.name.rpartition(".")
    if table not in TABLES or fmt not in RECORD_FORMATS:
        raise ConfigError(f"{file}: not a record table ({', '.join(TABLES)} as .{' or .'.join(RECORD_FORMATS)})")
    columns = TABLES[table]
    frame = _read_parquet(file) if fmt == "parquet" else _read_csv(file, columns)
    for col in (c for c in STEP_TIME_COLUMNS if c in columns and c not in frame.columns):
        frame[col] = float("nan")  # written before steps carried a time breakdown
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ConfigError(f"{file}: not a psbench {file.name}, missing column(s) {', '.join(missing)}")
    for col in frame.columns:
        if COLUMNS.get(col, ("",))[0] in NUMERIC_TYPES:
            converted = pd.to_numeric(frame[col], errors="coerce")
            if converted.isna().sum() > frame[col].isna().sum():
                raise ConfigError(f"{file}: column {col} holds non-numeric values")
            frame[col] = converted
    return frame[columns]


def _read_parquet(file: Path) -> pd.DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # ignore_metadata: numpy types (object, float64 with NaN), the same frame a CSV reads into.
        return pq.read_table(file).to_pandas(ignore_metadata=True)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"{file}: corrupt Parquet ({str(exc).splitlines()[0]})") from None


def _read_csv(file: Path, columns: list[str]) -> pd.DataFrame:
    try:
        return pd.read_csv(file)
    except pd.errors.EmptyDataError:
        return pd.DataFrame(columns=columns)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{file}: corrupt CSV ({str(exc).splitlines()[0]})") from None
