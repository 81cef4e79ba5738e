"""The throughput regression checker: compare(), the registry, the CLI and the committed baseline."""
from __future__ import annotations

import json
import textwrap

import pytest

import psbench.bench.regress.check as regress
from psbench.core.errors import ConfigError
from psbench.bench.cli import main
from psbench.bench.regress.check import (DEFAULT_BASELINE, RATIO_BENCHMARKS, Measured, Ratio, ToleranceRule, compare,
                                         load_baseline, resolve, spread, updated_baseline)

BASE = {"default_tolerance": 0.25, "metrics": {
    "ps.samples_vs_single": {"value": 2.0, "tolerance": 0.25},
    "ps.round_trip_vs_zmq": {"value": 1.5, "higher_is_better": False},
}}


def status(rows, metric):
    return next(r.status for r in rows if r.metric == metric)


def test_a_30_percent_slowdown_is_a_regression_and_10_percent_is_not():
    rows = compare(BASE, {"ps.samples_vs_single": 2.0 * 0.7, "ps.round_trip_vs_zmq": 1.5})
    assert status(rows, "ps.samples_vs_single") == "REGRESSION"
    assert status(rows, "ps.round_trip_vs_zmq") == "ok"
    row = next(r for r in rows if r.metric == "ps.samples_vs_single")
    assert row.change == pytest.approx(-0.30)
    rows = compare(BASE, {"ps.samples_vs_single": 2.0 * 0.9, "ps.round_trip_vs_zmq": 1.5 * 1.1})
    assert {r.status for r in rows} == {"ok"}


def test_direction_tolerance_override_and_unmatched_metrics():
    # lower is better: 30% higher is the regression, 30% lower an improvement
    assert status(compare(BASE, {"ps.round_trip_vs_zmq": 1.5 * 1.3}), "ps.round_trip_vs_zmq") == "REGRESSION"
    assert status(compare(BASE, {"ps.round_trip_vs_zmq": 1.5 * 0.7}), "ps.round_trip_vs_zmq") == "improved"
    # a wider tolerance given on the command line overrides the file's
    assert status(compare(BASE, {"ps.samples_vs_single": 1.4}, tolerance=0.35), "ps.samples_vs_single") == "ok"
    rows = compare(BASE, {"spark.step_vs_ps": Measured(3.0, True, (2.9, 3.0, 3.1))})
    assert status(rows, "spark.step_vs_ps") == "new"
    assert status(rows, "ps.samples_vs_single") == "not measured"
    # the bare metrics mapping works too
    assert status(compare(BASE["metrics"], {"ps.samples_vs_single": 1.0}), "ps.samples_vs_single") == "REGRESSION"


@pytest.fixture
def fake_benchmark(tmp_path, monkeypatch):
    """A registry entry in module form (every ratio_* function), as bench/regress/ps_benchmarks.py will be."""
    (tmp_path / "fakebench.py").write_text(textwrap.dedent("""
        import os
        from psbench.bench.regress.check import Ratio
        def ratio_throughput(quick=False):
            return {"vs_single": float(os.environ["FAKE_RATIO"])}
        def ratio_latency():
            return {"vs_zmq": Ratio(1.0, higher_is_better=False)}
        def helper():
            raise AssertionError("not a ratio_* function: must not run")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(RATIO_BENCHMARKS, "fake", "fakebench")
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"metrics": {
        "fake.throughput.vs_single": {"value": 2.0, "tolerance": 0.25},
        "fake.latency.vs_zmq": {"value": 1.0, "higher_is_better": False}}}))
    return baseline


def test_cli_fails_on_a_30_percent_slowdown(fake_benchmark, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RATIO", "1.4")
    assert main(["regress", "--only", "fake", "--baseline", str(fake_benchmark), "--repeats", "3"]) == 1
    out = capsys.readouterr().out
    assert "fake.throughput.vs_single" in out and "REGRESSION" in out and "-30.0%" in out


def test_cli_passes_within_tolerance_and_updates_the_baseline(fake_benchmark, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RATIO", "1.8")
    assert main(["regress", "--only", "fake", "--baseline", str(fake_benchmark), "--repeats", "2"]) == 0
    assert "-10.0%" in capsys.readouterr().out
    assert main(["regress", "--only", "fake", "--baseline", str(fake_benchmark), "--update-baseline",
                 "--repeats", "1"]) == 0
    data = load_baseline(fake_benchmark)
    assert data["metrics"]["fake.throughput.vs_single"]["value"] == pytest.approx(1.8)
    assert data["metrics"]["fake.latency.vs_zmq"]["higher_is_better"] is False
    # the tolerance now comes from the repeats' spread: none here (the same value each time), so the floor
    assert data["tolerance_rule"] == {"mads": 4.0, "floor": 0.1}
    assert data["metrics"]["fake.throughput.vs_single"]["spread"] == 0.0
    assert data["metrics"]["fake.throughput.vs_single"]["tolerance"] == 0.1
    assert data["machine"]["cores"] >= 1
    assert main(["regress", "--only", "fake", "--baseline", str(fake_benchmark), "--update-baseline",
                 "--tolerance", "0.3"]) == 2  # a baseline's tolerances are measured, not given


def test_bad_input_is_a_clear_error(fake_benchmark, tmp_path, capsys):
    assert main(["regress", "--only", "nope"]) == 2
    assert "unknown benchmark(s) nope" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["regress", "--only", "fake", "--baseline", str(broken)]) == 2
    assert "corrupt baseline" in capsys.readouterr().err
    assert main(["regress", "--only", "fake", "--baseline", str(tmp_path / "missing.json")]) == 2
    assert "--update-baseline" in capsys.readouterr().err


def test_a_metrics_tolerance_is_a_multiple_of_its_spread_with_a_floor():
    rule = ToleranceRule(mads=4.0, floor=0.1)
    assert spread([1.0, 1.1, 0.9, 1.2, 0.8]) == pytest.approx(0.1)  # MAD 0.1 over the median 1.0
    assert rule.tolerance([1.0, 1.1, 0.9, 1.2, 0.8]) == pytest.approx(0.4)  # noisy: wide
    assert rule.tolerance([2.0, 2.02, 1.98, 2.0, 2.01]) == 0.1  # lucky-tight: the floor, not 0.04
    assert rule.tolerance([3.0]) == 0.1 and spread([]) == 0.0
    assert ToleranceRule.of({"tolerance_rule": {"mads": 3, "floor": 0.2}}) == ToleranceRule(3, 0.2)
    with pytest.raises(ConfigError, match="tolerance_rule is"):
        ToleranceRule.of({"tolerance_rule": {"sigmas": 3}})
    # from a baseline run: a steady metric flags a 20% drop, a noisy one (its repeats 30% apart) does not
    measured = {"x.steady": Measured(1.0, True, (1.0, 1.01, 0.99, 1.0, 1.02)),
                "x.noisy": Measured(1.0, True, (1.0, 1.1, 0.9, 1.3, 0.7))}
    baseline = updated_baseline(None, measured, quick=True)
    assert [baseline["metrics"][m]["tolerance"] for m in ("x.steady", "x.noisy")] == [0.1, 0.4]
    rows = compare(baseline, {"x.steady": 0.8, "x.noisy": 0.8})
    assert status(rows, "x.steady") == "REGRESSION" and status(rows, "x.noisy") == "ok"


def test_the_committed_baseline_follows_its_tolerance_rule():
    """Every tolerance in the committed baseline is the rule applied to that metric's own repeats
    (none set by hand), and the PS path's steady metrics are tight enough to see a 20% slow-down."""
    baseline = load_baseline(DEFAULT_BASELINE)
    rule = ToleranceRule.of(baseline)
    assert "tolerance_rule" in baseline and rule.floor < 0.2
    for name, m in baseline["metrics"].items():
        assert len(m["samples"]) >= 5, name
        assert m["spread"] == round(spread(m["samples"]), 4) and m["tolerance"] == rule.tolerance(m["samples"]), name
    assert min(baseline["metrics"][f"ps.asp1_vs_echo_{w}"]["tolerance"] for w in ("cnn_mnist1d", "mlp_digits")) < 0.15


@pytest.mark.slow  # ~110 s of benchmark repeats: `make test-slow` (CI runs it)
def test_against_a_commit_a_20_percent_ps_slowdown_fails_and_the_untouched_metrics_pass(monkeypatch, capsys):
    """`make regress`'s way: the committed HEAD installed in a temporary venv and measured on this
    machine beside this checkout, interleaved. Made 20% slower here (PSBENCH_REGRESS_PS_SLOWDOWN,
    tests only, which reaches this checkout's side alone), the metrics with the PS in them fail and
    the ones without it (the raw echo against single) pass in the same run. (That the whole gate
    passes on unchanged code is `make regress` itself, which CI runs.)"""
    from psbench.bench.regress.ps_benchmarks import SLOWDOWN_ENV

    monkeypatch.setenv(SLOWDOWN_ENV, "0.2")
    assert main(["regress", "--only", "ps", "--quick", "--against", "HEAD"]) == 1
    out, err = capsys.readouterr()
    rows = _measured_rows(out)
    flagged = {m for m, (_, state) in rows.items() if state == "REGRESSION"}
    assert flagged and flagged <= {m for m in rows if m.startswith("ps.asp1_")}, out  # the PS side's only
    assert {state for m, (_, state) in rows.items() if m.startswith("ps.echo_")} == {"ok"}, out
    assert f"REGRESSION in {', '.join(sorted(flagged))}" in err
    assert "measured on this machine beside this checkout, 5 interleaved repeat(s) each" in out
    assert "installing" in err and err.count("this checkout") == 5


def test_the_slowdown_knob_takes_a_fraction_only(monkeypatch, capsys):
    from psbench.bench.regress.ps_benchmarks import SLOWDOWN_ENV

    monkeypatch.setenv(SLOWDOWN_ENV, "1.5")
    assert main(["regress", "--only", "ps", "--quick", "--repeats", "1"]) == 2
    assert "PSBENCH_REGRESS_PS_SLOWDOWN='1.5': a fraction of throughput in [0, 1)" in capsys.readouterr().err


def test_against_checks_its_input_and_falls_back_only_for_the_baselines_own_commit(fake_benchmark, monkeypatch,
                                                                                     capsys):
    monkeypatch.setenv("FAKE_RATIO", "2.0")
    fake = ["regress", "--only", "fake", "--baseline", str(fake_benchmark), "--repeats", "1"]
    assert main([*fake, "--against", "no-such-rev"]) == 2
    assert "--against no-such-rev: not a commit" in capsys.readouterr().err
    assert main([*fake, "--against", "HEAD", "--update-baseline"]) == 2
    assert "use one" in capsys.readouterr().err
    assert main([*fake, "--against"]) == 2  # this baseline names no commit
    assert "baseline file's git_sha" in capsys.readouterr().err
    # the baseline's commit missing from this clone (a shallow one): the stored values, and it says so
    data = json.loads(fake_benchmark.read_text())
    fake_benchmark.write_text(json.dumps({**data, "git_sha": "0" * 40}))
    assert main([*fake, "--against"]) == 0
    out, err = capsys.readouterr()
    assert "comparing with the baseline's stored values instead" in err and "fake.throughput.vs_single" in out


def test_side_by_side_tolerance_comes_from_the_noisier_side_or_the_recorded_spread():
    rule = ToleranceRule(mads=4.0, floor=0.1)
    there = {"m.steady": Measured(1.0, True, (1.0, 1.01, 0.99, 1.0, 1.0)),
             "m.noisy_here": Measured(1.0, False, (1.0, 1.0, 1.0, 1.0, 1.0)), "m.gone": Measured(1.0, True, (1.0,)),
             "m.lucky": Measured(1.0, True, (1.0, 1.01, 0.99, 1.0)),
             "m.noisy": Measured(1.0, True, (1.0, 1.01, 0.99, 1.0))}
    here = {"m.steady": Measured(0.85, True, (0.85, 0.85, 0.86, 0.84, 0.85)),
            "m.noisy_here": Measured(1.2, False, (1.2, 1.3, 1.1, 1.4, 1.0)), "m.new": Measured(2.0, True, (2.0,)),
            "m.lucky": Measured(0.88, True, (0.88, 0.87, 0.88, 0.89)),
            "m.noisy": Measured(0.88, True, (0.88, 0.87, 0.88, 0.89))}
    # the baseline file's repeats of m.noisy spread 5%: this run's tight 4 + 4 do not make it gate 10%
    recorded = {"metrics": {"m.noisy": {"value": 1.0, "spread": 0.05}, "m.steady": {"value": 1.0, "spread": 0.01}}}
    base = regress.side_by_side_baseline(there, here, rule, recorded)
    assert base["metrics"]["m.steady"]["tolerance"] == 0.1
    assert base["metrics"]["m.noisy_here"] == {"value": 1.0, "higher_is_better": False,
                                               "tolerance": rule.tolerance([1.2, 1.3, 1.1, 1.4, 1.0])}
    assert base["metrics"]["m.noisy"]["tolerance"] == 0.2 and base["metrics"]["m.lucky"]["tolerance"] == 0.1
    rows = compare(base, here)
    assert [status(rows, m) for m in ("m.steady", "m.noisy_here", "m.gone", "m.new", "m.lucky", "m.noisy")] == \
        ["REGRESSION", "ok", "not measured", "new", "REGRESSION", "ok"]
    # the run says which metrics it could have caught a 20% slow-down on: m.noisy_here's tolerance
    # (4 x MAD 0.1 / median 1.2 = 33%) and m.noisy's (4 x its recorded 5% = 20%) let one through;
    # m.gone and m.new were not compared
    line = regress.gate_coverage(rows)
    assert line.startswith("this run gates a 20% slow-down on 2 of 4 metrics"), line
    assert "too noisy here to: m.noisy (±20%), m.noisy_here (±33%)" in line and "m.gone" not in line
    steady = [r for r in rows if r.metric == "m.steady"]
    assert regress.gate_coverage(steady) == "this run gates a 20% slow-down on 1 of 1 metrics"


def _measured_rows(table: str) -> dict[str, tuple[float, str]]:
    """metric -> (measured, status) from format_table's output."""
    rows = {}
    for line in table.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("ps."):
            rows[cells[0]] = (float(cells[2]), cells[-1])
    return rows


def test_every_registered_benchmark_resolves_and_has_a_baseline():
    baseline = load_baseline(DEFAULT_BASELINE)
    for name in RATIO_BENCHMARKS:
        assert resolve(name), name
        assert any(m.startswith(f"{name}.") for m in baseline["metrics"]), f"{name} has no baseline"
    assert baseline["machine"]["cores"] >= 1


def test_harness_overhead_end_to_end_against_the_committed_baseline(capsys):
    assert main(["regress", "--only", "harness_overhead", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "harness_overhead.single_vs_bare_loop" in out and "REGRESSION" not in out


def test_ratio_type_is_exported_for_benchmark_authors():
    assert regress.Ratio(1.0).higher_is_better and not Ratio(1.0, higher_is_better=False).higher_is_better


def test_ps_overhead_reports_every_committed_ps_metric_and_its_ceiling(monkeypatch):
    """ps_overhead passes on what the interleaved benchmark measured, the raw-echo ceiling
    (echo_vs_single) included, under the names the committed baseline gates."""
    import psbench.bench.regress.ps_benchmarks as ps_benchmarks
    from psbench.bench.regress.benchmarks import ps_overhead

    measured = {f"{side}_{name}": 0.1 * i for name in ("cnn_mnist1d", "mlp_digits")
                for i, side in enumerate(("asp1_vs_single", "asp1_vs_echo", "echo_vs_single"), 1)}
    monkeypatch.setattr(ps_benchmarks, "ratio_asp_vs_single_interleaved", lambda *a, **k: dict(measured))
    out = ps_overhead(quick=True)
    assert out == measured
    gated = {m.removeprefix("ps.") for m in load_baseline(DEFAULT_BASELINE)["metrics"] if m.startswith("ps.")}
    assert gated == set(out)


def test_the_echo_does_a_shards_arithmetic_only_when_asked():
    """The raw echo sends bytes back as they came; with the SGD_ECHO header it first applies the
    shard's update (lr 0 from zero weights: zeros come back), and a non-finite gradient is left as is."""
    import numpy as np

    from psbench.bench.regress.ps_benchmarks import SGD_ECHO, echo

    grad = np.full(1000, 2.0, np.float32)
    with echo() as sock:
        replies = []
        for header, payload in ((b"h", grad), (SGD_ECHO, grad), (SGD_ECHO, np.full(1000, np.nan, np.float32))):
            sock.send_multipart([header, payload])
            replies.append(np.frombuffer(sock.recv_multipart()[1], np.float32))
    assert np.array_equal(replies[0], grad)
    assert np.array_equal(replies[1], np.zeros_like(grad))
    assert np.isnan(replies[2]).all()
