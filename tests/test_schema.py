"""Every bad file is one line: experiment files and run manifests of the wrong shape are refused by
bench/harness/schema.py with a ConfigError naming the file, the field and what is allowed (the CLI's
exit 2), never a traceback, and never accepted with a value the planner would trip on later."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psbench.bench import cli
from psbench.bench.harness.matrix import expand, load_experiment
from psbench.core.configfile import load_config
from psbench.bench.harness.results import load_suite
from psbench.bench.harness.schema import MAX_WORKERS, check_experiment, check_manifest
from psbench.bench.harness import store
from psbench.core.errors import ConfigError
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = sorted((ROOT / "bench" / "experiments").rglob("*.toml"))
# a committed manifest of a PS run: conditions, CPU plan, calibration and all, as a base to spoil
# (packed or in run folders, bench/harness/store.py)
REFERENCE_MANIFEST = next(m for m in store.suite_manifests(ROOT / "results" / "reference" / "systems")
                          if m["run_id"].startswith("ps-mlp-digits-w2-"))
GOOD_TOML = 'suite = "tiny"\n[matrix]\nsystem = ["single"]\nworkload = ["mlp-digits"]\n'


def _one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    assert cli.main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


# ---- experiment files ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, field, allowed", [
    ('suite = "x"\nmatrix = 5\n', "[matrix]", "a table"),
    (GOOD_TOML + 'workers = ["4"]\n', "[matrix] workers[0]", f"an integer from 1 to {MAX_WORKERS}"),
    (GOOD_TOML + "workers = 2.5\n", "[matrix] workers", "an integer from 1"),
    (GOOD_TOML + "workers = true\n", "[matrix] workers", "an integer from 1"),
    (GOOD_TOML + f"workers = {MAX_WORKERS + 1}\n", "[matrix] workers", f"an integer from 1 to {MAX_WORKERS}"),
    (GOOD_TOML + "seed = -1\n", "[matrix] seed", "an integer from 0"),
    (GOOD_TOML + "lr = nan\n", "[matrix] lr", "a number > 0"),
    (GOOD_TOML + "[settings]\nepochs = [1, 2]\n", "[settings] epochs", "an integer >= 1"),
    (GOOD_TOML + "[exclude]\nsystem = \"ps\"\n", "[exclude]", "an array of tables ([[exclude]] entries)"),
    (GOOD_TOML + "[[override]]\nworkload = \"mlp-digits\"\nsettings = { max_steps = 0 }\n",
     "[[override]] #1 settings max_steps", "an integer >= 1"),
    (GOOD_TOML + "[options]\nps = 3\n", "[options.ps]", "a table"),
    (GOOD_TOML + "[matrix.options.ps]\nconsistency = [[\"asp\"]]\n", "[matrix.options.ps] consistency[0]",
     "a single value"),
    ('suite = "../.."\n' + GOOD_TOML.split("\n", 1)[1], "suite", "no path separator"),
    ('suite = "/tmp/elsewhere"\n' + GOOD_TOML.split("\n", 1)[1], "suite", "no path separator"),
    ('suite = ".hidden"\n' + GOOD_TOML.split("\n", 1)[1], "suite", "starting with a letter or digit"),
    ('allow_oversubscribe = "yes"\n' + GOOD_TOML, "allow_oversubscribe", "true or false"),
])
def test_a_bad_experiment_file_is_one_line_naming_file_field_and_what_is_allowed(
        tmp_path, capsys, text, field, allowed):
    file = tmp_path / "bad.toml"
    file.write_text(text)
    line = _one_line_exit_2(["run", "--config", str(file), "--results-dir", str(tmp_path / "r"), "--no-progress"],
                            capsys)
    assert line.startswith(f"psbench: error: {file}: {field}: got ") and allowed in line, line
    assert not (tmp_path / "r").exists()


def test_a_suite_name_from_the_command_line_or_a_cluster_file_stays_inside_results(tmp_path, capsys):
    from psbench.bench.lab.cluster import file as cluster_file

    line = _one_line_exit_2(["run", "--system", "single", "--workload", "mlp-digits", "--suite", "../out",
                             "--results-dir", str(tmp_path / "r")], capsys)
    assert "psbench run: --suite: got '../out' (text)" in line and "no path separator" in line
    raw = {"launcher": "local", "suite": "/etc", "run": {"system": "ps", "workload": "mlp-digits"},
           "hosts": [{"name": "a", "roles": ["ps-server", "worker"]}]}
    with pytest.raises(ConfigError, match=r"cluster\.toml: suite: got '/etc'"):
        cluster_file.parse(raw, "cluster.toml")
    assert cluster_file.parse({**raw, "suite": "lab-1"}, "cluster.toml").suite == "lab-1"


def test_a_run_by_hand_and_a_cluster_files_run_meet_the_same_bounds(tmp_path, capsys):
    from psbench.bench.lab.cluster import file as cluster_file

    line = _one_line_exit_2(["run", "--system", "single", "--workload", "mlp-digits", "-np", str(MAX_WORKERS + 1),
                             "--results-dir", str(tmp_path / "r"), "--no-progress"], capsys)
    assert line == (f"psbench: error: psbench run: --workers: got {MAX_WORKERS + 1} (an integer); allowed: an "
                    f"integer from 1 to {MAX_WORKERS}")
    assert not (tmp_path / "r").exists()
    raw = {"launcher": "local", "run": {"system": "ps", "workload": "mlp-digits", "seed": "1"},
           "hosts": [{"name": "a", "roles": ["ps-server", "worker"]}]}
    with pytest.raises(ConfigError, match=r"^cluster\.toml: \[run\] seed: got '1' \(text\); allowed: an integer"):
        cluster_file.parse(raw, "cluster.toml")
    assert cluster_file.parse({**raw, "run": {**raw["run"], "seed": 1}}, "cluster.toml").spec.seed == 1


def test_every_shipped_experiment_fits_the_schema_and_the_workers_bound():
    """The bound is no narrower than what we ship (the largest: 16 workers in extra/switch_map.toml)."""
    largest = 0
    for file in EXPERIMENTS:
        check_experiment(load_config(file), file)
        for quick in (False, True):
            largest = max([largest] + [s.workers for s in load_experiment(file, quick=quick).specs])
    assert 16 <= largest <= MAX_WORKERS


# ---- manifests -----------------------------------------------------------------------------------

def _suite(root: Path, runs: int = 1) -> Path:
    """A suite of tiny runs written by the Recorder, their manifests' extra from a committed PS run."""
    reference = json.loads(json.dumps(REFERENCE_MANIFEST))  # a fresh copy: the recorders keep its dicts
    for seed in range(runs):
        recorder = Recorder(RunSpec("ps", "mlp-digits", workers=2, seed=seed, max_steps=2), target_accuracy=0.9)
        recorder.start_clock()
        for step in range(2):
            for worker in range(2):
                recorder.step(worker, step, 32, 1.0 - 0.1 * step, staleness=step)
        recorder.eval(2, "val", 0.5, 0.8)
        recorder.extra.update(reference["extra"])
        recorder.finish(root, "suite", record_format="csv")
    return root / "suite"


def _manifest_file(suite: Path) -> Path:
    return sorted(suite.glob("*/manifest.json"))[0]


@pytest.mark.parametrize("spoil, field, allowed", [
    (lambda m: m["spec"].__setitem__("workers", "4"), "spec.workers", "an integer from 1 to"),
    (lambda m: m.__setitem__("run_id", {"a": 1}), "run_id", "a name of letters"),
    (lambda m: m["spec"].__setitem__("seed", None), "spec.seed", "an integer from 0"),
    (lambda m: m["spec"].__setitem__("options", ["a"]), "spec.options", "a table"),
    (lambda m: m["spec"].__setitem__("workers", True), "spec.workers", "an integer from 1 to"),
    (lambda m: m["summary"].__setitem__("samples_per_s", "fast"), "summary.samples_per_s", "a number or null"),
    (lambda m: m["summary"].__setitem__("workers", "x"), "summary.workers", "allowed only in spec"),
    (lambda m: m["extra"]["conditions"].__setitem__("cores", [2]), "extra.conditions.cores", "a number or null"),
    (lambda m: m.__setitem__("git_dirty", "no"), "git_dirty", "true, false or null"),
])
def test_a_manifest_of_wrong_types_is_one_line_from_report_compare_and_thesis(tmp_path, capsys, spoil, field,
                                                                            allowed):
    suite = _suite(tmp_path / "results")
    assert len(load_suite(suite).runs) == 1  # the good one loads
    file = _manifest_file(suite)
    manifest = json.loads(file.read_text())
    spoil(manifest)
    file.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as refused:
        load_suite(suite)
    assert str(refused.value).startswith(f"{file}: {field}") and allowed in str(refused.value)
    for argv in (["report", str(suite)], ["compare", str(suite), str(suite), "--out", str(tmp_path / "cmp")],
                 ["thesis", str(tmp_path / "results")]):
        assert _one_line_exit_2(argv, capsys) == f"psbench: error: {refused.value}"


def test_every_committed_manifest_fits_the_schema():
    """Records of earlier commits stay readable: absolute calibration paths, missing newer fields.
    Every manifest under results/, in run folders and in packed runs tables alike (the whole record,
    since any one of them could be the one a reader trips on; a suite linked from two places is
    read once)."""
    folders = sorted({file.resolve() for file in (ROOT / "results").rglob("manifest.json")})
    packed = sorted({table.resolve().parent.parent for table in (ROOT / "results").rglob("runs.parquet")
                     if table == store.runs_file(table.parent.parent)})
    for file in folders:
        check_manifest(json.loads(file.read_text()), file)
    packed_manifests = [m for suite in packed for m in store.suite_manifests(suite)]
    for manifest in packed_manifests:
        check_manifest(manifest, Path(str(manifest.get("run_id"))))
    # the reference is packed: seven suites, 468 runs (staged runs in results/reference-next are folders)
    assert len(packed) >= 7 and len(packed_manifests) >= 468


# ---- property: mutated files give a clean load or one ConfigError -------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=4)
EDGE_NUMBERS = st.sampled_from([0, -1, 1, 2.5, MAX_WORKERS, MAX_WORKERS + 1, 2**31, 10**9, True, False, "4", None,
                                [], {}, [4], float("nan")])


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, prefix + (i,))
    return out


@st.composite
def mutated(draw, base: Any, extra_keys: list[str]) -> Any:
    """`base` with 1-3 changes: a value swapped for another type or an out-of-range number, a field
    dropped, or a field added (a run setting's name among them)."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["swap", "edge", "drop", "add"]))
        if action == "drop":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(extra_keys) | st.text(max_size=6))] = draw(EDGE_NUMBERS | JSON_VALUES)
        else:
            parent[path[-1]] = draw(EDGE_NUMBERS if action == "edge" else JSON_VALUES)
    return doc



@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """A suite of one run, and its manifest with the parts of `extra` the reader uses (so most
    mutations land on a field that is read)."""
    suite = _suite(tmp_path_factory.mktemp("one-run"))
    manifest = json.loads(_manifest_file(suite).read_text())
    conditions = manifest["extra"]["conditions"]
    manifest["extra"] = {"setup_s": 0.5, "allreduce_alone_s": None, "switch": {"handover_s": 0.1},
                         "conditions": {k: conditions[k] for k in ("cores", "cpu_demand", "cpu_measured",
                                                                   "oversubscribed")}}
    return suite, manifest

RUN_KEYS = ["workers", "seed", "system", "epochs", "options", "run_id", "spec", "summary", "extra", "exclude",
            "matrix", "settings", "quick", "override", "suite", "lr", "batch_size", "max_steps"]


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_manifest_loads_or_is_one_config_error(one_run, data):
    suite, base = one_run
    _manifest_file(suite).write_text(json.dumps(data.draw(mutated(base, RUN_KEYS))))
    try:
        load_suite(suite)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc)


EXPERIMENT_BASES = [load_config(ROOT / "bench" / "experiments" / name)
                    for name in ("systems.toml", "staleness.toml", "switch.toml")]


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_experiment_file_expands_or_is_one_config_error(tmp_path, data):
    base = data.draw(st.sampled_from(EXPERIMENT_BASES))
    config = data.draw(mutated(base, RUN_KEYS))
    file = tmp_path / "mutated.yaml"
    file.write_text(yaml.safe_dump(config))
    try:
        experiment = load_experiment(file, quick=data.draw(st.booleans()))
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc)
    else:  # accepted: every run is one the planner can take
        assert all(type(s.workers) is int and 1 <= s.workers <= MAX_WORKERS for s in experiment.specs)
        assert "/" not in experiment.suite and experiment.suite not in (".", "..")


def test_expand_checks_a_config_given_as_a_dict_too():
    with pytest.raises(ConfigError, match=r"^experiment: \[matrix\] workers: got true \(a boolean\)"):
        expand({"matrix": {"system": "single", "workload": "mlp-digits", "workers": True}})


def test_a_key_with_a_newline_is_refused_in_one_line(tmp_path):
    """What the mutation test once drew: a [matrix] key that is a newline, its value null."""
    file = tmp_path / "x.yaml"
    file.write_text('suite: x\nmatrix:\n  system: [single]\n  workload: [mlp-digits]\n  "\\n": null\n')
    with pytest.raises(ConfigError) as caught:
        load_experiment(file)
    assert "\n" not in str(caught.value) and "[matrix] \\n: got null" in str(caught.value)
