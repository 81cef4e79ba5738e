"""`psbench pack`: a suite's run folders packed into one compressed table a kind (store.py), so a
reference of thousands of runs is a few MB in a few files.

The packed suite is read back and compared with the folders, run by run and row by row, before any
folder is removed, at the precision the packed form keeps (store.PRECISION: t_wall in ticks of its
clock, a step's time parts in nanoseconds); a suite already packed takes the new folders in beside
what it holds.
"""
from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

from psbench.bench.harness import store
from psbench.bench.harness.results import NOT_RUNS
from psbench.core.errors import ConfigError
from psbench.core.records import TABLES


@dataclass
class PackReport:
    runs: int
    folders_packed: int
    bytes_before: int   # the run folders and any earlier records
    bytes_after: int    # the records written


def _size(paths: list[Path]) -> int:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def _difference(a: store.RunRecord, b: store.RunRecord) -> str | None:
    """Where a run read back differs from the run packed (at store.PRECISION), in a line; None if nowhere."""
    for what in ("manifest", "steps_kept", "shards", "steps_dropped"):
        if getattr(a, what) != getattr(b, what):
            return f"its {what}"
    for name in TABLES:
        left, right = a.tables.get(name), b.tables.get(name)
        if left is None or right is None:
            if (0 if left is None else len(left)) != (0 if right is None else len(right)):
                return f"{name}: a table against none"
            continue
        where = store.table_difference(left, right)
        if where is not None:
            return f"{name} {where}"
    return None


def pack_suite(suite_dir: Path) -> PackReport:
    suite_dir = Path(suite_dir)
    if not suite_dir.is_dir():
        raise ConfigError(f"results folder {suite_dir} does not exist (give results/<suite>)")
    folders = store.run_folders(suite_dir, NOT_RUNS)
    packed = store.runs_file(suite_dir).is_file()
    if not folders and not packed:
        raise ConfigError(f"{suite_dir} holds no completed runs (no <run>/manifest.json); give results/<suite>")
    records = store.suite_records(suite_dir, NOT_RUNS)  # refuses a run both packed and in a folder
    before = _size(folders + ([suite_dir / store.PACKED_DIR] if packed else []))
    if not folders:  # packed already, nothing new
        return PackReport(len(records), 0, before, before)
    written = store.write_packed(suite_dir, records)
    back = {r.run_id: r for r in store.read_packed(suite_dir)}
    wrong = {r.run_id: (_difference(r, back[r.run_id]) if r.run_id in back else "not packed") for r in records}
    wrong = {run: where for run, where in wrong.items() if where is not None}
    if wrong or len(back) != len(records):
        run, where = next(iter(wrong.items()), ("", ""))
        raise ConfigError(f"{suite_dir / store.PACKED_DIR}: the packed tables do not read back as the runs at "
                          f"{store.PRECISION} ({len(wrong)} differ, e.g. {run}: {where}); the run folders are kept")
    for folder in folders:
        shutil.rmtree(folder)
    return PackReport(len(records), len(folders), before, _size(written))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", type=Path, nargs="+", help="suite folder(s), results/<suite>")
    p.epilog = ("example: psbench pack results/reference/*/   # each suite's runs into <suite>/records/ "
                "(runs, steps, evals, events: Parquet, zstd, times in whole ticks of their clocks); report, thesis and "
                "compare read either form")


def main(args: argparse.Namespace) -> int:
    for suite in args.suite:
        if not store.is_suite(suite):
            print(f"{suite}: no runs, skipped")
            continue
        r = pack_suite(suite)
        print(f"{suite}: {r.runs} runs ({r.folders_packed} folders packed now), "
              f"{r.bytes_before / 1e6:.1f} MB -> {r.bytes_after / 1e6:.1f} MB, read back the same "
              f"({store.PRECISION})")
    return 0
