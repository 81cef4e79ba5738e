"""The throughput regression checker: compare(), the registry, the CLI and the committed baseline."""
from __future__ import annotations

import json
import textwrap

import pytest

import psbench.bench.regress.check as regress
from psbench.bench.cli import main
from psbench.bench.regress.check import DEFAULT_BASELINE, RATIO_BENCHMARKS, Measured, Ratio, compare, load_baseline, resolve

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
    assert data["metrics"]["fake.throughput.vs_single"]["tolerance"] == 0.25  # kept
    assert data["machine"]["cores"] >= 1


def test_bad_input_is_a_clear_error(fake_benchmark, tmp_path, capsys):
    assert main(["regress", "--only", "nope"]) == 2
    assert "unknown benchmark(s) nope" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert main(["regress", "--only", "fake", "--baseline", str(broken)]) == 2
    assert "corrupt baseline" in capsys.readouterr().err
    assert main(["regress", "--only", "fake", "--baseline", str(tmp_path / "missing.json")]) == 2
    assert "--update-baseline" in capsys.readouterr().err


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
