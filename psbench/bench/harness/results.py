"""Read a suite folder results/<suite>/ back into pandas frames, for plots, reports and tables.

A suite folder holds one directory per run (the layout bench.records writes), or its runs packed
in records/ (bench/harness/store.py), or both, plus what the report writes (plots/, report.md,
report.html). Anything else, or a run whose files do not parse, is a ConfigError naming the
file: a report built on half-read data would mislead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from psbench.bench.harness import store
from psbench.core.records import TABLES, median_step_interval
from psbench.core.errors import ConfigError
from psbench.core.spec import workload_label

# written into a suite folder beside its runs: by bench.report, and by `psbench netlab bench` (its table and plot)
REPORT_OUTPUTS = {"plots", "report.md", "report.html", "report.png", "cost_model.json", "bandwidth.csv", "bandwidth.png"}
FAILED_DIR = "failed"  # <suite>/failed/<run-id>.log: the harness' log of a run that failed (runner.run_one)
NOT_RUNS = REPORT_OUTPUTS | {FAILED_DIR}
INCLUDE_LOST_FLAG = "--include-lost-workers"  # report, compare, thesis: read runs that lost a worker too
SPEC_COLUMNS = ["system", "workload", "workers", "seed", "sharding", "batch_size", "epochs", "lr", "max_steps",
                "emulate_device", "stragglers"]


class OnlyLostRuns(ConfigError):
    """A suite whose every run lost a worker: nothing left to read without include_lost."""

    def __init__(self, n_runs: int, message: str):
        super().__init__(message)
        self.n_runs = n_runs


@dataclass
class SuiteResults:
    """Every run of one suite. `runs` has one row per run: spec fields, options as opt_<name>,
    summary fields, `label` (the system plus the options that tell its variants apart) and
    `steps_kept` (False where `psbench slim` dropped its per-step rows: `steps` has none of them)."""
    suite: str
    path: Path
    runs: pd.DataFrame
    steps: pd.DataFrame
    evals: pd.DataFrame
    events: pd.DataFrame
    shard_counts: pd.DataFrame  # run_id, worker, class, count (from shards.json)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    lost_left_out: list[str] = field(default_factory=list)  # run ids that lost a worker, not read (load_suite)

    @property
    def systems(self) -> list[str]:
        return sorted(self.runs["system"].unique())

    @property
    def labels(self) -> list[str]:
        return sorted(self.runs["label"].unique())

    def option_columns(self) -> list[str]:
        return [c for c in self.runs.columns if c.startswith("opt_")]


def load_suite(path: Path | str, include_lost: bool = False) -> SuiteResults:
    """The suite's runs; a run that lost a worker (a tolerated fault) is left out unless include_lost:
    it trained with fewer workers than its spec says, so it is no sample of its configuration."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"results folder {path} does not exist (give results/<suite>)")
    records = store.suite_records(path, NOT_RUNS)
    if not records:
        raise ConfigError(f"{path} holds no completed runs (no <run>/manifest.json, no {store.PACKED_DIR}/)")

    manifests: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
    shard_rows: list[dict[str, Any]] = []
    steps_kept: dict[str, bool] = {}
    for rec in records:
        manifest = rec.manifest  # checked against the schema as it was read (store.py)
        run_id = manifest["run_id"]
        manifests[run_id] = manifest
        rows.append(_run_row(manifest, rec.where))
        steps_kept[run_id] = rec.steps_kept
        for name, frame in rec.tables.items():
            frames[name].append(_checked_rows(frame, rec.where / name, run_id))
        if rec.shards is not None:
            shard_rows.extend(_shard_rows(rec.shards, rec.where / "shards.json", run_id))

    runs = pd.DataFrame(rows)
    runs = _fill_defaults(runs)
    runs["label"] = variant_labels(runs)
    runs["steps_kept"] = runs["run_id"].map(steps_kept).astype(bool)
    steps = _concat(frames["steps"], TABLES["steps"])
    # Derived from the rows themselves, so results written before the summary carried it agree; a run
    # whose rows were dropped (psbench slim) keeps its summary's, computed from them when it ended.
    per_run = {run_id: median_step_interval(group) for run_id, group in steps.groupby("run_id")}
    summary_median = pd.to_numeric(runs["median_step_s"], errors="coerce") if "median_step_s" in runs else math.nan
    runs["median_step_s"] = runs["run_id"].map(per_run).astype(float).where(runs["steps_kept"], summary_median)
    res = SuiteResults(
        suite=path.name, path=path, runs=runs.sort_values(["system", "label", "workers", "seed"]).reset_index(drop=True),
        steps=steps, evals=_concat(frames["evals"], TABLES["evals"]),
        events=_concat(frames["events"], TABLES["events"]),
        shard_counts=pd.DataFrame(shard_rows, columns=["run_id", "worker", "class", "count"]),
        manifests=manifests)
    return res if include_lost else without_lost_workers(res)


def without_lost_workers(res: SuiteResults) -> SuiteResults:
    """The suite less its runs that lost a worker (summary lost_workers, or worker_lost events in runs
    written before the summary carried it), named in lost_left_out."""
    from_events = res.events.loc[res.events["kind"] == "worker_lost", "run_id"]
    lost = res.runs.loc[(res.runs["lost_workers"] > 0) | res.runs["run_id"].isin(from_events), "run_id"]
    if lost.empty:
        return res
    if len(lost) == len(res.runs):
        raise OnlyLostRuns(len(lost), f"{res.path}: every run ({len(lost)}) lost a worker (summary lost_workers); "
                                      f"{INCLUDE_LOST_FLAG} reads them")
    kept = set(res.runs["run_id"]) - set(lost)

    def keep(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[frame["run_id"].isin(kept)].reset_index(drop=True)

    return replace(res, runs=keep(res.runs), steps=keep(res.steps), evals=keep(res.evals), events=keep(res.events),
                   shard_counts=keep(res.shard_counts), manifests={k: m for k, m in res.manifests.items() if k in kept},
                   lost_left_out=sorted(lost))


def lost_left_out_line(n_runs: int, where: str) -> str:
    """What report, compare and thesis print when load_suite left runs out ('' when none)."""
    if not n_runs:
        return ""
    return (f"Left out {n_runs} run(s) of {where} that lost a worker (summary lost_workers: fewer workers "
            f"trained than the spec says); {INCLUDE_LOST_FLAG} counts them")


# ---- reading one run ---------------------------------------------------------------------

def _run_row(manifest: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    spec = manifest["spec"]
    row: dict[str, Any] = {"run_id": manifest["run_id"], "dir": str(run_dir)}
    for key in SPEC_COLUMNS:
        row[key] = spec.get(key)
    row["workload"] = workload_label(str(row["workload"]))  # the user's own by the names they gave
    source = (manifest.get("extra") or {}).get("workload_source")
    if row["batch_size"] is None and isinstance(source, dict):  # its default, which no registry holds
        row["batch_size"] = source.get("batch_size")
    for key, value in sorted((spec.get("options") or {}).items()):
        row[f"opt_{key}"] = value
    for key, value in manifest["summary"].items():
        if not isinstance(value, (dict, list)):  # staleness_hist is re-derived from steps
            row[key] = value
    lost = manifest["summary"].get("lost_workers")
    row["lost_workers"] = len(lost) if isinstance(lost, list) else 0
    extra = manifest.get("extra") or {}
    row["setup_s"] = extra.get("setup_s")
    row["allreduce_alone_s"] = extra.get("allreduce_alone_s")  # allreduce systems: comm_s's reference
    row["ps_roundtrip_alone_s"] = extra.get("ps_roundtrip_alone_s")  # the PS's: a push + pull alone
    switch = extra.get("switch") if isinstance(extra.get("switch"), dict) else {}
    row["handover_s"] = switch.get("handover_s")
    # Whether the hand-over already lies on the training clock (then it is in t_wall and the time to
    # target); runs that kept it off the clock say nothing, and the report adds it.
    row["handover_on_clock"] = bool(switch.get("handover_on_clock", False))
    conditions = extra.get("conditions") if isinstance(extra.get("conditions"), dict) else {}
    row["oversubscribed"] = conditions.get("oversubscribed")
    for key in ("cores", "cpu_demand", "cpu_measured"):  # the CPU plan, and what the run's processes used
        row[key] = conditions.get(key)
    row["git_sha"] = manifest.get("git_sha")
    row["git_dirty"] = manifest.get("git_dirty")
    row["conditions"] = conditions_label(spec.get("emulate_device"), spec.get("stragglers"))
    if not isinstance(row.get("budget"), str):  # written before the summary named its budget
        row["budget"] = spec.get("budget") or ("steps per worker" if spec.get("max_steps") else "epochs per worker")
    return row


def conditions_label(emulate_device: str | None, stragglers: str | None) -> str:
    """The cluster conditions a run trained under, as one string ('native' when none were emulated):
    runs under other conditions are other configurations and are never pooled."""
    parts = [f"device {emulate_device}" if emulate_device else "", f"stragglers {stragglers}" if stragglers else ""]
    return ", ".join(p for p in parts if p) or "native"


def _checked_rows(frame: pd.DataFrame, where: Path, run_id: str) -> pd.DataFrame:
    if len(frame) and set(frame["run_id"].astype(str)) != {run_id}:
        raise ConfigError(f"{where}: rows belong to another run than {run_id}")
    return frame


def _shard_rows(report: dict[str, Any], where: Path, run_id: str) -> list[dict[str, Any]]:
    try:
        counts = report["class_counts"]
        return [{"run_id": run_id, "worker": w, "class": c, "count": int(n)}
                for w, per_class in enumerate(counts) for c, n in enumerate(per_class)]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: corrupt shard report ({type(exc).__name__}: {exc})") from None


def _concat(frames: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _fill_defaults(runs: pd.DataFrame) -> pd.DataFrame:
    """Spec fields left None mean 'the workload's default': make batch size concrete so sweeps plot."""
    from psbench.workloads import WORKLOADS

    def default_batch(row: pd.Series) -> Any:
        if pd.notna(row["batch_size"]):
            return int(row["batch_size"])
        workload = WORKLOADS.get(row["workload"])
        return workload.batch_size if workload else None

    runs = runs.copy()
    runs["batch_size"] = runs.apply(default_batch, axis=1) if len(runs) else runs["batch_size"]
    runs["workers"] = runs["workers"].astype(int)
    runs["seed"] = runs["seed"].astype(int)
    runs["sharding"] = runs["sharding"].fillna("random")
    return runs


# ---- labels ------------------------------------------------------------------------------

def variant_labels(runs: pd.DataFrame) -> pd.Series:
    """'ps (asp)': the system plus the options whose values differ between that system's runs in
    this suite. A string value stands alone; others read key=value (e.g. 'ps (ssp, bound=3)')."""
    option_cols = [c for c in runs.columns if c.startswith("opt_")]
    varying: dict[str, list[str]] = {}
    for system, group in runs.groupby("system"):
        varying[system] = [c for c in option_cols
                           if group[c].astype(str).nunique(dropna=False) > 1]

    def label(row: pd.Series) -> str:
        parts = []
        for col in varying[row["system"]]:
            value = row[col]
            if value is None or (isinstance(value, float) and pd.isna(value)):
                continue
            if isinstance(value, float) and value.is_integer():  # a column with other systems' blanks is float
                value = int(value)
            parts.append(str(value) if isinstance(value, str) else f"{col[4:]}={value}")
        return f"{row['system']} ({', '.join(parts)})" if parts else str(row["system"])

    return runs.apply(label, axis=1) if len(runs) else pd.Series(dtype=str)
