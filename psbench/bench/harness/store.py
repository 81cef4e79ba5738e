"""A suite's runs on disk, in either of two forms, read through one interface.

Folders: results/<suite>/<run-id>/ {manifest.json, steps, evals, events, shards.json}, as a run
writes them (psbench.core.records). Packed (`psbench pack`): results/<suite>/records/ with one
zstd-compressed Parquet table a kind: runs.parquet (a row a run: its manifest, shard report and,
where `psbench slim` dropped its steps, the drop's mark, each as JSON text) and steps, evals and
events (every run's rows, run_id in each). A reference of thousands of runs is then a handful of
files a suite, not tens of thousands, and a few MB instead of a hundred. Readers never care which
form a suite is in; a suite may hold both (a packed reference and runs added since), and the same
run in both is an error naming it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from psbench.bench.harness.schema import check_manifest
from psbench.core.atomic import atomic_write_table
from psbench.core.errors import ConfigError
from psbench.core.records import TABLES
from psbench.core.tables import STEPS_DROPPED, read_table_file, steps_kept, table_files

PACKED_DIR = "records"
RUNS_TABLE = "runs"
COMPRESSION = "zstd"


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
        frame = read_table_file(file)
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


def write_packed(suite_dir: Path, records: list[RunRecord]) -> list[Path]:
    """Write `records` as <suite>/records/ (each table to a temp file, then renamed); the files."""
    folder = Path(suite_dir) / PACKED_DIR
    runs = pd.DataFrame({
        "run_id": [r.run_id for r in records],
        "manifest": [json.dumps(r.manifest, sort_keys=True) for r in records],
        "shards": [json.dumps(r.shards, sort_keys=True) if r.shards is not None else None for r in records],
        "steps_kept": [r.steps_kept for r in records],
        "steps_dropped": [json.dumps(r.steps_dropped, sort_keys=True) if r.steps_dropped is not None else None
                          for r in records]})
    written = [folder / f"{RUNS_TABLE}.parquet"]
    _write(written[0], runs)
    for name, columns in TABLES.items():
        frames = [r.tables[name] for r in records if name in r.tables and len(r.tables[name])]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
        written.append(folder / f"{name}.parquet")
        _write(written[-1], frame[columns])
    return written


def _write(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_table(path, frame, compression=COMPRESSION)
