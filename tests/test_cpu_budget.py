"""The CPU budget: every system declares its processes, their costs come from a calibration measured
here (bench/harness/calibration.py), a run records the CPU its process tree used, a hand-made run
that oversubscribes runs with one warning line and a suite refuses it. The core count is injected
(PSBENCH_CORES), so each test holds on 2 cores and on 64."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from psbench.bench import cli
from psbench.bench.harness import calibration
from psbench.bench.harness.calibration import Measured, RoleFigure, SystemCalibration, figures_from, fit
from psbench.bench.harness.runner import declared_processes, plan, record_run
from psbench.core.cpu import CORES_ENV, LAUNCHER, WORKERS
from psbench.core.errors import ConfigError
from psbench.core.spec import RunSpec
from psbench.systems import get_system, names
from psbench.systems.base import parse_options


def stub(**figures: RoleFigure):
    """A calibrator that gives these figures (roles by name; workers as `workers`) without measuring."""
    def calibrator(spec: RunSpec, system_cls: type) -> SystemCalibration:
        return SystemCalibration(spec.system, spec.workload, 2e-4, dict(figures), file="stub")
    return calibrator


# ---- the calibration's arithmetic ----------------------------------------------------------------

def test_fit_separates_the_fixed_cost_from_the_per_step_one():
    figure = fit([(100.0, 0.05 + 100 * 2e-4), (500.0, 0.05 + 500 * 2e-4)])
    assert figure.fixed_cores == pytest.approx(0.05) and figure.step_cpu_s == pytest.approx(2e-4)
    flat = fit([(100.0, 0.2), (500.0, 0.1)])                                           # noise: no negative slope
    assert flat.fixed_cores == pytest.approx(0.15) and flat.step_cpu_s == 0.0
    through_origin = fit([(100.0, 0.01), (500.0, 0.2)])                                # nor a negative intercept
    assert through_origin.fixed_cores == 0.0 and through_origin.step_cpu_s > 0
    assert fit([(0.0, 0.3)]) == RoleFigure(fixed_cores=0.3)                            # one run: all fixed


def test_figures_are_per_process_and_workers_net_of_their_gradient():
    """2 workers, 1 shard: 400 steps in 1 s, then 80 in 1 s. Workers: 0.3 ms per own step beyond a
    0.2 ms gradient; the shard 0.1 ms per step of anyone plus 0.02 core."""
    runs = [Measured(0.005, 400, 1.0, {WORKERS: 400 * 5e-4, "ps shard": 0.02 + 400 * 1e-4}, {WORKERS: 2, "ps shard": 1}),
            Measured(0.025, 80, 1.0, {WORKERS: 80 * 5e-4, "ps shard": 0.02 + 80 * 1e-4}, {WORKERS: 2, "ps shard": 1})]
    figures = figures_from(runs, compute_s=2e-4)
    assert figures[WORKERS].step_cpu_s == pytest.approx(3e-4) and figures[WORKERS].fixed_cores == pytest.approx(0, abs=1e-9)
    assert figures["ps shard"].step_cpu_s == pytest.approx(1e-4) and figures["ps shard"].fixed_cores == pytest.approx(0.02)


def test_a_step_takes_its_target_plus_what_the_system_adds():
    """A Spark job per mini-batch: 2 workers at a 100 ms target took 0.4 s a step; the plan's step
    rate follows (2.5 steps/s a worker, not 10), and so do the driver's cores."""
    fast = Measured(0.1, 40, 8.0, {"spark driver": 0.3}, {WORKERS: 2, "spark driver": 1})
    slow = Measured(0.5, 40, 18.0, {"spark driver": 0.1}, {WORKERS: 2, "spark driver": 1})
    assert calibration.step_latency([slow, fast]) == pytest.approx(0.3)
    figures = SystemCalibration("spark-mllib", "mlp-digits", 2e-4, {"spark driver": RoleFigure(0.0, 0.05)},
                                step_latency_s=0.3)
    conditions = plan(RunSpec("spark-mllib", "mlp-digits", workers=2, max_steps=5, emulate_device="step_ms=100"),
                      allow_oversubscribe=True, calibrator=lambda spec, cls: figures).conditions
    assert conditions["cpu_plan"]["spark driver"]["cores"] == pytest.approx(2 * 0.05 / (0.1 + 0.3), rel=0.01)


def _system_stepping(own_s: float):
    """A fake calibration run: a worker's step takes the device's target, or own_s if longer."""
    asked: list[RunSpec] = []

    def measure(spec: RunSpec) -> Measured:
        asked.append(spec)
        target = float(spec.emulate_device[len("step_ms="):]) / 1e3 if spec.emulate_device else 0.0
        steps = 2 * spec.max_steps
        return Measured(target or None, steps, spec.max_steps * max(target, own_s), {}, {WORKERS: 2})
    return measure, asked


def test_calibration_runs_last_about_two_seconds_whatever_the_systems_step():
    base = RunSpec("ps", "mlp-digits", workers=2)
    measure, asked = _system_stepping(own_s=0.0)        # the device paces every step
    calibration.calibration_runs(base, 2e-4, True, 0.0, measure)
    assert [(s.emulate_device, s.max_steps) for s in asked] == [("step_ms=4.000", 20), ("step_ms=4.000", 500),
                                                               ("step_ms=20.000", 100)]
    measure, asked = _system_stepping(own_s=0.8)        # a barrier per step takes 0.8 s: the probe is the fast run
    runs = calibration.calibration_runs(RunSpec("spark-barrier", "mlp-digits", workers=2), 2e-4, True, 0.0, measure)
    assert [(s.emulate_device, s.max_steps) for s in asked] == [("step_ms=4.000", 20), ("step_ms=800.000", 10)]
    assert len(runs) == 2 and sum(r.span_s for r in runs) < 30
    measure, asked = _system_stepping(own_s=0.0)        # no device can pace it: one run
    calibration.calibration_runs(RunSpec("spark-mllib-native", "logreg-digits", workers=2), 2e-4, False, 0.0, measure)
    assert [s.emulate_device for s in asked] == [None]


# ---- the plan ------------------------------------------------------------------------------------

@pytest.mark.parametrize("system", names())
def test_every_system_declares_its_processes(system):
    """The launcher (this process) counts unless it is the worker itself; workers are declared with
    what recognises them, and any other role names its processes."""
    cls = get_system(system)
    processes, self_role = declared_processes(cls, parse_options(cls.Options, {}, system), 3)
    roles = [p.role for p in processes]
    assert len(roles) == len(set(roles)) and WORKERS in roles
    assert (LAUNCHER in roles) == (self_role == LAUNCHER)
    assert all(p.pattern for p in processes if p.role not in (LAUNCHER, self_role))


@pytest.mark.parametrize("cores", ["2", "64"])
def test_no_device_plan_counts_each_process_and_refuses_past_the_cores(monkeypatch, cores):
    monkeypatch.setenv(CORES_ENV, cores)
    figures = stub(**{WORKERS: RoleFigure(0.0, 1e-4), "ps shard": RoleFigure(0.02, 2e-4), LAUNCHER: RoleFigure(0.05)})
    spec = RunSpec("ps", "mlp-digits", workers=4, max_steps=5)
    if cores == "2":
        with pytest.raises(ConfigError, match=r"needs about 5\.\d cores \(4 workers x 1\.00 \+ 1 ps shard x 1\.00 \+ "
                                              r"1 launcher x 0\.05\), this machine has 2 \(PSBENCH_CORES\).*"
                                              r"--allow-oversubscribe"):
            plan(spec, calibrator=figures)
    conditions = plan(spec, allow_oversubscribe=True, calibrator=figures).conditions
    assert conditions["cpu_plan"]["ps shard"]["cores"] == 1.0   # compute-bound workers: a shard at its core
    assert conditions["oversubscribed"] is (cores == "2") and conditions["cores"] == float(cores)


def test_device_plan_scales_each_role_with_the_step_rate(monkeypatch):
    """8 workers on 20 ms devices make 400 steps/s: the shard's 0.2 ms a step is 0.08 core and the
    workers' 0.1 ms on their own 50 steps/s 0.005 core each beside their compute share."""
    monkeypatch.setenv(CORES_ENV, "2")
    figures = stub(**{WORKERS: RoleFigure(0.0, 1e-4), "ps shard": RoleFigure(0.02, 2e-4), LAUNCHER: RoleFigure(0.05)})
    conditions = plan(RunSpec("ps", "mlp-digits", workers=8, max_steps=5, emulate_device="step_ms=20"),
                      calibrator=figures).conditions
    share = conditions["worker_compute_share"]
    assert conditions["cpu_plan"]["ps shard"]["cores"] == pytest.approx(0.02 + 400 * 2e-4, abs=1e-3)
    assert conditions["cpu_plan"][WORKERS]["cores"] == pytest.approx(8 * (share + 50 * 1e-4), abs=1e-3)
    assert conditions["cpu_demand"] == pytest.approx(sum(r["cores"] for r in conditions["cpu_plan"].values()), abs=2e-3)
    assert conditions["cpu_calibration"]["file"] == "stub" and conditions["oversubscribed"] is False


def test_peers_servers_and_daemons_count(monkeypatch):
    """rpc-ps' shard ranks and ray-ps' shard actors and daemons are in the plan, at their figures."""
    monkeypatch.setenv(CORES_ENV, "2")
    cls = get_system("rpc-ps")
    processes, _ = declared_processes(cls, parse_options(cls.Options, {"servers": "2"}, "rpc-ps"), 2)
    shard = next(p for p in processes if p.role == "rpc shard")
    assert shard.count == 2 and [r for r in ("--rank 1 --world 4", "--rank 2 --world 4", "--rank 10 ")
                                 if __import__("re").search(shard.pattern, f"-m psbench.systems.rpc_ps.process {r}")] \
        == ["--rank 1 --world 4"]
    cls = get_system("ray-ps")
    processes, _ = declared_processes(cls, parse_options(cls.Options, {}, "ray-ps"), 2)
    assert {p.role for p in processes} == {WORKERS, "ray shard", "ray daemons", LAUNCHER}


# ---- measured, and the harness's rules ------------------------------------------------------------

def test_a_run_records_the_cpu_its_processes_used(monkeypatch):
    """A PS run on 20 ms devices: its workers' and its shard's CPU measured apart, their sum with
    the launcher's being the run's cpu_measured, in cores over the training span."""
    monkeypatch.setenv(CORES_ENV, "2")
    spec = RunSpec("ps", "mlp-digits", workers=2, max_steps=60, emulate_device="step_ms=20")
    conditions = record_run(plan(spec, calibrator=stub())).extra["conditions"]
    roles = conditions["cpu_measured_roles"]
    assert roles[WORKERS] > 0 and roles["ps shard"] > 0
    assert conditions["cpu_measured"] == pytest.approx(sum(roles.values()), abs=1e-3)
    assert conditions["cpu_span_s"] > 0


def test_calibration_is_measured_once_and_cached(monkeypatch, tmp_path):
    """The real calibration of `single`: two short runs, figures for its one role, kept in the cache
    dir with the machine's cores and the commit; the next plan reads them back without a run."""
    monkeypatch.setenv("PSBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(calibration.FIGURES_ENV, raising=False)  # the session's shipped figures: not here
    monkeypatch.setenv(CORES_ENV, "2")
    conditions = plan(RunSpec("single", "mlp-digits", max_steps=5, emulate_device="step_ms=5")).conditions
    recorded = conditions["cpu_calibration"]
    assert (recorded["file"], recorded["root"]) == ("cpu/single-mlp-digits-v1.json", "$PSBENCH_CACHE")
    file = calibration.recorded_file(recorded)
    saved = json.loads(file.read_text())
    assert file.parent == tmp_path / "cpu" and len(saved["runs"]) == 2 and set(saved["figures"]) == {WORKERS}
    assert saved["cores"]["cores"] == 2 and saved["runs"][0]["steps"] > saved["runs"][1]["steps"] > 0
    monkeypatch.setattr(calibration, "calibrate", lambda *a, **k: pytest.fail("measured again"))
    assert plan(RunSpec("single", "mlp-digits", max_steps=5)).conditions["cpu_calibration"] == recorded


def _strings(node, path=()):
    """(path, text) for every string in a JSON document, keys included."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path + (key,), str(key)
            yield from _strings(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, path + (i,))
    elif isinstance(node, str):
        yield path, node


# Paths the user gave, recorded as given: a spec's data_dir (--data-dir, a workload's files); a
# cluster run (not run here) also keeps its cluster file's path as named (extra.cluster.source).
USER_PATHS = {("spec", "data_dir")}


@pytest.mark.parametrize("system, workers", [("single", 1), ("ps", 2)])
def test_a_runs_manifest_holds_no_path_of_the_machine_that_made_it(monkeypatch, tmp_path, system, workers):
    """The calibration figures the plan read are named relative to the cache root ('cpu/<file>',
    the root as '$PSBENCH_CACHE'), and no other string of the manifest is an absolute path or holds
    the home folder; an older manifest's absolute path still resolves."""
    from cpu_figures import write_figures
    from psbench.bench.harness.runner import run_all

    cache = tmp_path / "cache"
    write_figures(cache / calibration.FIGURES_FOLDER)
    monkeypatch.setenv("PSBENCH_CACHE", str(cache))
    monkeypatch.delenv(calibration.FIGURES_ENV, raising=False)
    spec = RunSpec(system, "mlp-digits", workers=workers, max_steps=4, evals_per_epoch=1, emulate_device="step_ms=20")
    result = run_all([spec], tmp_path / "results", "paths", progress=False)[0]
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    recorded = manifest["extra"]["conditions"]["cpu_calibration"]
    assert (recorded["file"], recorded["root"]) == (f"cpu/{system}-mlp-digits-v1.json", "$PSBENCH_CACHE")
    assert calibration.recorded_file(recorded) == cache / "cpu" / f"{system}-mlp-digits-v1.json"
    home = str(Path.home())
    machine_paths = [(path, text) for path, text in _strings(manifest)
                     if path not in USER_PATHS and (text.startswith("/") or home in text or str(tmp_path) in text)]
    assert machine_paths == []
    old = {"file": "/root/.cache/psbench/cpu/ps-mlp-digits-v1.json"}  # as committed manifests hold it
    assert calibration.recorded_file(old) == Path(old["file"])


def test_a_planning_pass_loads_a_workloads_data_once_and_lets_it_go(monkeypatch):
    """Planning a suite measures each batch size's compute on the workload's data, loaded once for
    them all; after the pass, and outside one, nothing is kept (a launcher holds no rows while its
    runs train)."""
    from psbench.bench.harness import runner
    from psbench.workloads.registry import Workload

    loads: list[str] = []
    load_data = Workload.load_data
    monkeypatch.setattr(Workload, "load_data", lambda self, *a, **k: loads.append(self.name) or load_data(self, *a, **k))
    monkeypatch.setattr(runner, "_COMPUTE_CACHE", {})
    with runner.planning_pass():
        for batch in (16, 32, 64):
            runner.measured_compute_s(RunSpec("single", "mlp-digits", batch_size=batch))
        assert runner._PLANNING_DATA
    assert loads == ["mlp-digits"] and runner._PLANNING_DATA is None
    runner.measured_compute_s(RunSpec("single", "mlp-digits", batch_size=8))
    assert loads == ["mlp-digits"] * 2 and runner._PLANNING_DATA is None


@pytest.mark.parametrize("cores", ["0.5", "64"])
def test_a_run_by_hand_warns_in_one_line_and_runs(monkeypatch, capsys, tmp_path, cores):
    monkeypatch.setenv(CORES_ENV, cores)
    rc = cli.main(["run", "--system", "single", "--workload", "mlp-digits", "--max-steps", "300",
                   "--epochs", "10", "--results-dir", str(tmp_path), "--no-progress"])
    assert rc == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    (manifest,) = tmp_path.rglob("manifest.json")
    conditions = json.loads(manifest.read_text())["extra"]["conditions"]
    assert conditions["oversubscribed"] is (cores == "0.5") and conditions["cpu_measured"] > 0
    if cores == "0.5":
        assert len(warnings) == 1 and "needs about 1.0 cores (1 workers x 1.00), this machine has 0.5" in warnings[0]
    else:
        assert warnings == []


def test_a_suite_refuses_an_oversubscribed_run_unless_allowed(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(CORES_ENV, "0.5")
    experiment = tmp_path / "x.toml"
    experiment.write_text('suite = "x"\n[matrix]\nsystem = ["single"]\nworkload = ["mlp-digits"]\n[settings]\nmax_steps = 5\n')
    args = ["run", "--config", str(experiment), "--results-dir", str(tmp_path / "r"), "--no-progress"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("psbench: error:") and "--allow-oversubscribe" in err[0]
    assert not any(tmp_path.rglob("manifest.json"))
    assert cli.main([*args, "--allow-oversubscribe"]) == 0 and len(list(tmp_path.rglob("manifest.json"))) == 1


def test_a_dry_run_prints_each_runs_plan_and_runs_nothing(monkeypatch, capsys, tmp_path):
    """`psbench run --config X --dry-run`: one line a run (done or to run, its cores), nothing run."""
    monkeypatch.setenv(CORES_ENV, "0.5")
    experiment = tmp_path / "x.toml"
    experiment.write_text('suite = "x"\nallow_oversubscribe = true\n[matrix]\nsystem = ["single"]\n'
                          'workload = ["mlp-digits"]\nseed = [0, 1]\n[settings]\nmax_steps = 5\n')
    args = ["run", "--config", str(experiment), "--results-dir", str(tmp_path / "r"), "--no-progress"]
    assert cli.main([*args, "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert not (tmp_path / "r").exists()
    assert len(lines) == 3 and all(" to run  1.00 of 0.5 cores, oversubscribed: 1 workers x 1.00" in line
                                   for line in lines[:2])
    assert lines[2] == f"2 of 2 run(s) of suite 'x' to run in {tmp_path / 'r' / 'x'} (a dry run: nothing ran)"
    assert cli.main(args) == 0  # run them: a dry run then says done
    capsys.readouterr()
    assert cli.main([*args, "--dry-run"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("0 of 2 run(s)")
