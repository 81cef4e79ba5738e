"""Opt-in experiment trackers: `--mlflow URI`, `--tensorboard DIR` and `--mllog PATH` (MLPerf's
MLLOG lines, mlperf_log.py) on `psbench run` and `bench`.

After the runs are written, each completed run is logged from its records (so a tracker sees
exactly what results/ holds): its spec as params, every numeric step column as a per-step metric
(mean over workers at each step number, e.g. `steps/loss`, `steps/staleness`; new schema columns
follow by themselves), each evaluation as `eval/<split>_<loss|accuracy>`, and the summary as final
metrics. The suite's report plots go to one parent run per suite (MLflow: the psbench runs are
its nested runs; TensorBoard: `DIR/<suite>/report`). The packages are optional extras
(`pip install -e '.[mlflow,tensorboard,mllog]'`); asking for a tracker that is not installed is an
error before any run starts.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from psbench.bench.report import mlperf_log
from psbench.core.errors import ConfigError
from psbench.core.records import COLUMNS
from psbench.core.tables import read_table

NOT_METRICS = {"worker", "step"}  # step columns that index rather than measure
BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch call


def check_available(mlflow_uri: str | None, tensorboard_dir: Path | None, mllog_path: Path | None = None) -> None:
    """Fail before training when a requested tracker's package is missing."""
    needs = [("mlflow", "mlflow", mlflow_uri), ("tensorboard", "tensorboard", tensorboard_dir),
             ("mllog", "mlperf_logging", mllog_path)]
    for flag, module, wanted in needs:
        if wanted is None:
            continue
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"--{flag} needs the {module} package: pip install -e '.[{flag}]' "
                              f"(or `make setup`, which installs the tracker extras)") from None


# ---- what a run is, for a tracker --------------------------------------------------------------

def run_params(manifest: dict[str, Any]) -> dict[str, str]:
    spec = dict(manifest["spec"])
    options = spec.pop("options", None) or {}
    params = {k: "" if v is None else str(v) for k, v in spec.items()}
    params.update({f"option.{k}": str(v) for k, v in options.items()})
    return params


def step_metrics(run_dir: Path) -> dict[str, pd.DataFrame]:
    """metric name -> frame (step, value, t_wall): each numeric step column, mean over workers."""
    steps = read_table(run_dir, "steps")
    out: dict[str, pd.DataFrame] = {}
    if steps.empty:
        return out
    numeric = [c for c in steps.columns if c not in NOT_METRICS
               and COLUMNS.get(c, ("",))[0] in ("Int64", "float64") and steps[c].notna().any()]
    per_step = steps.groupby("step")[numeric + (["t_wall"] if "t_wall" not in numeric else [])].mean()
    for column in numeric:
        values = per_step[column].dropna()
        out[f"steps/{column}"] = pd.DataFrame({"step": values.index.astype(int), "value": values.to_numpy(float),
                                               "t_wall": per_step.loc[values.index, "t_wall"].to_numpy(float)})
    return out


def eval_metrics(run_dir: Path) -> dict[str, pd.DataFrame]:
    evals = read_table(run_dir, "evals")
    out: dict[str, pd.DataFrame] = {}
    for split, rows in evals.groupby("split"):
        for column in ("loss", "accuracy"):
            out[f"eval/{split}_{column}"] = pd.DataFrame({"step": rows["step"].astype(int).to_numpy(),
                                                          "value": rows[column].to_numpy(float),
                                                          "t_wall": rows["t_wall"].to_numpy(float)})
    return out


def final_metrics(manifest: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in manifest["summary"].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None and np.isfinite(v)}


def _manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "manifest.json").read_text())


# ---- MLflow --------------------------------------------------------------------------------------

def log_mlflow(uri: str, suite: str, run_dirs: Iterable[Path], plots: Iterable[Path] = (),
               report_files: Iterable[Path] = ()) -> str:
    """Log the runs (nested under one parent run for the suite, which holds the report's plots);
    returns the parent run's id."""
    if uri.startswith("file:") or "://" not in uri:
        # MLflow 3 refuses its file store unless told otherwise; a local folder is what works offline.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = f"psbench/{suite}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    parent = client.create_run(experiment_id, run_name=f"{suite} report", tags={"psbench.kind": "suite"})
    parent_id = parent.info.run_id
    for path in plots:
        client.log_artifact(parent_id, str(path), artifact_path="plots")
    for path in report_files:
        client.log_artifact(parent_id, str(path))
    for run_dir in run_dirs:
        manifest = _manifest(run_dir)
        t0_ms = int((manifest.get("start") or 0) * 1000)
        run = client.create_run(experiment_id, run_name=manifest["run_id"], tags={
            "mlflow.parentRunId": parent_id, "psbench.kind": "run", "psbench.run_id": manifest["run_id"],
            "psbench.suite": suite, "psbench.config_hash": manifest.get("config_hash", ""),
            "mlflow.source.git.commit": manifest.get("git_sha") or ""})
        run_id = run.info.run_id
        metrics = [Metric(key, float(v), t0_ms + int(t * 1000), int(s))
                   for key, frame in {**step_metrics(run_dir), **eval_metrics(run_dir)}.items()
                   for s, v, t in zip(frame["step"], frame["value"], frame["t_wall"])]
        metrics += [Metric(f"summary/{k}", v, t0_ms, 0) for k, v in final_metrics(manifest).items()]
        params = [Param(k, v) for k, v in run_params(manifest).items()]
        client.log_batch(run_id, params=params, tags=[RunTag("psbench.results", str(Path(run_dir).resolve()))])
        for i in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=metrics[i:i + BATCH])
        client.log_artifact(run_id, str(Path(run_dir) / "manifest.json"))
        client.set_terminated(run_id)
    client.set_terminated(parent_id)
    return parent_id


# ---- TensorBoard ---------------------------------------------------------------------------------

def log_tensorboard(log_dir: Path, suite: str, run_dirs: Iterable[Path], plots: Iterable[Path] = ()) -> Path:
    """Event files under log_dir/<suite>/<run_id>/ (scalars, params as text and hparams) and
    log_dir/<suite>/report/ (the plots as images); returns log_dir/<suite>."""
    from matplotlib.image import imread
    from torch.utils.tensorboard import SummaryWriter

    root = Path(log_dir) / suite
    for run_dir in run_dirs:
        manifest = _manifest(run_dir)
        t0 = manifest.get("start") or 0.0
        with SummaryWriter(log_dir=str(root / manifest["run_id"])) as writer:
            params = run_params(manifest)
            writer.add_text("params", "\n".join(f"    {k} = {v}" for k, v in params.items()))
            for key, frame in {**step_metrics(run_dir), **eval_metrics(run_dir)}.items():
                for s, v, t in zip(frame["step"], frame["value"], frame["t_wall"]):
                    writer.add_scalar(key, float(v), global_step=int(s), walltime=t0 + float(t))
            finals = {f"summary/{k}": v for k, v in final_metrics(manifest).items()}
            writer.add_hparams(params, finals, run_name=".")
    with SummaryWriter(log_dir=str(root / "report")) as writer:
        for path in plots:
            image = imread(path)[..., :3]  # RGBA floats 0..1 -> RGB
            writer.add_image(Path(path).stem, image, dataformats="HWC")
    return root


def log_all(suite_dir: Path, run_dirs: list[Path], plots: dict[str, list[Path]], mlflow_uri: str | None,
            tensorboard_dir: Path | None, mllog: mlperf_log.Target | None = None) -> list[str]:
    """Log to each tracker asked for; lines saying where things went."""
    pngs = [p for paths in plots.values() for p in paths if p.suffix == ".png"]
    reports = [p for p in (suite_dir / "report.md", suite_dir / "report.html") if p.is_file()]
    done = []
    if mlflow_uri:
        parent = log_mlflow(mlflow_uri, suite_dir.name, run_dirs, pngs, reports)
        done.append(f"mlflow: {len(run_dirs)} run(s) under parent run {parent} at {mlflow_uri}")
    if tensorboard_dir:
        root = log_tensorboard(tensorboard_dir, suite_dir.name, run_dirs, pngs)
        done.append(f"tensorboard: {len(run_dirs)} run(s) in {root} (tensorboard --logdir {tensorboard_dir})")
    if mllog:
        files = mlperf_log.write_runs(mllog, suite_dir.name, run_dirs)
        done.append(f"mllog: {len(files)} run(s) in {files[0] if mllog.one_file else mllog.path / suite_dir.name}")
    return done
