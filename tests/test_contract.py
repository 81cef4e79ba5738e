"""The adapter contract and the registry's facts: a system built from `systems.base.System` alone and
one registry entry runs through `psbench run` into a valid record; every registered system derives
from the base and sets only hooks it declares; every entry carries its facts; and the harness reads
no hook of a system class that the base does not declare (checked in bench/'s source)."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from psbench import systems
from psbench.bench import cli
from psbench.bench.harness.calibration import FIGURES_ENV
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.schema import check_manifest
from psbench.core.errors import ConfigError
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import HOOKS, System

ROOT = Path(__file__).resolve().parents[1]


class ExampleSystem(System):
    """The smallest system: one worker trains in this process; every hook but `run` (and the one
    limit it states) is the base's default."""

    name = "example"
    max_workers = 1  # it trains worker 0's shard only

    def run(self, spec: RunSpec, options: Any, recorder: Recorder) -> None:
        from psbench.systems.common import (StepClock, compute_step, configure_threads, evaluate_splits,
                                            make_optimizer, prepare, record_evals)

        configure_threads(1)
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        model, loss_fn = prep.build_model(), prep.workload.loss_fn()
        optimizer = make_optimizer(model, prep.workload, prep.lr)
        clock = StepClock(prep.pacer(0))
        recorder.start_clock()
        step = -1
        for step, x, y in prep.batches(0, clock):
            loss = compute_step(model, loss_fn, x, y, clock, step)
            with clock.update():
                optimizer.step()
            t = clock.split()
            recorder.step(0, step, len(y), loss, staleness=None, compute_s=t.compute_s, emulated_s=t.emulated_s,
                          comm_s=t.comm_s, wait_s=0.0, update_s=t.update_s, data_s=t.data_s)
        with recorder.paused():
            record_evals(recorder, step + 1, evaluate_splits(model, loss_fn, prep.data))
        recorder.stop_clock()


EXAMPLE = systems.Entry(f"{__name__}:ExampleSystem", "a test's example: one process, the base's defaults",
                        "single", systems.BASELINE, systems.ONE_WORKER, "#000001", "none (no communication)")


@pytest.fixture
def example_registered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The example in the registry for one test, its CPU figures measured afresh (as a new system's
    are on its first plan) into a folder of its own."""
    monkeypatch.setitem(systems.REGISTRY, "example", EXAMPLE)
    monkeypatch.setenv(FIGURES_ENV, str(tmp_path / "cpu-figures"))
    return "example"


def test_a_system_from_the_base_alone_and_a_registry_entry_runs_through_psbench_run(
        example_registered: str, results_dir: Path) -> None:
    rc = cli.main(["run", "--system", example_registered, "--workload", "logreg-digits", "--max-steps", "20",
                   "--results-dir", str(results_dir), "--suite", "contract", "--no-progress"])
    assert rc == 0
    (run,) = [p for p in (results_dir / "contract").iterdir() if p.is_dir()]
    manifest = check_manifest(json.loads((run / "manifest.json").read_text()), run / "manifest.json")
    assert manifest["spec"]["system"] == "example" and manifest["summary"]["steps"] == 20
    conditions = manifest["extra"]["conditions"]
    # the base's defaults planned it: its workers and this launcher, figures it measured for itself
    assert set(conditions["cpu_plan"]) == {"workers", "launcher"} and conditions["cpu_calibration"]["file"]
    runs = load_suite(results_dir / "contract").runs
    assert list(runs["system"]) == ["example"] and runs["final_val_accuracy"].between(0, 1).all()


@pytest.mark.parametrize("given, says", [({"budget": "seconds=1"}, "takes no --budget"),
                                         ({"eval_every_s": 1.0}, "evaluates at --evals-per-epoch"),
                                         ({"workers": 2}, "runs at most 1 worker")])
def test_the_base_defaults_refuse_what_the_example_does_not_declare(example_registered: str, given: dict[str, Any],
                                                                     says: str) -> None:
    from psbench.bench.harness.runner import plan

    with pytest.raises(ConfigError, match=re.escape(says)):
        plan(RunSpec(example_registered, "logreg-digits", **given), calibrator=lambda _spec, _cls: None)


# ---- every registered system ----------------------------------------------------------------------

@pytest.mark.parametrize("name", systems.names())
def test_every_registered_system_derives_from_the_base_and_sets_only_declared_hooks(name: str) -> None:
    cls = systems.get_system(name)
    assert issubclass(cls, System) and cls.name == name
    own = {attr for klass in cls.__mro__[:cls.__mro__.index(System)] for attr in vars(klass)
           if not attr.startswith("_")}
    assert own <= HOOKS, f"{cls.__qualname__} sets {sorted(own - HOOKS)}, which systems.base.System does not declare"
    assert cls.run is not System.run


@pytest.mark.parametrize("name", systems.names())
def test_every_registry_entry_carries_its_facts(name: str) -> None:
    e = systems.entry(name)
    assert e.family in systems.FAMILIES and e.kind in systems.KINDS and e.synchrony in systems.SYNCHRONIES
    assert re.fullmatch(r"#[0-9a-f]{6}", e.colour) and e.bytes_source and e.description
    assert e.peer_of is None or (e.peer_of in systems.REGISTRY and e.peer_of != name)
    others = [n for n in systems.names() if n != name]
    assert e.colour not in {systems.entry(n).colour for n in others}, "two systems share a plot colour"
    assert not set(e.aliases) & {a for n in systems.names() for a in systems.known_as(n) if n != name}
    from psbench.bench.report.plots import system_colour

    assert {system_colour(a) for a in systems.known_as(name)} == {e.colour}


def test_a_bad_fact_is_refused_naming_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="kind 'fast'; allowed: specialised, general-purpose, baseline"):
        systems.Entry("m:C", "d", "ps", "fast", systems.SYNC, "#000000", "none")


def test_the_kinds_follow_the_thesis_and_the_throughput_twins_keep_to_them() -> None:
    """Question 1: our PS and allreduce and the peer PSs are specialised, Spark's paths general-purpose."""
    from psbench.bench.report import throughput_gap
    from psbench.bench.sim import project

    assert set(systems.names_where(family="spark")) | set(systems.names_where(family="spark-jvm")) == \
        set(systems.names_where(kind=systems.GENERAL_PURPOSE))
    assert {"ps", "ddp", "horovod", "ray-ps", "rpc-ps"} <= set(systems.names_where(kind=systems.SPECIALISED))

    def system_of(twin_name: str) -> str:
        return twin_name.split(" (")[0]  # 'ps (bsp)' is the ps system at one consistency

    for specialised, general, _role in throughput_gap.TWINS:
        assert systems.entry(system_of(specialised)).kind == systems.SPECIALISED
        assert systems.entry(general).kind == systems.GENERAL_PURPOSE
    curves = {c.label: c.system for c in project.CURVES}
    assert project.SPECIALISED == ("ps (asp)", "ps (bsp)", "ddp", "horovod")  # one shard each: like for like
    assert {systems.entry(curves[c]).kind for c in project.GENERAL} == {systems.GENERAL_PURPOSE}


# ---- the harness reads only declared hooks --------------------------------------------------------

def _system_class_reads(tree: ast.AST) -> tuple[list[tuple[int, str]], list[int]]:
    """(line, attribute) of every attribute read on a system class or instance in a module, and the
    lines where getattr/hasattr reads one by name. A system class is what get_system returns, a
    name bound to that in the same function, or anything called `system_cls`; an instance is one
    of those called."""
    def is_class(node: ast.AST, bound: set[str]) -> bool:
        if isinstance(node, ast.Call):
            func = node.func
            return (isinstance(func, ast.Name) and func.id == "get_system") or (
                isinstance(func, ast.Attribute) and func.attr == "get_system")
        if isinstance(node, ast.Name):
            return node.id == "system_cls" or node.id in bound
        return isinstance(node, ast.Attribute) and node.attr == "system_cls"

    def is_system(node: ast.AST, bound: set[str]) -> bool:
        return is_class(node, bound) or (isinstance(node, ast.Call) and is_class(node.func, bound))

    reads, by_name = [], []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))]
    for scope in scopes:
        body = list(ast.walk(scope))
        bound = {t.id for n in body if isinstance(n, ast.Assign) and is_class(n.value, set())
                 for t in n.targets if isinstance(t, ast.Name)}
        for n in body:
            if isinstance(n, ast.Attribute) and is_system(n.value, bound):
                reads.append((n.lineno, n.attr))
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
                    and n.args and is_system(n.args[0], bound)):
                by_name.append(n.lineno)
    return sorted(set(reads)), sorted(set(by_name))


def test_the_checker_sees_an_undeclared_hook_and_a_getattr() -> None:
    source = ("def f(spec):\n    cls = get_system(spec.system)\n    x = cls.warp_speed\n"
              "    y = getattr(system_cls, 'budgets', ())\n    planned.system_cls().run(spec)\n")
    reads, by_name = _system_class_reads(ast.parse(source))
    assert reads == [(3, "warp_speed"), (5, "run")] and by_name == [4]


def test_the_harness_reads_only_hooks_the_base_declares() -> None:
    seen: set[str] = set()
    for path in sorted((ROOT / "bench").rglob("*.py")):
        reads, by_name = _system_class_reads(ast.parse(path.read_text(), str(path)))
        where = path.relative_to(ROOT)
        assert not by_name, f"{where}:{by_name[0]}: a hook read by getattr/hasattr; call it, the base declares it"
        undeclared = [(line, attr) for line, attr in reads if attr not in HOOKS]
        assert not undeclared, (f"{where}:{undeclared[0][0]}: reads '{undeclared[0][1]}' on a system class, which "
                                "systems.base.System does not declare")
        seen |= {attr for _line, attr in reads}
    # the checker found the runner's calls: it is not passing for want of reading anything
    assert seen >= {"budgets", "timer_evaluator", "max_workers", "check_spec", "local_workers", "cpu_processes",
                    "cpu_self_role", "paces_steps", "calibration_workload", "calibration_min_step_s", "Options",
                    "unavailable_reason", "run"}
