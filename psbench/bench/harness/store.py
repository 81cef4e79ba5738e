"""A suite's runs on disk, in either of two forms, read through one interface.

Folders: results/<suite>/<run-id>/ {manifest.json, steps, evals, events, shards.json}, as a run
writes them (psbench.core.records). Packed (`psbench pack`): results/<suite>/records/ with one
zstd-compressed Parquet table a kind: runs.parquet (a row a run: its manifest, shard report and,
where `psbench slim` dropped its steps, the drop's mark, each as JSON text) and steps, evals and
events (every run's rows, run_id in each). A reference of thousands of runs is then a handful of
files a suite, not tens of thousands, and a few MB instead of a hundred. Readers never care which
form a suite is in; a suite may hold both (a packed reference and runs added since), and the same
run in both is an error naming it.

The packed record tables are encoded compactly (ENCODING_VERSION, named in each file's key-value
metadata; a file without it is version 1, the frames as they were) and read back as the folders'
frames: float seconds, float64 losses, the same columns in the same row order.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from psbench.bench.harness.schema import check_manifest
from psbench.core.atomic import atomic_write
from psbench.core.errors import ConfigError
from psbench.core.records import COLUMNS, STEP_TIME_COLUMNS, TABLES
from psbench.core.tables import STEPS_DROPPED, read_table_file, steps_kept, table_files

PACKED_DIR = "records"
RUNS_TABLE = "runs"
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 19  # packing is rare and reading does not pay for the level

# Version 2 of the packed record tables. Times are whole ticks of their clock: t_wall is a difference
# of epoch-second doubles (time.time(), the Recorder's clock), each a whole multiple of 2**-22 s
# (0.24 us) from 2004 to 2038 and of 2**-21 s after, so 2**-22 s ticks hold it exactly; a step's parts
# are perf_counter differences, a clock of nanoseconds, so nanoseconds hold them (a microsecond would
# move the report's medians of 20 us parts in their third digit). A column holding an infinity stays
# float. A float column whose every value is a float32 is stored as float32, exactly: a step's loss
# is a float32 tensor's (systems/common.py), while an evaluation's mean loss, spark-mllib-native's
# numpy loss and accuracies are float64 and stay so. Integer columns are integers (null where
# missing). step and t_wall climb within a worker: delta-encoded; floats and the parts: byte-split.
# Rows stay in the order recorded, each run's together (sorting by run, worker and step made the
# reference's steps larger, and would reorder runs whose workers' rows interleave).
ENCODING_KEY = b"psbench.packed"
ENCODING_VERSION = 2
TIME_COLUMNS = ["t_wall", *STEP_TIME_COLUMNS]
TICKS_PER_S = {"t_wall": 2**22, **{column: 10**9 for column in STEP_TIME_COLUMNS}}
PRECISION = "t_wall within 0.12 us, a step's parts within 0.5 ns, everything else exactly"
DELTA_COLUMNS = {"step", "t_wall"}


@dataclass
class RunRecord:
    """One run as stored: its manifest, its tables, its shard report and, where its steps were
    dropped, the drop's mark. `where` is its folder, or records/<run-id> for a packed run."""
    manifest: dict[str, Any]
    where: Path
    steps_kept: bool
    tables: dict[str, pd.DataFrame]
    shards: dict[str, Any] | None
    steps_dropped: dict[str, Any] | None

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])


def run_folders(suite_dir: Path, not_runs: set[str]) -> list[Path]:
    """The run folders of a suite folder; anything else but `not_runs` (what reports write beside
    them) and the packed records is an error naming it."""
    found: list[Path] = []
    for entry in sorted(Path(suite_dir).iterdir()):
        if entry.name.startswith(".") or entry.name in not_runs or entry.name == PACKED_DIR:
            continue  # staging/old run dirs, atomic-write temp files, our own outputs
        if entry.is_dir() and (entry / "manifest.json").is_file():
            found.append(entry)
        elif entry.is_dir() and is_suite(entry):
            raise ConfigError(f"{suite_dir} looks like a results root ({entry.name}/ is a suite); "
                              f"give one suite folder, e.g. {entry}")
        else:
            raise ConfigError(f"{entry}: not a psbench run folder (no manifest.json); a suite folder holds only "
                              f"run folders, {PACKED_DIR}/ and {', '.join(sorted(not_runs))}")
    return found


def runs_file(suite_dir: Path) -> Path:
    """The packed runs table of a suite (it exists only once the suite is packed)."""
    return Path(suite_dir) / PACKED_DIR / f"{RUNS_TABLE}.parquet"


def is_suite(path: Path) -> bool:
    """Whether a folder holds runs: run folders, packed records, or both."""
    path = Path(path)
    return path.is_dir() and (runs_file(path).is_file()
                              or any((child / "manifest.json").is_file() for child in path.iterdir() if child.is_dir()))


def _json_file(file: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: corrupt {what}, not valid JSON ({exc})") from None


def read_run_folder(run_dir: Path) -> RunRecord:
    run_dir = Path(run_dir)
    manifest = check_manifest(_json_file(run_dir / "manifest.json", "manifest"), run_dir / "manifest.json")
    shards = _json_file(run_dir / "shards.json", "shard report") if (run_dir / "shards.json").is_file() else None
    kept = steps_kept(run_dir)
    dropped = None if kept else _json_file(run_dir / STEPS_DROPPED, "drop mark")
    tables = {name: read_table_file(file) for name, file in table_files(run_dir).items()}
    return RunRecord(manifest, run_dir, kept, tables, shards, dropped)


def _optional_json(text: Any, where: str) -> dict[str, Any] | None:
    if text is None or (isinstance(text, float) and text != text):
        return None
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: corrupt JSON ({exc})") from None


def read_packed(suite_dir: Path) -> list[RunRecord]:
    """The runs packed in <suite>/records/ (none if it holds no runs table)."""
    folder, table = Path(suite_dir) / PACKED_DIR, runs_file(suite_dir)
    if not table.is_file():
        return []
    try:
        runs = pd.read_parquet(table)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise ConfigError(f"{table}: corrupt Parquet ({str(exc).splitlines()[0]})") from None
    missing = {"run_id", "manifest", "shards", "steps_kept", "steps_dropped"} - set(runs.columns)
    if missing:
        raise ConfigError(f"{table}: not a packed runs table, missing column(s) {', '.join(sorted(missing))}")
    by_run: dict[str, dict[str, pd.DataFrame]] = {str(r): {} for r in runs["run_id"]}
    for name in TABLES:
        file = folder / f"{name}.parquet"
        if not file.is_file():
            continue
        frame = read_packed_table(file)
        stray = set(frame["run_id"].astype(str)) - set(by_run)
        if stray:
            raise ConfigError(f"{file}: rows of run(s) not in {table.name}: {', '.join(sorted(stray)[:3])}")
        for run_id, rows in frame.groupby(frame["run_id"].astype(str), sort=False):
            by_run[run_id][name] = rows.reset_index(drop=True)
    out = []
    for row in runs.itertuples(index=False):
        where = folder / str(row.run_id)
        manifest = _optional_json(row.manifest, f"{table} ({row.run_id}) manifest")
        if not isinstance(manifest, dict) or manifest.get("run_id") != row.run_id:
            raise ConfigError(f"{table}: the manifest of {row.run_id} is missing or names another run")
        check_manifest(manifest, where)
        out.append(RunRecord(manifest, where, bool(row.steps_kept), by_run[str(row.run_id)],
                             _optional_json(row.shards, f"{table} ({row.run_id}) shards"),
                             _optional_json(row.steps_dropped, f"{table} ({row.run_id}) steps_dropped")))
    return out


def suite_records(suite_dir: Path, not_runs: set[str]) -> list[RunRecord]:
    """Every run of a suite, packed first, then folders; a run in both is an error."""
    records = read_packed(suite_dir) + [read_run_folder(d) for d in run_folders(suite_dir, not_runs)]
    seen: dict[str, Path] = {}
    for rec in records:
        if rec.run_id in seen:
            raise ConfigError(f"run {rec.run_id} appears twice in {suite_dir}: {seen[rec.run_id]} and {rec.where}")
        seen[rec.run_id] = rec.where
    return records


def suite_manifests(suite_dir: Path) -> list[dict[str, Any]]:
    """Every run's manifest, in either form, without reading its tables."""
    out = read_packed_manifests(suite_dir)
    out += [_json_file(f, "manifest") for f in sorted(Path(suite_dir).glob("*/manifest.json"))]
    return out


def packed_hashes(suite_dir: Path) -> dict[str, str | None]:
    """run id -> config hash of the runs packed in a suite (none if it is not packed)."""
    return {m["run_id"]: m.get("config_hash") for m in read_packed_manifests(suite_dir)}


def read_packed_manifests(suite_dir: Path) -> list[dict[str, Any]]:
    table = runs_file(suite_dir)
    if not table.is_file():
        return []
    return [json.loads(text) for text in pd.read_parquet(table, columns=["manifest"])["manifest"]]


def read_packed_table(file: Path) -> pd.DataFrame:
    """A packed steps/evals/events table as a run folder's frame: its encoding undone."""
    frame = read_table_file(file)
    for column, how in _encoding(file).items():
        if column not in frame.columns:
            raise ConfigError(f"{file}: its encoding names column {column}, which it does not hold")
        if how.startswith("ticks:"):
            frame[column] = frame[column].astype(np.float64) / int(how.partition(":")[2])
        elif how == "float32":
            frame[column] = frame[column].astype(np.float64)  # exactly the float64 it was
    return frame


def _encoding(file: Path) -> dict[str, str]:
    """column -> how it is stored ('ticks:<per second>', 'float32', 'int'); {} for a version-1 file
    (the frames as they were)."""
    import pyarrow.parquet as pq

    text = (pq.read_schema(file).metadata or {}).get(ENCODING_KEY)
    if text is None:
        return {}
    try:
        meta = json.loads(text)
        version, columns = int(meta["version"]), dict(meta["columns"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{file}: corrupt {ENCODING_KEY.decode()} metadata ({exc})") from None
    if version > ENCODING_VERSION:
        raise ConfigError(f"{file}: packed by a newer psbench (encoding version {version}; this one reads "
                          f"1 to {ENCODING_VERSION})")
    odd = [f"{c}: {how}" for c, how in columns.items() if how not in ("int", "float32") and not (
        isinstance(how, str) and how.startswith("ticks:") and how.partition(":")[2].isdigit()
        and int(how.partition(":")[2]) > 0)]
    if odd:
        raise ConfigError(f"{file}: unknown column encoding(s) {', '.join(odd)} (allowed: int, float32, "
                          "ticks:<per second>)")
    return columns


def encode_table(frame: pd.DataFrame):  # -> pyarrow.Table
    """A record table as version 2 stores it (see ENCODING_VERSION), its encoding in the metadata."""
    import pyarrow as pa

    arrays, encoding = {}, {}
    for column in frame.columns:
        values, kind = frame[column], COLUMNS.get(column, ("",))[0]
        array = None
        if column in TIME_COLUMNS:
            array = _whole_numbers(np.round(_floats(values) * TICKS_PER_S[column]))
            encoding[column] = f"ticks:{TICKS_PER_S[column]}" if array is not None else "float64"
        elif kind == "Int64":
            array = (pa.array(values, type=pa.int64()) if pd.api.types.is_integer_dtype(values.dtype)
                     else _whole_numbers(_floats(values)))
            encoding[column] = "int" if array is not None else "float64"
        elif kind == "float64":
            floats = _floats(values)
            narrow = floats.astype(np.float32)
            exact = np.array_equal(narrow.astype(np.float64), floats, equal_nan=True)
            array = pa.array(narrow if exact else floats, from_pandas=True)
            encoding[column] = "float32" if exact else "float64"
        arrays[column] = array if array is not None else pa.array(values, from_pandas=True)
    table = pa.table(arrays)
    meta = {"version": ENCODING_VERSION, "columns": {c: how for c, how in encoding.items() if how != "float64"}}
    return table.replace_schema_metadata({ENCODING_KEY: json.dumps(meta, sort_keys=True).encode()})


def _floats(values: pd.Series) -> np.ndarray:
    return pd.to_numeric(values).to_numpy(dtype=np.float64, na_value=np.nan)


def _whole_numbers(floats: np.ndarray):  # -> pyarrow.Array | None
    """Whole numbers held as floats as a nullable int64 array; None if one is not whole or too big
    for a float to hold it exactly (NaN is null)."""
    import pyarrow as pa

    missing = np.isnan(floats)
    present = floats[~missing]
    if not (np.isfinite(present).all() and (present == np.trunc(present)).all() and (np.abs(present) < 2**53).all()):
        return None
    return pa.array(np.where(missing, 0, floats).astype(np.int64), mask=missing)


def table_difference(left: pd.DataFrame, right: pd.DataFrame) -> str | None:
    """Where two frames of one table differ at the recorded precision (times within
    half a tick of TICKS_PER_S, everything else exactly), in a line; None where they match."""
    if list(left.columns) != list(right.columns) or len(left) != len(right):
        return f"columns {list(left.columns)} ({len(left)} rows) against {list(right.columns)} ({len(right)} rows)"
    left, right = left.reset_index(drop=True), right.reset_index(drop=True)
    times = [c for c in TIME_COLUMNS if c in left.columns]
    for column in times:
        a, b = _floats(left[column]), _floats(right[column])
        # half a tick, give or take the last bits of the seconds' doubles
        half_tick = 0.5 / TICKS_PER_S[column]
        off = ~((np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= half_tick + 4 * np.spacing(np.abs(a))))
        if off.any():
            row = int(np.flatnonzero(off)[0])
            return f"{column} row {row}: {float(a[row])!r} against {float(b[row])!r}"
    try:
        pd.testing.assert_frame_equal(left.drop(columns=times), right.drop(columns=times),
                                      check_dtype=False, check_exact=True)
    except AssertionError as exc:
        return " ".join(str(exc).split())
    return None


def write_packed(suite_dir: Path, records: list[RunRecord]) -> list[Path]:
    """Write `records` as <suite>/records/ (each table to a temp file, then renamed); the files."""
    import pyarrow as pa

    folder = Path(suite_dir) / PACKED_DIR
    runs = pd.DataFrame({
        "run_id": [r.run_id for r in records],
        "manifest": [json.dumps(r.manifest, sort_keys=True) for r in records],
        "shards": [json.dumps(r.shards, sort_keys=True) if r.shards is not None else None for r in records],
        "steps_kept": [r.steps_kept for r in records],
        "steps_dropped": [json.dumps(r.steps_dropped, sort_keys=True) if r.steps_dropped is not None else None
                          for r in records]})
    written = [folder / f"{RUNS_TABLE}.parquet"]
    _write(written[0], pa.Table.from_pandas(runs, preserve_index=False))
    for name, columns in TABLES.items():
        frames = [r.tables[name] for r in records if name in r.tables and len(r.tables[name])]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
        written.append(folder / f"{name}.parquet")
        _write(written[-1], encode_table(frame[columns]))
    return written


def _write(path: Path, table) -> None:  # table: pyarrow.Table
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {field.name: field.type for field in table.schema}
    strings = [c for c, t in types.items() if pa.types.is_string(t) or pa.types.is_large_string(t)]
    encodings = {c: "DELTA_BINARY_PACKED" for c, t in types.items() if c in DELTA_COLUMNS and pa.types.is_integer(t)}
    encodings |= {c: "BYTE_STREAM_SPLIT" for c, t in types.items()
                  if pa.types.is_floating(t) or (c in STEP_TIME_COLUMNS and pa.types.is_integer(t))}
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression=COMPRESSION,
                                                  compression_level=COMPRESSION_LEVEL, use_dictionary=strings,
                                                  column_encoding=encodings))
