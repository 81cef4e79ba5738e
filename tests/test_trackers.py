"""`--mlflow URI` and `--tensorboard DIR` log a run's params, per-step metrics and
the report's plots, read back here from a real local MLflow store and real TensorBoard event files.
The packages are optional extras: without them these tests skip, except in CI (CI=true), where
.ci/run installs them and a missing one fails."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from psbench.bench import cli
from psbench.bench.report.trackers import step_metrics
from psbench.core.spec import RunSpec
from report_fixtures import fake_run


def _need(module: str) -> None:
    if os.environ.get("CI"):
        __import__(module)  # CI installs the extras: a missing one is a failure, not a skip
    else:
        pytest.importorskip(module, reason=f"{module} not installed: pip install -e '.[mlflow,tensorboard]'")


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> dict:
    """One real `psbench run` with both trackers on; a fixture PS run logged beside it."""
    _need("mlflow")
    _need("tensorboard")
    tmp = tmp_path_factory.mktemp("track")
    uri = f"file:{tmp / 'mlruns'}"
    argv = ["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "12", "--evals-per-epoch", "1",
            "--results-dir", str(tmp / "results"), "--no-progress", "--mlflow", uri, "--tensorboard", str(tmp / "tb")]
    assert cli.main(argv) == 0
    (run_dir,) = [p for p in (tmp / "results" / "runs").iterdir() if p.is_dir() and p.name != "plots"]
    return {"uri": uri, "tb": tmp / "tb", "run_dir": run_dir}


def test_mlflow_store_holds_params_step_metrics_and_plots(tracked) -> None:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracked["uri"])
    experiment = client.get_experiment_by_name("psbench/runs")
    runs = client.search_runs([experiment.experiment_id])
    (child,) = [r for r in runs if r.data.tags.get("psbench.kind") == "run"]
    (parent,) = [r for r in runs if r.data.tags.get("psbench.kind") == "suite"]
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.params["system"] == "single" and child.data.params["max_steps"] == "12"
    assert child.data.tags["psbench.run_id"] == tracked["run_dir"].name
    loss = client.get_metric_history(child.info.run_id, "steps/loss")
    assert [m.step for m in loss] == list(range(12))
    val = client.get_metric_history(child.info.run_id, "eval/val_accuracy")
    assert val and all(0 <= m.value <= 1 for m in val)
    assert child.data.metrics["summary/samples_per_s"] > 0
    plots = [a.path for a in client.list_artifacts(parent.info.run_id, "plots")]
    assert plots and all(p.endswith(".png") for p in plots)
    assert {"report.md", "report.html"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}


def test_tensorboard_event_files_hold_scalars_and_plot_images(tracked) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = EventAccumulator(str(tracked["tb"] / "runs" / tracked["run_dir"].name), size_guidance={"scalars": 0})
    run.Reload()
    loss = run.Scalars("steps/loss")
    assert [e.step for e in loss] == list(range(12))
    assert "eval/val_accuracy" in run.Tags()["scalars"]
    report = EventAccumulator(str(tracked["tb"] / "runs" / "report"), size_guidance={"images": 0})
    report.Reload()
    images = report.Tags()["images"]
    assert images and all(report.Images(tag)[0].width > 100 for tag in images)


def test_every_numeric_step_column_becomes_a_metric(tmp_path: Path) -> None:
    spec = RunSpec("ps", "mlp-digits", workers=2, batch_size=16, options={"consistency": "asp"})
    fake_run(tmp_path, "s", spec, step_s=0.002, steps=10, staleness=[0, 1, 2])
    metrics = step_metrics(tmp_path / "s" / spec.run_id)
    assert {"steps/loss", "steps/staleness", "steps/t_wall", "steps/n_samples"} <= set(metrics)
    assert "steps/bytes" not in metrics  # never recorded in this run: no empty series
    assert list(metrics["steps/staleness"]["step"]) == list(range(10))


def test_missing_tracker_package_fails_before_any_run(tmp_path: Path, monkeypatch, capsys) -> None:
    import builtins

    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow":
            raise ImportError("No module named 'mlflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    rc = cli.main(["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "2",
                   "--results-dir", str(tmp_path), "--no-progress", "--mlflow", "file:x"])
    assert rc == 2 and "--mlflow needs the mlflow package" in capsys.readouterr().err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
