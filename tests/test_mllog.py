"""`--mllog PATH` writes a run's MLPerf Training MLLOG events through mlperf_logging, read back here
with that package's own parser and compliance checker. The package is the optional `mllog` extra:
without it these tests skip, except in CI (CI=true), where `make setup` installs it."""
from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import pytest

from psbench.bench import cli
from psbench.bench.report import mlperf_log
from psbench.core.spec import RunSpec
from psbench.core.tables import read_table
from report_fixtures import fake_run

RULESET = "6.1.0"  # the newest training rules the pinned mlperf-logging carries


def _need_package() -> None:
    if os.environ.get("CI"):
        __import__("mlperf_logging")  # CI installs the extra: a missing one is a failure, not a skip
    else:
        pytest.importorskip("mlperf_logging", reason="mlperf_logging not installed: pip install -e '.[mllog]'")


def _parse(path: Path) -> list:
    from mlperf_logging.compliance_checker import mlp_parser

    lines, errors = mlp_parser.parse_file(str(path), ruleset=RULESET)
    assert lines and not errors
    return lines


def _keys(lines: list) -> list[str]:
    return [line.key for line in lines]


def _one(lines: list, key: str):
    (line,) = [x for x in lines if x.key == key]
    return line


def _val(run_dir: Path):
    evals = read_table(run_dir, "evals")
    return evals[evals["split"] == "val"].sort_values("t_wall", kind="stable").reset_index(drop=True)


def _assert_order(lines: list) -> None:
    """The MLPerf order: submission fields, cache_clear, init, run_start, then each evaluation's
    start/accuracy/stop after its training block, run_stop last; time never runs backwards."""
    keys = _keys(lines)
    assert keys[:6] == ["submission_benchmark", "submission_org", "submission_division", "submission_status",
                        "submission_platform", "cache_clear"]
    assert keys.index("init_start") < keys.index("init_stop") < keys.index("run_start")
    assert keys[-1] == "run_stop" and keys.count("run_start") == keys.count("run_stop") == 1
    body = [k for k in keys[keys.index("run_start") + 1:-1]]
    while body:
        if body[0] == "block_start":
            assert body[:2] == ["block_start", "block_stop"]
            body = body[2:]
        else:
            assert body[:3] == ["eval_start", "eval_accuracy", "eval_stop"]
            body = body[3:]
    times = [line.timestamp for line in lines]
    assert times == sorted(times)
    assert _one(lines, "run_start").timestamp < _one(lines, "run_stop").timestamp


def _compliance_messages(path: Path) -> tuple[dict, list]:
    """The training rules' common checks (all must pass), then the open division's: psbench's
    workloads are not MLPerf benchmarks, so its benchmark-name check is the one it fails. (Its
    command line cannot be run whole here: it then opens the rules file of that benchmark.)"""
    from mlperf_logging.compliance_checker import mlp_compliance

    rules = Path(mlp_compliance.__file__).parent / f"training_{RULESET}"
    loglines = _parse(path)
    checker = mlp_compliance.make_checker("training", RULESET, quiet=False, werror=True)
    try:
        checker.configured_checks(loglines, str(rules / "common.yaml"))
        assert not checker.has_messages(), (checker.overwritable, checker.not_overwritable)
        checker.configured_checks(loglines, str(rules / "open_common.yaml"))
    finally:
        mlp_compliance.enqueued_configs.clear()  # what the rules queued for the checker's own loop
    return checker.overwritable, checker.not_overwritable


def test_single_run_reaching_its_target_logs_mlperf_events(tmp_path: Path) -> None:
    _need_package()
    out = tmp_path / "mllog.txt"
    assert cli.main(["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "30",
                     "--evals-per-epoch", "4", "--results-dir", str(tmp_path / "results"), "--no-progress",
                     "--format", "csv", "--mllog", str(out), "--mllog-submission", "org=ACME,platform=test-box"]) == 0
    (run_dir,) = [p for p in (tmp_path / "results" / "runs").iterdir() if p.is_dir()]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    summary, val = manifest["summary"], _val(run_dir)
    lines = _parse(out)
    _assert_order(lines)
    value = {line.key: line.value["value"] for line in lines}
    assert value["submission_benchmark"] == "logreg-digits" and value["submission_org"] == "ACME"
    assert value["submission_platform"] == "test-box" and value["submission_division"] == "open"
    assert (value["global_batch_size"], value["opt_base_learning_rate"], value["seed"]) == (32, 0.1, 0)
    assert (value["train_samples"], value["eval_samples"]) == (1438, 359) and value["cache_clear"] is False

    # the target (0.9) is met at the third evaluation of four: an MLPerf run ends there, a success
    assert summary["time_to_target_s"] is not None and len(val) == 4
    reached = int((val["accuracy"] >= summary["target_accuracy"]).idxmax())  # one evaluation: the rule's k = 1
    assert val["t_wall"][reached] == pytest.approx(summary["time_to_target_s"])
    accuracy = [x for x in lines if x.key == "eval_accuracy"]
    assert [x.value["value"] for x in accuracy] == list(val["accuracy"][:reached + 1])
    assert accuracy[-1].value["value"] >= summary["target_accuracy"] > max(val["accuracy"][:reached])
    assert [x.value["metadata"]["samples_count"] for x in accuracy] == list(val["step"][:reached + 1] * 32)
    assert accuracy[1].value["metadata"]["epoch_num"] == pytest.approx(val["step"][1] * 32 / 1438)
    assert _one(lines, "run_stop").value["metadata"]["status"] == "success"

    # the timeline: init from the launch, run_start at the training clock's zero, each evaluation an
    # equal share of the time kept off that clock, MLPerf's time to train = ours plus those shares
    start = manifest["start"]
    share_ms = (manifest["end"] - start - summary["train_s"]) / len(val) * 1000
    assert _one(lines, "init_start").timestamp == round((start - manifest["extra"]["setup_s"]) * 1000)
    assert _one(lines, "run_start").timestamp == round(start * 1000)
    starts = [x.timestamp for x in lines if x.key == "eval_start"]
    stops = [x.timestamp for x in lines if x.key == "eval_stop"]
    assert [b - a for a, b in zip(starts, stops)] == pytest.approx([share_ms] * len(starts), abs=1)
    to_train_ms = _one(lines, "run_stop").timestamp - _one(lines, "run_start").timestamp
    assert to_train_ms == pytest.approx(summary["time_to_target_s"] * 1000 + (reached + 1) * share_ms, abs=1)

    overwritable, others = _compliance_messages(out)
    assert set(overwritable) == {"submission_benchmark"} and not others


def test_config_run_short_of_its_target_is_aborted_one_file_a_run(tmp_path: Path) -> None:
    _need_package()
    experiment = tmp_path / "e.toml"
    experiment.write_text('suite = "tiny"\n[matrix]\nsystem = ["single"]\nworkload = ["logreg-digits"]\n'
                          '[settings]\nmax_steps = 12\nevals_per_epoch = 1\n')
    assert cli.main(["run", "--config", str(experiment), "--results-dir", str(tmp_path / "results"),
                     "--no-progress", "--mllog", str(tmp_path / "mllog")]) == 0
    (run_dir,) = [p for p in (tmp_path / "results" / "tiny").iterdir() if p.is_dir() and p.name != "plots"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    lines = _parse(tmp_path / "mllog" / "tiny" / f"{run_dir.name}.txt")
    _assert_order(lines)
    assert manifest["summary"]["time_to_target_s"] is None
    assert [x.value["value"] for x in lines if x.key == "eval_accuracy"] == list(_val(run_dir)["accuracy"])
    run_stop = _one(lines, "run_stop")
    assert run_stop.value["metadata"]["status"] == "aborted" and run_stop.timestamp == round(manifest["end"] * 1000)
    assert _one(lines, "submission_platform").value["value"] == f"{manifest['machine']['cores']}-core " \
                                                                f"{manifest['machine']['processor']}"


def test_samples_count_over_all_workers(tmp_path: Path) -> None:
    _need_package()
    spec = RunSpec("ps", "mlp-digits", workers=2, batch_size=16, options={"consistency": "asp"})
    fake_run(tmp_path, "s", spec, step_s=0.01, steps=24, target=0.99)
    run_dir = tmp_path / "s" / spec.run_id
    lines = _parse(mlperf_log.write_run(run_dir, tmp_path / "ps.txt"))
    _assert_order(lines)
    assert _one(lines, "global_batch_size").value["value"] == 32
    counts = [x.value["metadata"]["samples_count"] for x in lines if x.key in ("eval_accuracy", "block_stop")]
    assert counts == sorted(counts) and counts[-1] == 2 * 24 * 16
    assert _one(lines, "run_stop").value["metadata"]["status"] == "aborted"


def test_missing_package_is_one_line_before_any_run(tmp_path: Path, monkeypatch, capsys) -> None:
    real_import = builtins.__import__

    def no_mlperf_logging(name, *args, **kwargs):
        if name.split(".")[0] == "mlperf_logging":
            raise ImportError("No module named 'mlperf_logging'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlperf_logging)
    rc = cli.main(["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "2",
                   "--results-dir", str(tmp_path), "--no-progress", "--mllog", str(tmp_path / "x.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--mllog needs the mlperf_logging package: pip install -e '.[mllog]'" in err[0]
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("given, says", [("org", "is not KEY=VALUE"), ("team=x", "is not KEY=VALUE"),
                                         ("division=closedish", "allowed: open, closed")])
def test_bad_submission_field_is_one_line_before_any_run(tmp_path: Path, capsys, given: str, says: str) -> None:
    rc = cli.main(["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "2",
                   "--results-dir", str(tmp_path), "--no-progress", "--mllog", str(tmp_path / "x.txt"),
                   "--mllog-submission", given])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0] and not any(tmp_path.iterdir())
