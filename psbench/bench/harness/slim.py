"""`psbench slim`: drop a suite's per-step records but for a sample of its seeds, so a results folder
stays small enough to commit.

A run's per-step table (steps.parquet, one row per worker step) is most of its bytes: 136 KB of a
12-worker sharding run's 155. The powered sharding design (1,320 runs) would carry 180 MB of them,
past what one submission may hold, while its verdict reads only what a run keeps besides: the
evaluations (final training and validation accuracy), the manifest's summary (which holds the
step count, median step and staleness figures computed from the rows when the run ended), the
events and the shard report. `slim` keeps every file of the runs whose seed is below --keep-seeds
(the same seeds in every configuration, so per-step figures still cover each cell), and for every
other run replaces the steps table by steps.dropped.json: the dropped file's name, rows, size and
sha256. Nothing measured is changed; the report says how many runs kept their steps and draws its
per-step figures from those (bench/harness/results.py steps_kept).
"""
from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from psbench.bench.harness.store import PACKED_DIR
from psbench.core.atomic import atomic_write_json
from psbench.core.errors import ConfigError
from psbench.core.tables import STEPS_DROPPED as DROPPED_MARK, read_table_file, steps_kept, table_file


@dataclass
class SlimReport:
    runs: int
    kept: int           # runs that keep their per-step table
    dropped_now: int    # tables dropped by this call
    bytes_freed: int


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with file.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def drop_steps(run_dir: Path) -> int:
    """Replace one run's steps table by its mark; the bytes freed (0 if already dropped). The mark
    is written (atomically) before the table is removed: an interrupted call leaves both, which
    reads as kept, and the next call finishes it."""
    if not steps_kept(run_dir):
        return 0
    file = table_file(run_dir, "steps")
    size = file.stat().st_size
    mark = {"table": "steps", "file": file.name, "rows": len(read_table_file(file)), "bytes": size,
            "sha256": _sha256(file), "dropped_by": "psbench slim"}
    atomic_write_json(run_dir / DROPPED_MARK, mark)
    file.unlink()
    return size


def slim_suite(suite_dir: Path, keep_seeds: int) -> SlimReport:
    """Drop the steps table of every run of `suite_dir` whose seed is `keep_seeds` or more."""
    if keep_seeds < 0:
        raise ConfigError(f"--keep-seeds {keep_seeds}: give 0 or more (the runs of seeds 0..N-1 keep their steps)")
    suite_dir = Path(suite_dir)
    run_dirs = sorted(d for d in suite_dir.iterdir() if d.is_dir() and (d / "manifest.json").is_file()) \
        if suite_dir.is_dir() else []
    if not run_dirs and (suite_dir / PACKED_DIR).is_dir():
        raise ConfigError(f"{suite_dir}: its runs are packed ({PACKED_DIR}/); slim a suite before `psbench pack`")
    if not run_dirs:
        raise ConfigError(f"{suite_dir} holds no completed runs (no <run>/manifest.json); give results/<suite>")
    kept = dropped = freed = 0
    for run_dir in run_dirs:
        seed = json.loads((run_dir / "manifest.json").read_text()).get("seed")
        if not isinstance(seed, int):
            raise ConfigError(f"{run_dir / 'manifest.json'}: no integer seed; cannot tell whether to keep its steps")
        if seed < keep_seeds:
            kept += steps_kept(run_dir)
            continue
        size = drop_steps(run_dir)
        dropped += size > 0
        freed += size
    return SlimReport(len(run_dirs), kept, dropped, freed)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suite", type=Path, nargs="+", help="suite folder(s), results/<suite>")
    p.add_argument("--keep-seeds", type=int, required=True, metavar="N",
                   help="the runs of seeds 0..N-1 keep their per-step records; every other run's steps table is "
                        f"replaced by {DROPPED_MARK} (rows, size, sha256)")
    p.epilog = ("example: psbench slim results/sharding-powered --keep-seeds 5   # per-step figures from seeds 0-4 "
                "of every configuration; verdicts, evaluations and summaries from every run")


def main(args: argparse.Namespace) -> int:
    for suite in args.suite:
        report = slim_suite(suite, args.keep_seeds)
        print(f"{suite}: {report.runs} runs, {report.kept} keep their steps, {report.dropped_now} dropped now "
              f"({report.bytes_freed / 1e6:.1f} MB freed)")
    return 0
