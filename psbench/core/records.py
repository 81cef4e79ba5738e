"""Metric records for one run (one row per event, tidy) and the run's manifest.

Layout: results/<suite>/<run-id>/ {manifest.json, steps, evals, events, shards.json}, each table a
Parquet file (`steps.parquet`, the default) or a CSV file (`steps.csv`, `--format csv`); readers
take either (psbench.core.tables). The record schema is here, in one place: each table's columns
(STEP_COLUMNS, EVAL_COLUMNS, EVENT_COLUMNS) and every column's type and meaning (COLUMNS).
The run directory is staged under a hidden name and renamed into place when complete.
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from psbench.core.atomic import atomic_write_json, atomic_write_table, staged_dir
from psbench.core.spec import RunSpec, workload_label

# A step row's time is split (seconds; empty where a system cannot tell), the same way on every
# path (local, netns, compose, ssh): compute_s the real gradient computation, emulated_s the sleep
# an emulated device or a straggler adds, comm_s moving gradients and parameters, wait_s waiting on
# other workers (barrier, SSP block, allGather, the slowest rank of a collective), update_s the
# optimizer step, data_s assembling the step's mini-batch, h2d_d2h_s copies between host and GPU (a PS
# worker on a GPU; zero wherever nothing is copied). Together they are the step: its interval
# on the worker's clock, the time between its end (t_wall) and the previous step's, minus
# evaluation pauses (tests/test_step_times.py holds every system to this).
HOST_GPU_COPIES = "h2d_d2h_s"  # reports show it only where some run copied (a GPU run): elsewhere it is all 0
STEP_TIME_COLUMNS = ["compute_s", "emulated_s", "comm_s", "wait_s", "update_s", "data_s", HOST_GPU_COPIES]
STEP_COLUMNS = ["run_id", "system", "workload", "worker", "step", "t_wall", "n_samples", "loss", "staleness", "bytes",
                *STEP_TIME_COLUMNS]
EVAL_COLUMNS = ["run_id", "system", "workload", "step", "t_wall", "split", "loss", "accuracy"]
EVENT_COLUMNS = ["run_id", "kind", "t_wall", "step", "worker", "detail"]
MANIFEST_VERSION = 1
TARGET_WINDOW = 3  # timer-evaluated runs: the target counts as reached when the mean of this many evaluations is

# Every column of every table: (pandas dtype on disk, meaning). 'Int64' is an integer that may be
# missing (null); Parquet files carry these types, CSV files their text. A new column needs a line
# here (tests/test_records_format.py checks that every table column has one).
COLUMNS: dict[str, tuple[str, str]] = {
    "run_id": ("string", "the run: <system>-<workload>-w<workers>-s<seed>-<config hash> (its folder's name)"),
    "system": ("string", "system adapter name (`psbench list`)"),
    "workload": ("string", "workload name (`psbench list`; the user's own: spec.workload_label)"),
    "worker": ("Int64", "worker index 0..N-1 (events: the worker concerned, or null)"),
    "step": ("Int64", "the worker's step number from 0 (evals: steps done when evaluated; events: or null)"),
    "t_wall": ("float64", "seconds on the run's training clock (set-up and evaluation pauses excluded)"),
    "n_samples": ("Int64", "examples in this step's mini-batch"),
    "loss": ("float64", "steps: the mini-batch's training loss; evals: mean loss over the split"),
    "staleness": ("Int64", "server versions between the worker's pull and the apply of its update (PS only, else null)"),
    "bytes": ("Int64", "bytes this step sent and received on the wire, when the system counts them, else null"),
    "split": ("string", "train | val"),
    "accuracy": ("float64", "accuracy over the split, 0..1"),
    "compute_s": ("float64", "seconds of this step spent computing the gradient (real compute)"),
    "emulated_s": ("float64", "seconds an emulated device or a straggler slept in this step (psbench.core.emulation)"),
    "comm_s": ("float64", "seconds moving gradients and parameters (a synchronous exchange: the least among the "
                          "workers at the step)"),
    "wait_s": ("float64", "seconds waiting on other workers (barrier, SSP block, allGather, a collective's slowest)"),
    "update_s": ("float64", "seconds of the optimizer step on the worker (allreduce, single, Spark: optimizer.step(); "
                            "a PS worker: loading the parameters its push was answered with, the server's own "
                            "update being inside that round trip, comm_s; spark-mllib: the driver's update)"),
    "data_s": ("float64", "seconds assembling this step's mini-batch from the worker's shard (an epoch's shuffle "
                          "lands on its first step; spark-mllib-native: empty, its sampling pass is in compute_s)"),
    "h2d_d2h_s": ("float64", "seconds copying between host and GPU (a PS worker on --device cuda: its gradients to "
                             "the wire's host buffer, the parameters back); 0 where nothing is copied, as on a CPU"),
    "kind": ("string", "event kind: switch, handover, stall, worker_lost, ..."),
    "detail": ("string", "event details as a JSON object"),
}
TABLES: dict[str, list[str]] = {"steps": STEP_COLUMNS, "evals": EVAL_COLUMNS, "events": EVENT_COLUMNS}
RECORD_FORMATS = ("parquet", "csv")  # file suffixes too
DEFAULT_FORMAT = "parquet"


def typed_frame(rows: list[dict[str, Any]] | pd.DataFrame, table: str) -> pd.DataFrame:
    """A table's rows as a frame with the schema's columns, in order, and their types."""
    frame = pd.DataFrame(rows, columns=TABLES[table])
    return frame.astype({c: COLUMNS[c][0] for c in frame.columns if c in COLUMNS})


@dataclass
class RunResult:
    run_id: str
    out_dir: Path
    summary: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)


def all_workers_window(steps: pd.DataFrame) -> tuple[float, float, int] | None:
    """(start, end, samples) of the span in which every worker trains: from the last worker's first
    step to the first worker's last step. Throughput over it is not diluted by fast asynchronous
    workers that finish early and leave a slow one training alone (a per-worker step budget)."""
    if len(steps) < 2:
        return None
    per_worker = steps.groupby("worker")["t_wall"]
    start, end = float(per_worker.min().max()), float(per_worker.max().min())
    if not end > start:
        return None
    inside = steps[(steps["t_wall"] > start) & (steps["t_wall"] <= end)]
    return start, end, int(inside["n_samples"].sum())


def split_sync_wait(rows: list[dict[str, Any]]) -> None:
    """Rows of a synchronous exchange carry comm_s = communication + waiting for the others. The
    worker that reaches step k last waits for nobody, so the least comm_s among the workers at step
    k is the communication; each worker's excess over it is waiting (wait_s). In place."""
    least: dict[int, float] = {}
    for r in rows:
        if r.get("comm_s") is not None:
            least[r["step"]] = min(least.get(r["step"], r["comm_s"]), r["comm_s"])
    for r in rows:
        if r.get("comm_s") is not None:
            r["wait_s"] = r["comm_s"] - least[r["step"]]
            r["comm_s"] = least[r["step"]]


def median_step_interval(steps: pd.DataFrame) -> float | None:
    """Median time between a worker's consecutive steps, over all workers: the per-mini-batch cost
    without process launch, start-up or evaluation pauses (which the mean over the run includes)."""
    if len(steps) < 2:
        return None
    ordered = steps.sort_values(["worker", "step"])
    intervals = ordered.groupby("worker")["t_wall"].diff().dropna()
    return float(intervals.median()) if len(intervals) else None


class Recorder:
    """Collects rows while a system trains. t_wall is seconds on the training clock: it starts at
    `start_clock()` (after set-up such as a Spark session start) and excludes `paused()` spans."""

    def __init__(self, spec: RunSpec, target_accuracy: float | None = None):
        self.spec = spec
        # run_id hashes the spec (~15 us): computed once, not on every recorded step.
        self._id_fields = {"run_id": spec.run_id, "system": spec.system, "workload": workload_label(spec.workload)}
        self.target_accuracy = target_accuracy
        self.steps: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.shard_report: dict[str, Any] | None = None
        self.created_at = time.time()
        self.t0: float | None = None  # epoch seconds when training started
        self.t_end: float | None = None
        self._paused_s = 0.0
        self._pause_start: float | None = None

    # ---- the clock ------------------------------------------------------------------------
    def start_clock(self) -> None:
        self.t0 = time.time()
        self.extra.setdefault("setup_s", self.t0 - self.created_at)

    def stop_clock(self) -> None:
        self.t_end = time.time()

    def now(self) -> float:
        if self.t0 is None:
            self.start_clock()
        current = self._pause_start if self._pause_start is not None else time.time()
        return current - self.t0 - self._paused_s

    def adopt_clock(self, t0: float, t_end: float, paused_s: float) -> None:
        """For runs timed inside other processes (allreduce workers): their training start and end
        (epoch seconds) and the time they kept off the clock (evaluation) become this run's clock."""
        self.t0, self.t_end, self._paused_s = t0, t_end, paused_s
        self.extra.setdefault("setup_s", t0 - self.created_at)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside (evaluation, say) is not training time."""
        self._pause_start = time.time()
        try:
            yield
        finally:
            self._paused_s += time.time() - self._pause_start
            self._pause_start = None

    # ---- rows -----------------------------------------------------------------------------
    def _ids(self) -> dict[str, Any]:
        return dict(self._id_fields)

    def step(self, worker: int, step: int, n_samples: int, loss: float, staleness: int | None = None,
             nbytes: int | None = None, t_wall: float | None = None, compute_s: float | None = None,
             emulated_s: float | None = None, comm_s: float | None = None, wait_s: float | None = None,
             update_s: float | None = None, data_s: float | None = None, h2d_d2h_s: float | None = None) -> None:
        self.steps.append({**self._ids(), "worker": worker, "step": step,
                           "t_wall": self.now() if t_wall is None else t_wall, "n_samples": n_samples,
                           "loss": float(loss), "staleness": staleness, "bytes": nbytes, "compute_s": compute_s,
                           "emulated_s": emulated_s, "comm_s": comm_s, "wait_s": wait_s, "update_s": update_s,
                           "data_s": data_s, "h2d_d2h_s": 0.0 if h2d_d2h_s is None else h2d_d2h_s})

    def add_steps(self, rows: list[dict[str, Any]]) -> None:
        """Rows made in other processes (keys as in `step`, t_wall already on this run's clock)."""
        for row in rows:
            self.step(row["worker"], row["step"], row["n_samples"], row["loss"], row.get("staleness"),
                      row.get("bytes"), row["t_wall"], *(row.get(c) for c in STEP_TIME_COLUMNS))

    def eval(self, step: int, split: str, loss: float, accuracy: float, t_wall: float | None = None) -> None:
        self.evals.append({**self._ids(), "step": step, "t_wall": self.now() if t_wall is None else t_wall,
                           "split": split, "loss": float(loss), "accuracy": float(accuracy)})

    def event(self, kind: str, step: int | None = None, worker: int | None = None,
              t_wall: float | None = None, **detail: Any) -> None:
        import json

        self.events.append({"run_id": self._id_fields["run_id"], "kind": kind,
                            "t_wall": self.now() if t_wall is None else t_wall, "step": step, "worker": worker,
                            "detail": json.dumps(detail, sort_keys=True, default=str)})

    # ---- summary and files ----------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        steps = pd.DataFrame(self.steps, columns=STEP_COLUMNS)
        evals = pd.DataFrame(self.evals, columns=EVAL_COLUMNS)
        end = self.t_end or time.time()
        train_s = (end - self.t0 - self._paused_s) if self.t0 else 0.0
        n_samples = int(steps["n_samples"].sum()) if len(steps) else 0
        out: dict[str, Any] = {
            "train_s": train_s,
            "samples": n_samples,
            "samples_per_s": n_samples / train_s if train_s > 0 else None,
            "steps": int(len(steps)),
            "mean_step_s": float(train_s / steps.groupby("worker")["step"].count().max()) if len(steps) else None,
            "median_step_s": median_step_interval(steps),
            "window_samples_per_s": None,
            "budget": self.spec.budget or ("steps per worker" if self.spec.max_steps else "epochs per worker"),
            "target_accuracy": self.target_accuracy,
            "time_to_target_s": None,
            # the ranks whose loss the run tolerated (their worker_lost events): not a normal run
            "lost_workers": sorted({int(e["worker"]) for e in self.events
                                    if e["kind"] == "worker_lost" and e["worker"] is not None}),
        }
        for split in ("train", "val"):
            rows = evals[evals["split"] == split]
            if len(rows):
                out[f"final_{split}_loss"] = float(rows.iloc[-1]["loss"])
                out[f"final_{split}_accuracy"] = float(rows.iloc[-1]["accuracy"])
        val = evals[evals["split"] == "val"].sort_values("t_wall", kind="stable")
        k = TARGET_WINDOW if self.spec.eval_every_s else 1
        out["time_to_target_rule"] = f"the mean of the last {k} validation evaluation(s) at or above the target"
        if self.target_accuracy is not None and len(val):
            # a timer evaluator's curve is read as a mean of k, so one lucky evaluation is no arrival
            smoothed = val["accuracy"].rolling(k).mean()
            hit = val[smoothed >= self.target_accuracy]
            if len(hit):
                out["time_to_target_s"] = float(hit.iloc[0]["t_wall"])
        window = all_workers_window(steps)
        if window is not None:
            out["window_samples_per_s"] = window[2] / (window[1] - window[0])
        if "setup_s" in self.extra and out["time_to_target_s"] is not None:
            # launch (process start, a Spark session) and hand-over costs are paid before the target
            out["time_to_target_with_launch_s"] = out["time_to_target_s"] + float(self.extra["setup_s"])
        stale = steps["staleness"].dropna()
        if len(stale):
            values = stale.to_numpy(dtype=float)
            out["staleness_mean"] = float(values.mean())
            out["staleness_p95"] = float(np.percentile(values, 95))
            out["staleness_max"] = int(values.max())
            hist = np.bincount(values.astype(int))
            out["staleness_hist"] = {str(i): int(c) for i, c in enumerate(hist) if c}
        return out

    def finish(self, results_dir: Path, suite: str, record_format: str = DEFAULT_FORMAT) -> RunResult:
        """Write every file into a staging directory, then rename it into place. Tables are
        `record_format` files (parquet or csv)."""
        if record_format not in RECORD_FORMATS:
            raise ValueError(f"record format {record_format!r}: allowed {', '.join(RECORD_FORMATS)}")
        if self.t_end is None:
            self.stop_clock()
        suite_dir = Path(results_dir) / suite
        suite_dir.mkdir(parents=True, exist_ok=True)
        final = suite_dir / self.spec.run_id
        summary = self.summary()
        with staged_dir(final) as staging:
            for table, rows in (("steps", self.steps), ("evals", self.evals), ("events", self.events)):
                atomic_write_table(staging / f"{table}.{record_format}", typed_frame(rows, table))
            if self.shard_report is not None:
                atomic_write_json(staging / "shards.json", self.shard_report)
            # The manifest is written last: its presence marks a complete run.
            atomic_write_json(staging / "manifest.json", self.manifest(suite, summary))
        return RunResult(self.spec.run_id, final, summary, dict(self.spec.options))

    def manifest(self, suite: str, summary: dict[str, Any]) -> dict[str, Any]:
        return {
            "psbench_manifest": MANIFEST_VERSION,
            "run_id": self.spec.run_id,
            "suite": suite,
            "config_hash": self.spec.config_hash(),
            "spec": self.spec.to_dict(),
            "seed": self.spec.seed,
            "start": self.t0,
            "end": self.t_end,
            "summary": summary,
            "extra": self.extra,
            **provenance(),
            "machine": machine(),
        }


# Packages whose version changes what a run computes or the data it trains on (mnist1d and
# scikit-learn generate datasets).
VERSIONED_PACKAGES = ("torch", "pyzmq", "pyspark", "horovod", "ray", "numpy", "pandas", "scikit-learn", "mnist1d",
                      "psbench")
# What runs write into the checkout (make bench rewrites results/reference): not a change to the code.
GENERATED_PATHS = ("results",)
DIRTY_PATHS_CAP = 20
CHECKOUT = Path(__file__).resolve().parent


def versions() -> dict[str, str | None]:
    """The versions of Python and VERSIONED_PACKAGES, a fresh dict each call."""
    return dict(_installed_versions())


# Read once a process (~20 ms of package metadata a call, paid by every run of a suite): the modules
# this process has imported are the ones it started with, whatever is installed meanwhile.
@functools.lru_cache(maxsize=1)
def _installed_versions() -> tuple[tuple[str, str | None], ...]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in VERSIONED_PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return tuple(out.items())


def git_sha(repo: Path = CHECKOUT) -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_dirty_paths(repo: Path = CHECKOUT) -> list[str] | None:
    """Tracked files with uncommitted changes, the generated ones (GENERATED_PATHS) left out; None
    outside a git checkout."""
    pathspec = [":/", *(f":(top,exclude){p}" for p in GENERATED_PATHS)]
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *pathspec], cwd=repo,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [line[3:].split(" -> ")[-1] for line in out.stdout.splitlines() if line.strip()]  # 'XY path' / renames


def git_dirty(repo: Path = CHECKOUT) -> bool | None:
    """Whether the code that made a run differs from its git sha (uncommitted changes)."""
    paths = git_dirty_paths(repo)
    return None if paths is None else bool(paths)


def provenance(repo: Path = CHECKOUT) -> dict[str, Any]:
    """What made an artefact: the commit, whether the code differed from it and where (the first
    DIRTY_PATHS_CAP changed files, and how many), and the packages' versions."""
    paths = git_dirty_paths(repo)
    return {"git_sha": git_sha(repo), "git_dirty": None if paths is None else bool(paths),
            "git_dirty_paths": None if paths is None else paths[:DIRTY_PATHS_CAP],
            "git_dirty_count": None if paths is None else len(paths), "versions": versions()}


def machine() -> dict[str, Any]:
    import psutil

    return {"cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "processor": platform.machine()}
