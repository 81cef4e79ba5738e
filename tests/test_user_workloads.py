"""The user's own model and data (psbench/workloads/user.py): a factory and a loader in a module the
test writes outside the tree, named by import strings or a workload file, trained by single, ps
(2 worker processes) and ddp (2 ranks), with their provenance in the manifest and one-line errors."""
from __future__ import annotations

import hashlib
import itertools
import json
import sys
from pathlib import Path

import pytest

from psbench.bench import cli
from psbench.bench.harness.matrix import expand
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.runner import plan, run_all, run_one
from psbench.bench.report.tables import workload_sources_table
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec, workload_label
from psbench.core.tables import read_table
from psbench.systems.common import child_env
from psbench.workloads import registry, user

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "own_model" / "own_mlp.toml"

MODULE = '''
import numpy as np
from torch import nn

def make_model(input_shape, n_classes, hidden=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.ReLU(),
                         nn.Linear(hidden, n_classes))

def load_data(seed, data_dir=None):
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 3.0, size=(3, 6))
    y = rng.integers(0, 3, size=600)
    x = centres[y] + rng.normal(0.0, 1.0, size=(600, 6))   # float64 and int64: converted, checked
    return x[:480], y[:480], x[480:], y[480:]

def raises(*args, **kwargs):
    raise ValueError("no such file: weights.bin")

def returns_int(input_shape, n_classes):
    return 3

def returns_dict(seed, data_dir=None):
    return {"x": 1}

def float_labels(seed, data_dir=None):
    x, y, xv, yv = load_data(seed)
    return x, y.astype("float64"), xv, yv

def short_labels(seed, data_dir=None):
    x, y, xv, yv = load_data(seed)
    return x, y[:-1], xv, yv

def wrong_width(input_shape, n_classes):
    return make_model(input_shape, n_classes + 2)

not_callable = 7
'''
_names = itertools.count()


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A fresh module (its own name: the import system caches by name) in tmp_path; sys.path and the
    user workloads' process state restored after the test."""
    name = f"psb_user_mod_{next(_names)}"
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / f"{name}.py").write_text(MODULE)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(user, "_ROOTS", [])
    monkeypatch.setattr(user, "_DATA", {})
    monkeypatch.setattr(registry, "_USER_WORKLOADS", {})
    return name, folder


def workload_file(folder: Path, name: str, **extra: str) -> Path:
    keys = {"model": f'"{name}:make_model"', "dataset": f'"{name}:load_data"', "batch_size": "16",
            "epochs": "1", "target_accuracy": "0.8", **extra}
    path = folder / "my_workload.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in keys.items()) + "[optimizer]\nlr = 0.05\nmomentum = 0.9\n")
    return path


def manifest_of(results: Path) -> tuple[Path, dict]:
    (run,) = [p for p in results.glob("*/*") if p.is_dir() and p.name != "failed"]
    return run, json.loads((run / "manifest.json").read_text())


def test_single_from_the_command_line_records_where_model_and_data_came_from(
        module, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, folder = module
    monkeypatch.chdir(folder)  # found as `python -m` would: from the current directory
    rc = cli.main(["run", "--system", "single", "--model", f"{name}:make_model", "--dataset", f"{name}:load_data",
                   "--max-steps", "20", "--results-dir", str(results_dir), "--no-progress"])
    assert rc == 0
    run, manifest = manifest_of(results_dir)
    label = f"{name}.make_model+{name}.load_data"
    assert manifest["spec"]["workload"] == f"{name}:make_model+{name}:load_data" and label in run.name
    source = manifest["extra"]["workload_source"]
    module_file = str((folder / f"{name}.py").resolve())
    assert source["model"] == f"{name}:make_model" and source["dataset"] == f"{name}:load_data"
    assert source["sha256"] == {module_file: "sha256:" + hashlib.sha256(Path(module_file).read_bytes()).hexdigest()}
    assert manifest["extra"]["data"]["dataset"] == f"{name}:load_data"
    assert set(read_table(run, "steps")["workload"]) == {label}
    suite = load_suite(results_dir / "runs")
    assert suite.runs["workload"].tolist() == [label] and suite.runs["batch_size"].tolist() == [32]  # the pair's default
    sources = workload_sources_table(suite)  # the report's table of where they came from
    assert sources[["workload", "model", "dataset", "runs"]].values.tolist() == [
        [label, f"{name}:make_model", f"{name}:load_data", 1]]
    assert manifest["summary"]["final_val_accuracy"] > 0.5  # 3 classes: it learned


def test_ps_with_two_worker_processes_imports_the_module_through_the_child_environment(
        module, results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planned from the module's folder, run from the tree's: the shard and the workers find the module
    only through child_env's PYTHONPATH (the folder the launcher imported it from)."""
    name, folder = module
    monkeypatch.chdir(folder)
    planned = plan(RunSpec("ps", user.pair_name(f"{name}:make_model", f"{name}:load_data"), workers=2),
                   allow_oversubscribe=True)
    assert str(folder.resolve()) in child_env()["PYTHONPATH"].split(":")
    monkeypatch.chdir(ROOT)
    sys.path[:] = [p for p in sys.path if p not in ("", str(folder))]  # nor from this process' own path
    result = run_one(planned, results_dir, "ps")
    steps = read_table(result.out_dir, "steps")
    # the pair's 1 epoch at its batch of 32: 240 rows a worker, 8 steps
    assert sorted(steps["worker"].unique()) == [0, 1] and steps.groupby("worker")["step"].max().tolist() == [7, 7]
    assert result.summary["final_val_accuracy"] is not None


def test_ddp_with_two_ranks_trains_a_workload_file(module, results_dir: Path) -> None:
    name, folder = module
    path = workload_file(folder, name)
    (result,) = run_all([RunSpec("ddp", str(path), workers=2, max_steps=10)], results_dir, "ddp", progress=False,
                        allow_oversubscribe=True)
    steps = read_table(result.out_dir, "steps")
    assert sorted(steps["worker"].unique()) == [0, 1] and set(steps["n_samples"]) == {16}  # the file's batch
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    source = manifest["extra"]["workload_source"]
    assert source["workload_file"] == str(path) and str(path) in source["sha256"]
    assert result.run_id.startswith("ddp-my_workload-w2-") and manifest["summary"]["target_accuracy"] == 0.8


def test_the_shipped_example_runs_and_reaches_its_target(results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(user, "_ROOTS", [])
    rc = cli.main(["run", "--system", "single", "--workload", str(EXAMPLE.relative_to(ROOT)),
                   "--results-dir", str(results_dir), "--no-progress"])
    assert rc == 0
    run, manifest = manifest_of(results_dir)
    assert run.name.startswith("single-own_mlp-w1-s0-") and manifest["spec"]["workload"] == str(EXAMPLE)
    assert manifest["summary"]["time_to_target_s"] is not None  # 0.9, the file's target


def test_an_experiment_or_cluster_file_takes_model_and_dataset_or_a_workload_file_beside_it(module) -> None:
    name, folder = module
    workload_file(folder, name)
    experiment = expand({"matrix": {"system": ["single", "ps"], "model": f"{name}:make_model",
                                    "dataset": [f"{name}:load_data", "digits"]},
                         "exclude": [{"system": "ps", "dataset": "digits"}]})
    assert sorted((s.system, s.workload) for s in experiment.specs) == [
        ("ps", f"{name}:make_model+{name}:load_data"), ("single", f"{name}:make_model+digits"),
        ("single", f"{name}:make_model+{name}:load_data")]
    beside = expand({"settings": {"system": "single", "workload": "my_workload.toml"}},
                    source=folder / "exp.toml")
    assert [s.workload for s in beside.specs] == [str(folder / "my_workload.toml")]
    from psbench.bench.lab.cluster.file import parse as parse_cluster_file

    cluster = parse_cluster_file({"launcher": "local", "run": {"system": "ps", "workload": "my_workload.toml"},
                                  "hosts": [{"roles": ["ps-server", "worker"]}]}, str(folder / "cluster.toml"))
    assert cluster.spec.workload == str(folder / "my_workload.toml")  # a cluster file's [run] too


@pytest.mark.parametrize("argv, message", [
    (["--model", "psb_no_such_mod:f", "--dataset", "digits"],
     "model factory 'psb_no_such_mod:f': importing psb_no_such_mod failed: ModuleNotFoundError"),
    (["--model", "{m}:missing", "--dataset", "{m}:load_data"], "model factory '{m}:missing': module {m} ("),
    (["--model", "{m}:not_callable", "--dataset", "{m}:load_data"], "not_callable is a int, not a callable"),
    (["--model", "{m}:raises", "--dataset", "{m}:load_data"],
     "model factory '{m}:raises' raised ValueError: no such file: weights.bin"),
    (["--model", "{m}:make_model", "--dataset", "{m}:raises"], "dataset loader '{m}:raises' raised ValueError"),
    (["--model", "{m}:returns_int", "--dataset", "{m}:load_data"],
     "model factory '{m}:returns_int' returned a int; expected a torch.nn.Module"),
    (["--model", "{m}:make_model", "--dataset", "{m}:returns_dict"],
     "dataset loader '{m}:returns_dict' returned a dict; expected (x_train, y_train, x_val, y_val)"),
    (["--model", "{m}:make_model", "--dataset", "{m}:float_labels"],
     "y_train has dtype float64 and shape (480,); expected integer class labels"),
    (["--model", "{m}:make_model", "--dataset", "{m}:short_labels"], "x_train has 480 examples and y_train 479"),
    (["--model", "{m}:wrong_width", "--dataset", "{m}:load_data"], "to (2, 5); expected (2, 3) class scores"),
    (["--model", "bad:name:x", "--dataset", "{m}:load_data"], "--model 'bad:name:x': give pkg.module:callable"),
    (["--model", "nomodel", "--dataset", "{m}:load_data"], "unknown model 'nomodel'"),
    (["--model", "{m}:make_model"], "give --model with --dataset"),
    (["--workload", "nowhere/w.toml"], "workload file"),
])
def test_a_broken_factory_or_loader_is_one_line_exit_2_and_nothing_written(
        module, argv: list[str], message: str, results_dir: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name, folder = module
    monkeypatch.chdir(folder)
    rc = cli.main(["run", "--system", "single", *(a.format(m=name) for a in argv), "--results-dir", str(results_dir),
                   "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("psbench: error: ")
    assert message.format(m=name) in err[0]
    assert not results_dir.exists() or not any(results_dir.rglob("*"))


@pytest.mark.parametrize("key, value, message", [
    ("optimiser", '"adam"', "unknown key(s) optimiser"),
    ("batch_size", "0", "batch_size = 0; allowed: an integer >= 1"),
    ("target_accuracy", "1.5", "target_accuracy = 1.5; allowed: a number in (0, 1]"),
])
def test_a_bad_workload_file_is_one_line_naming_the_file(module, key: str, value: str, message: str) -> None:
    name, folder = module
    path = workload_file(folder, name, **{key: value})
    with pytest.raises(ConfigError) as raised:
        registry.get_workload(str(path))
    assert str(raised.value).startswith(f"workload file {path}: {message}")


def test_only_folders_a_child_would_not_search_are_passed_to_it(module, monkeypatch: pytest.MonkeyPatch) -> None:
    assert user.resolve("json:dumps", "model factory") is __import__("json").dumps
    assert user.import_roots() == []  # the standard library: every child finds it already
    name, folder = module
    user.resolve(f"{name}:make_model", "model factory", folder)  # from a workload file's folder
    assert user.import_roots() == [str(folder.resolve())]


def test_labels_are_the_names_the_user_gave_and_registry_names_keep_their_run_ids() -> None:
    assert workload_label("mlp-digits") == "mlp-digits"
    assert workload_label("/a/b/my model.toml") == "my-model"
    assert workload_label("pkg.models:net+pkg.data:load") == "pkg.models.net+pkg.data.load"
    assert RunSpec("single", "mlp-digits").run_id.startswith("single-mlp-digits-w1-s0-")
    assert len(RunSpec("single", "a" * 300 + ":f+b:g").run_id) <= 128


@pytest.mark.slow  # 10-45 s each (a Spark session, a Ray cluster, horovodrun): `make test-slow`
@pytest.mark.parametrize("system", ["horovod", "switch", "rpc-ps", "ray-ps", "spark-mllib"])
def test_the_other_systems_train_a_workload_file_from_outside_the_tree(module, system: str, results_dir: Path) -> None:
    from psbench import systems

    reason = systems.quick_unavailable_reason(system)
    if reason:
        pytest.skip(f"{system} is not available here: {reason}")
    name, folder = module
    path = workload_file(folder, name)
    (result,) = run_all([RunSpec(system, str(path), workers=2, max_steps=6)], results_dir, system, progress=False,
                        allow_oversubscribe=True)
    steps = read_table(result.out_dir, "steps")
    assert sorted(steps["worker"].unique()) == [0, 1] and set(steps["workload"]) == {"my_workload"}
