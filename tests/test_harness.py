"""The harness end to end with the single baseline: CLI, records, atomic results, matrix, resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from psbench.bench import cli
from psbench.bench.harness.matrix import expand, load_experiment
from psbench.core.records import EVAL_COLUMNS, STEP_COLUMNS, Recorder
from psbench.bench.harness.runner import is_complete, run_all
from psbench.core.accelerator import cuda_available
from psbench.core.spec import RunSpec
from psbench.systems.common import prepare
from psbench.core.tables import read_table
from psbench.core.errors import ConfigError


def _run_dirs(results: Path) -> list[Path]:
    return [p for p in results.glob("*/*") if p.is_dir()]


def test_single_baseline_reaches_90_percent_on_digits(results_dir: Path) -> None:
    rc = cli.main(["run", "--system", "single", "--workload", "mlp-digits", "--epochs", "4",
                   "--results-dir", str(results_dir), "--no-progress"])
    assert rc == 0
    (run,) = _run_dirs(results_dir)
    manifest = json.loads((run / "manifest.json").read_text())
    summary = manifest["summary"]
    assert summary["final_val_accuracy"] >= 0.90
    assert summary["samples_per_s"] > 0 and summary["time_to_target_s"] is not None
    assert manifest["spec"]["system"] == "single" and manifest["versions"]["torch"].startswith("2.13.0")
    assert manifest["machine"]["cores"] >= 1 and "git_sha" in manifest


def test_records_have_the_documented_schema(results_dir: Path) -> None:
    cli.main(["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "30", "--device", "auto",
              "--results-dir", str(results_dir), "--no-progress"])
    (run,) = _run_dirs(results_dir)
    manifest = json.loads((run / "manifest.json").read_text())  # the device resolved, and what was asked
    assert manifest["spec"]["device"] == ("cuda" if cuda_available() else "cpu")
    assert manifest["extra"]["conditions"]["device_requested"] == "auto"
    steps, evals = read_table(run, "steps"), read_table(run, "evals")
    assert list(steps.columns) == STEP_COLUMNS and list(evals.columns) == EVAL_COLUMNS
    assert len(steps) == 30 and steps["step"].tolist() == list(range(30))
    assert steps["t_wall"].is_monotonic_increasing and (steps["n_samples"] > 0).all()
    assert set(evals["split"]) == {"train", "val"} and evals["accuracy"].between(0, 1).all()
    shards = json.loads((run / "shards.json").read_text())
    # one worker: one shard holding the whole training split, its class counts adding up to it;
    # 30 full batches of 32 were drawn from it
    n_train = len(prepare(RunSpec("single", "logreg-digits")).data.y_train)
    assert shards["n_workers"] == 1 and shards["shard_sizes"] == [n_train] == [sum(shards["class_counts"][0])]
    assert steps["n_samples"].sum() == 30 * 32 < n_train


def test_time_to_target_comes_from_the_first_val_eval_at_target() -> None:
    rec = Recorder(RunSpec("single", "mlp-digits"), target_accuracy=0.8)
    rec.start_clock()
    for step, (t, acc) in enumerate([(1.0, 0.5), (2.0, 0.85), (3.0, 0.95)]):
        rec.eval(step, "val", 1.0, acc, t_wall=t)
        rec.eval(step, "train", 1.0, 0.99, t_wall=t)
    rec.step(0, 0, 10, 1.0, staleness=0, t_wall=0.1)
    rec.step(1, 0, 10, 1.0, staleness=3, t_wall=0.2)
    s = rec.summary()
    assert s["time_to_target_s"] == 2.0 and s["final_val_accuracy"] == 0.95
    assert s["staleness_max"] == 3 and s["staleness_hist"] == {"0": 1, "3": 1}


@pytest.mark.parametrize("argv, message", [
    (["--system", "nope", "--workload", "mlp-digits"], "unknown system 'nope'; choose from: single"),
    (["--system", "single", "--workload", "nope"], "unknown workload 'nope'; choose from:"),
    (["--system", "single", "--workload", "mlp-digits", "--epochs", "0"], "epochs must be >= 1"),
    (["--system", "single", "--workload", "mlp-digits", "--sharding", "zigzag"], "unknown sharding 'zigzag'"),
    (["--system", "single", "--workload", "mlp-digits", "-np", "2"], "at most 1 worker"),
    (["--system", "single", "--workload", "cnn-mnist"], "give --data-dir"),
    (["--system", "single", "--workload", "cnn-mnist", "--data-dir", "/nonexistent/x"], "does not exist"),
    (["--config", "/nonexistent/exp.toml"], "config file /nonexistent/exp.toml does not exist"),
])
def test_bad_input_is_one_clear_line_exit_2_and_nothing_written(
        argv: list[str], message: str, results_dir: Path, capsys: pytest.CaptureFixture) -> None:
    rc = cli.main(["run", *argv, "--results-dir", str(results_dir), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("psbench: error: ") and message in err[0]
    assert not results_dir.exists() or not any(results_dir.rglob("*"))


def test_a_failed_run_leaves_nothing_half_written(results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psbench.systems.single import adapter

    def explode(self, spec, options, recorder):
        recorder.start_clock()
        recorder.step(0, 0, 1, 1.0)
        raise RuntimeError("boom mid-run")

    monkeypatch.setattr(adapter.SingleSystem, "run", explode)
    with pytest.raises(RuntimeError, match="boom"):
        run_all([RunSpec("single", "mlp-digits")], results_dir, "s", progress=False)
    assert [p.name for p in _run_dirs(results_dir)] == ["failed"]  # its log only: no run folder
    assert "boom mid-run" in next((results_dir / "s" / "failed").glob("*.log")).read_text()


def test_finish_replaces_an_older_run_directory_whole(results_dir: Path) -> None:
    spec = RunSpec("single", "mlp-digits", max_steps=5)
    first = run_all([spec], results_dir, "s", progress=False)[0]
    (first.out_dir / "stale.txt").write_text("from the old run")
    second = run_all([spec], results_dir, "s", progress=False, resume=False)[0]
    assert second.out_dir == first.out_dir and not (second.out_dir / "stale.txt").exists()
    assert not list((results_dir / "s").glob(".*"))  # no staging or old dirs left behind


def test_matrix_expands_systems_workers_seeds_and_system_options() -> None:
    config = {
        "suite": "demo",
        "matrix": {"system": ["single"], "workload": ["mlp-digits", "logreg-digits"], "seed": [0, 1, 2],
                   "options": {}},
        "settings": {"epochs": 1},
        "quick": {"seed": [0], "max_steps": 5},
        "exclude": [{"workload": "logreg-digits", "seed": 2}],
    }
    full = expand(config)
    assert len(full.specs) == 5 and {s.epochs for s in full.specs} == {1}
    quick = expand(config, quick=True)
    assert len(quick.specs) == 2 and all(s.max_steps == 5 and s.seed == 0 for s in quick.specs)
    with pytest.raises(ConfigError, match="unknown run setting 'epoch'"):
        expand({"matrix": {"system": ["single"], "workload": ["mlp-digits"]}, "settings": {"epoch": 1}})
    # [[override]]: settings for the runs that match (a [quick] key still wins in --quick)
    config["override"] = [{"workload": "logreg-digits", "settings": {"epochs": 7, "max_steps": 99}}]
    by_workload = {s.workload: s for s in expand(config).specs}
    assert (by_workload["logreg-digits"].epochs, by_workload["logreg-digits"].max_steps) == (7, 99)
    assert (by_workload["mlp-digits"].epochs, by_workload["mlp-digits"].max_steps) == (1, None)
    quick_logreg = [s for s in expand(config, quick=True).specs if s.workload == "logreg-digits"]
    assert [(s.epochs, s.max_steps) for s in quick_logreg] == [(7, 5)]
    for bad in ({"workload": "mlp-digits"}, {"settings": {"epochs": 2}}):
        with pytest.raises(ConfigError, match=r"each \[\[override\]\] needs"):
            expand({**config, "override": [bad]})
    with pytest.raises(ConfigError, match="unknown run setting 'epoch'"):
        expand({**config, "override": [{"workload": "mlp-digits", "settings": {"epoch": 2}}]})
    with pytest.raises(ConfigError, match="unknown config section"):
        expand({"matrix": {"system": ["single"], "workload": ["mlp-digits"]}, "setings": {}})
    # a list in [[exclude]] matches any of its items: a slice of the matrix with fewer seeds
    sliced = expand({**config, "exclude": [{"workload": "logreg-digits", "seed": [1, 2]}]})
    assert sorted((s.workload, s.seed) for s in sliced.specs) == [
        ("logreg-digits", 0), ("mlp-digits", 0), ("mlp-digits", 1), ("mlp-digits", 2)]


def test_config_file_runs_a_matrix_and_resume_skips_completed_runs(
        tmp_path: Path, results_dir: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "exp.toml"
    config.write_text('suite = "tiny"\n[matrix]\nsystem = ["single"]\nworkload = ["mlp-digits"]\nseed = [0, 1]\n'
                      '[settings]\nmax_steps = 5\n')
    assert cli.main(["run", "--config", str(config), "--results-dir", str(results_dir), "--no-progress"]) == 0
    experiment = load_experiment(config)
    assert all(is_complete(results_dir, "tiny", s) for s in experiment.specs)
    mtimes = {p: (p / "manifest.json").stat().st_mtime_ns for p in _run_dirs(results_dir)}
    capsys.readouterr()
    assert cli.main(["run", "--config", str(config), "--results-dir", str(results_dir), "--no-progress"]) == 0
    assert "2 run(s) of suite 'tiny' already complete" in capsys.readouterr().err
    assert mtimes == {p: (p / "manifest.json").stat().st_mtime_ns for p in _run_dirs(results_dir)}


def test_yaml_configs_work_too(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text("suite: y\nmatrix:\n  system: [single]\n  workload: [mlp-digits]\n  seed: [0, 1]\n")
    assert len(load_experiment(config).specs) == 2
    config.write_text("suite: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_experiment(config)
    binary = tmp_path / "exp.toml"
    binary.write_bytes(b"\xff\xfe suite")  # not UTF-8: one line, as a parse error is
    with pytest.raises(ConfigError, match="exp.toml: not valid TOML: 'utf-8' codec"):
        load_experiment(binary)


def test_corrupt_manifest_counts_as_incomplete(results_dir: Path) -> None:
    spec = RunSpec("single", "mlp-digits", max_steps=3)
    result = run_all([spec], results_dir, "s", progress=False)[0]
    (result.out_dir / "manifest.json").write_text("{ not json")
    assert not is_complete(results_dir, "s", spec)


def test_list_and_help_describe_systems_and_workloads(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "single" in out and "mlp-digits" in out and "distribution-aware" in out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--help"])
    assert exit_info.value.code == 0
    assert "--workers" in capsys.readouterr().out


class _FailingSystem:
    """A system whose run fails with a chained cause, as an adapter boundary raises it."""

    def run(self, spec, options, recorder) -> None:
        try:
            raise OSError("the deep cause, with its own line\nand a second line")
        except OSError as exc:
            raise RuntimeError("fake: the job failed: the deep cause\nmore detail") from exc


def test_a_failed_run_is_one_line_naming_its_log_which_holds_the_whole_trace(results_dir: Path) -> None:
    from psbench.bench.harness.results import load_suite
    from psbench.bench.harness.runner import PlannedRun, run_one

    spec = RunSpec("single", "logreg-digits", max_steps=4)
    with pytest.raises(RuntimeError) as caught:
        run_one(PlannedRun(spec, _FailingSystem, None), results_dir, "suite")
    log = results_dir / "suite" / "failed" / f"{spec.run_id}.log"
    assert str(caught.value) == f"fake: the job failed: the deep cause (log: {log})"
    text = log.read_text()
    assert "OSError: the deep cause" in text and "more detail" in text and "Traceback" in text
    assert not (results_dir / "suite" / spec.run_id).exists()
    # a failed run's log does not stop the suite's report from reading the completed runs
    cli.main(["run", "--system", "single", "--workload", "logreg-digits", "--max-steps", "5",
              "--results-dir", str(results_dir), "--suite", "suite", "--no-progress"])
    assert len(load_suite(results_dir / "suite").runs) == 1


def test_a_failed_run_whose_log_meets_a_full_disk_is_still_one_line_with_its_cause(results_dir: Path,
                                                                                   monkeypatch) -> None:
    from psbench.bench.harness import runner

    def full(path, text):
        raise runner.DiskFull(path, "No space left on device")

    monkeypatch.setattr(runner, "atomic_write_text", full)
    spec = RunSpec("single", "logreg-digits", max_steps=4)
    with pytest.raises(RuntimeError) as caught:
        runner.run_one(runner.PlannedRun(spec, _FailingSystem, None), results_dir, "suite")
    assert str(caught.value) == ("fake: the job failed: the deep cause (its log could not be kept: "
                                 "No space left on device)")
