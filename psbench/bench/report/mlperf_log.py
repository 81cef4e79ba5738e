"""A run's records as MLPerf Training's MLLOG events (`--mllog PATH` on `psbench run` and `bench`),
written through MLCommons' own logger (`mlperf_logging.mllog`), so that its compliance checker and
result summariser read a psbench run. Like the other trackers, a run is logged from its folder once
it is written.

The events, in order:
- submission_benchmark (the workload's label), submission_org / division / status / platform
  (`Submission`: defaults psbench, open, research and the machine's cores), cache_clear with value
  false (psbench drops no OS cache: its data sets are arrays in memory);
- init_start .. init_stop, the launch (the manifest's setup_s before the training clock's start),
  holding global_batch_size (the per-worker batch x workers: one step's samples over all workers),
  opt_base_learning_rate, seed, gradient_accumulation_steps (1), train_samples / eval_samples
  (the workload's split sizes), and what the training rules 6.1 make a run disclose (DISCLOSED;
  micro_batch_size, the per-worker batch; config_filename, the run id naming the spec);
- run_start at the training clock's start; block_start .. block_stop around the training between
  two evaluations (samples_count, first_epoch_num, epoch_count); eval_start, eval_accuracy (the
  validation accuracy) and eval_stop for each validation evaluation (epoch_num, samples_count:
  the samples every worker had trained on by then, epochs being samples / train_samples);
- run_stop: status success at the evaluation where psbench's time to target is met (an MLPerf run
  ends there, so the evaluations after it are left out; the records keep them), else aborted at
  the run's end.

Time: time_ms is the wall clock. The training clock (t_wall) is laid on it from the run's start
(the manifest's `start`); the time the run kept off that clock (end - start - train_s: its
evaluations, and for a PS run the records' collection after training) is known only as a sum, so
each evaluation is given an equal share of it as its eval_start .. eval_stop, and everything after
an evaluation moves on by that share. An aborted run's run_stop is then the run's `end`.
"""
from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from psbench.core.atomic import atomic_write_text
from psbench.core.errors import ConfigError
from psbench.core.spec import workload_label
from psbench.core.tables import read_table

DIVISIONS = ("open", "closed")
STATUSES = ("research", "onprem", "cloud", "preview")  # the training rules' submission_status values
LOG_NAME = "psbench.mllog"
SOURCE_ROOT = Path(__file__).resolve().parents[3]  # trimmed from the caller file MLLOG records
# What the training rules (6.1) make every run disclose: psbench computes and sends float32 (a user's
# model in another dtype is not seen here) and splits only the data, never the model.
DISCLOSED = (("lowest_numerical_precision_in_linear", "fp32"), ("lowest_numerical_precision_in_attn", "fp32"),
             ("lowest_numerical_precision_in_comm", "fp32"), ("tensor_parallelism", 1), ("pipeline_parallelism", 1),
             ("context_parallelism", 1), ("expert_parallelism", 1))


@dataclass(frozen=True)
class Submission:
    """The submission_* fields; platform None: the machine the run was on (its manifest's cores)."""
    org: str = "psbench"
    division: str = "open"
    status: str = "research"
    platform: str | None = None


def parse_submission(text: str | None) -> Submission:
    """`org=ACME,platform=8xH100,...` (--mllog-submission) over the defaults; a bad one is one line."""
    if not text:
        return Submission()
    allowed = [f.name for f in fields(Submission)]
    given: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in allowed or not value:
            raise ConfigError(f"--mllog-submission: '{item}' is not KEY=VALUE with KEY one of {', '.join(allowed)}")
        given[key] = value
    for key, choices in (("division", DIVISIONS), ("status", STATUSES)):
        if key in given and given[key] not in choices:
            raise ConfigError(f"--mllog-submission: {key} '{given[key]}'; allowed: {', '.join(choices)}")
    return Submission(**given)


@dataclass(frozen=True)
class Target:
    """Where MLLOG goes: `path` itself (one run: `psbench run` without --config), else one file
    per run, `path/<suite>/<run-id>.txt`."""
    path: Path
    one_file: bool
    submission: Submission = Submission()

    def file_for(self, suite: str, run_id: str) -> Path:
        return self.path if self.one_file else self.path / suite / f"{run_id}.txt"


@dataclass(frozen=True)
class Event:
    kind: str  # the MLLogger method: start, end or event
    key: str
    time_s: float  # epoch seconds
    value: Any = None
    metadata: dict[str, Any] | None = None


@lru_cache(maxsize=8)
def split_sizes(workload: str, data_dir: str | None) -> tuple[int, int]:
    """(train, validation) samples of a workload's fixed split."""
    from psbench.workloads.registry import get_workload

    data = get_workload(workload).load_data(data_dir=data_dir)
    return len(data.y_train), len(data.y_val)


def run_events(run_dir: Path, submission: Submission = Submission()) -> list[Event]:
    """The run's MLLOG events, in order, from its records (see the module's text)."""
    from psbench.workloads.registry import get_workload

    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    spec, summary = manifest["spec"], manifest["summary"]
    workload = get_workload(spec["workload"])
    n_train, n_eval = split_sizes(spec["workload"], spec.get("data_dir"))
    start, end, train_s = float(manifest["start"]), float(manifest["end"]), float(summary["train_s"])
    t_init = start - float(manifest["extra"].get("setup_s") or 0.0)
    machine = manifest.get("machine") or {}
    platform = submission.platform or f"{machine.get('cores', '?')}-core {machine.get('processor') or 'cpu'}"

    steps = read_table(run_dir, "steps").sort_values("t_wall", kind="stable")
    step_t, done = steps["t_wall"].to_numpy(float), np.cumsum(steps["n_samples"].to_numpy(float))
    evals = read_table(run_dir, "evals")
    val = evals[evals["split"] == "val"].sort_values("t_wall", kind="stable").reset_index(drop=True)
    share = max(0.0, end - start - train_s) / len(val) if len(val) else 0.0

    def samples_at(t: float) -> int:
        i = int(np.searchsorted(step_t, t, side="right"))
        return int(done[i - 1]) if i else 0

    def wall(t: float, placed: int) -> float:
        return start + t + placed * share

    out = [Event("event", f"submission_{key}", t_init, value)
           for key, value in (("benchmark", workload_label(spec["workload"])), ("org", submission.org),
                              ("division", submission.division), ("status", submission.status),
                              ("platform", platform))]
    out += [Event("event", "cache_clear", t_init, False), Event("start", "init_start", t_init)]
    out += [Event("event", key, t_init, value) for key, value in (
        ("global_batch_size", int((spec.get("batch_size") or workload.batch_size) * spec["workers"])),
        ("opt_base_learning_rate", float(spec.get("lr") or workload.optimizer.lr)),
        ("seed", int(spec["seed"])), ("gradient_accumulation_steps", 1),
        ("train_samples", n_train), ("eval_samples", n_eval), *DISCLOSED,
        ("micro_batch_size", int(spec.get("batch_size") or workload.batch_size)),
        ("config_filename", manifest["run_id"]))]
    out += [Event("end", "init_stop", start), Event("start", "run_start", start)]

    last = _target_index(val, summary.get("time_to_target_s"))
    t_prev, s_prev = 0.0, 0
    for placed, row in enumerate(val.itertuples()):
        if last is not None and placed > last:
            break
        t, s = float(row.t_wall), samples_at(float(row.t_wall))
        out += _block(wall(t_prev, placed), wall(t, placed), s_prev, s, n_train)
        at = {"epoch_num": s / n_train, "samples_count": s}
        out += [Event("start", "eval_start", wall(t, placed), metadata=at),
                Event("event", "eval_accuracy", wall(t, placed) + share, float(row.accuracy), at),
                Event("end", "eval_stop", wall(t, placed) + share, metadata=at)]
        t_prev, s_prev = t, s
    if last is not None:
        return out + [Event("end", "run_stop", out[-1].time_s, metadata={"status": "success"})]
    out += _block(wall(t_prev, len(val)), wall(train_s, len(val)), s_prev, samples_at(float("inf")), n_train)
    return out + [Event("end", "run_stop", max(end, out[-1].time_s), metadata={"status": "aborted"})]


def _target_index(val: pd.DataFrame, time_to_target_s: float | None) -> int | None:
    """The evaluation at which psbench's time to target (its own rule) was met, or None."""
    if time_to_target_s is None:
        return None
    reached = np.flatnonzero(val["t_wall"].to_numpy(float) >= time_to_target_s - 1e-9)
    return int(reached[0]) if len(reached) else None


def _block(t_from: float, t_to: float, s_from: int, s_to: int, n_train: int) -> list[Event]:
    """The training between two evaluations (none when it trained on nothing)."""
    if s_to <= s_from:
        return []
    first = s_from / n_train
    return [Event("start", "block_start", t_from, metadata={"samples_count": s_from, "first_epoch_num": first,
                                                              "epoch_count": (s_to - s_from) / n_train}),
            Event("end", "block_stop", t_to, metadata={"samples_count": s_to, "first_epoch_num": first})]


def write_run(run_dir: Path, out: Path, submission: Submission = Submission()) -> Path:
    """The run's MLLOG lines, made by mlperf_logging's MLLogger, written whole (temp file, rename)."""
    from mlperf_logging.mllog.mllog import MLLogger

    buffer = io.StringIO()
    logger = logging.getLogger(LOG_NAME)
    logger.propagate, handler = False, logging.StreamHandler(buffer)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        mlperf = MLLogger(logger=logger, root_dir=str(SOURCE_ROOT))
        for e in run_events(run_dir, submission):
            getattr(mlperf, e.kind)(key=e.key, value=e.value, metadata=e.metadata, time_ms=round(e.time_s * 1000))
    finally:
        logger.removeHandler(handler)
    atomic_write_text(out, buffer.getvalue())
    return out


def write_runs(target: Target, suite: str, run_dirs: Iterable[Path]) -> list[Path]:
    run_dirs = list(run_dirs)
    if target.one_file and len(run_dirs) > 1:
        raise ValueError(f"one MLLOG file for {len(run_dirs)} runs")
    return [write_run(d, target.file_for(suite, Path(d).name), target.submission) for d in run_dirs]
