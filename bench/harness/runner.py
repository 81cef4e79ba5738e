"""Runs RunSpecs through their system adapters; skips runs already complete (by config hash)."""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psbench.core.records import DEFAULT_FORMAT, Recorder, RunResult
from psbench.core.spec import RunSpec
from psbench.systems import get_system
from psbench.systems.base import parse_options
from psbench.workloads import get_workload
from psbench.core.errors import ConfigError
from psbench.workloads.sharding import parse_strategy


@dataclass
class PlannedRun:
    spec: RunSpec
    system_cls: type
    options: Any


def plan(spec: RunSpec) -> PlannedRun:
    """Validate everything about a spec before any run starts: names, values, options, availability."""
    system_cls = get_system(spec.system)
    workload = get_workload(spec.workload)
    parse_strategy(spec.sharding)
    max_workers = getattr(system_cls, "max_workers", None)
    if max_workers is not None and spec.workers > max_workers:
        raise ConfigError(f"system '{spec.system}' runs at most {max_workers} worker(s), got {spec.workers}")
    if workload.dataset in ("mnist", "cifar10"):
        if not spec.data_dir:
            raise ConfigError(f"workload '{spec.workload}' reads files: give --data-dir")
        if not Path(spec.data_dir).is_dir():
            raise ConfigError(f"data dir {spec.data_dir} does not exist")
    options = parse_options(system_cls.Options, spec.options, spec.system)
    reason = system_cls.unavailable_reason()
    if reason:
        raise ConfigError(f"system '{spec.system}' is not available here: {reason}")
    return PlannedRun(spec, system_cls, options)


def run_dir(results_dir: Path, suite: str, spec: RunSpec) -> Path:
    return Path(results_dir) / suite / spec.run_id


def is_complete(results_dir: Path, suite: str, spec: RunSpec) -> bool:
    """A run is complete when its manifest exists, parses and carries the same config hash."""
    manifest = run_dir(results_dir, suite, spec) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("config_hash") == spec.config_hash()
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False  # corrupt: run it again, the new directory replaces the old one whole


def clean_staging(results_dir: Path, suite: str) -> None:
    """Remove staging directories an interrupted earlier run left behind, and put back a complete
    run that was moved aside (`.old-<run>-<pid>`) when the process died before its replacement
    was renamed into place."""
    suite_dir = Path(results_dir) / suite
    if suite_dir.is_dir():
        for leftover in suite_dir.glob(".staging-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for old in suite_dir.glob(".old-*"):
            name = old.name[len(".old-"):].rpartition("-")[0]
            final = suite_dir / name
            if name and not final.exists() and (old / "manifest.json").is_file():
                os.replace(old, final)
            else:
                shutil.rmtree(old, ignore_errors=True)


def run_one(planned: PlannedRun, results_dir: Path, suite: str, record_format: str = DEFAULT_FORMAT) -> RunResult:
    spec = planned.spec
    recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
    planned.system_cls().run(spec, planned.options, recorder)
    return recorder.finish(results_dir, suite, record_format)


def run_all(specs: list[RunSpec], results_dir: Path, suite: str, resume: bool = True,
            progress: bool = True, skip_unavailable: bool = False,
            record_format: str = DEFAULT_FORMAT) -> list[RunResult | None]:
    """Validate all, then run each spec not already complete; returns results (None = skipped).
    Record tables are written as `record_format` (parquet or csv)."""
    planned: list[PlannedRun | None] = []
    for spec in specs:
        try:
            planned.append(plan(spec))
        except ConfigError as exc:
            if skip_unavailable and "is not available here" in str(exc):
                print(f"psbench: skipping {spec.run_id}: {exc}", file=sys.stderr)
                planned.append(None)
            else:
                raise
    clean_staging(results_dir, suite)
    todo = [p for p in planned if p is not None and not (resume and is_complete(results_dir, suite, p.spec))]
    skipped = sum(1 for p in planned if p is not None) - len(todo)
    if skipped:
        print(f"psbench: {skipped} run(s) of suite '{suite}' already complete, skipping (resume)", file=sys.stderr)
    results: list[RunResult | None] = []
    bar = _progress(len(todo), suite) if progress else None
    for p in todo:
        if bar is not None:
            bar.set_postfix_str(p.spec.run_id, refresh=True)
        results.append(run_one(p, results_dir, suite, record_format))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return results


def _progress(total: int, suite: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"suite {suite}", unit="run", file=sys.stderr, dynamic_ncols=True)


def run_summary(spec: RunSpec) -> dict:
    """Run a spec through the harness in this process (planned, recorded, nothing written); its summary."""
    planned = plan(spec)
    recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
    planned.system_cls().run(spec, planned.options, recorder)
    return recorder.summary()
