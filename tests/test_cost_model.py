"""The Kassela suite's per-iteration cost model (bench/report/cost_model.py) on runs whose costs are
known, written through the real Recorder: the fit recovers the terms, its intervals cover them, the
predicted fall follows the formula, and a cost the model cannot express is flagged as not validated."""
from __future__ import annotations

import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.report import cost_model
from psbench.core.spec import RunSpec
from tests.report_fixtures import fake_run

ROWS_PER_CORE = 150  # fake_run's shard report: 300 rows over 2 workers


def _suite(root, cost, system="ps", suite="kassela", seeds=range(5), batches=(1, 10, 100)):
    for seed in seeds:
        for batch in batches:
            spec = RunSpec(system, "logreg-digits", workers=2, seed=seed, batch_size=batch)
            fake_run(root, suite, spec, step_s=cost(batch) * (1 + 0.01 * (seed - 2)), shards=True)
    return load_suite(root / suite)


def test_the_fit_recovers_known_terms_with_intervals_that_cover_them(tmp_path):
    res = _suite(tmp_path, lambda b: 0.001 + 2e-5 * b)
    (fit,) = cost_model.fit_costs(res)
    assert fit.label == "ps" and fit.n == 15 and fit.rows_per_core == pytest.approx(ROWS_PER_CORE)
    # fake_run's workers step 1 % apart on average: the terms come back within that
    assert fit.fixed.estimate == pytest.approx(0.001 * 1.01, rel=0.02) and fit.fixed.lo < 0.00101 < fit.fixed.hi
    assert fit.per_example.estimate == pytest.approx(2e-5 * 1.01, rel=0.02)
    assert fit.per_example.lo < 2.02e-5 < fit.per_example.hi and fit.scan_per_row is None
    assert fit.validated and fit.max_abs_error < 0.01
    # the fall it predicts: (fixed + b x R) / (fixed + b x f x R)
    expected = (0.001 + 2e-5 * 1000) / (0.001 + 2e-5 * 10)
    fall = fit.fall(1000, 0.01)
    assert fall.estimate == pytest.approx(expected, rel=0.02) and fall.lo < fall.estimate < fall.hi
    table = cost_model.terms_table([fit])
    assert table.loc[0, "within 15%"] == "yes" and "[" in table.loc[0, "fixed ms"]


def test_a_cost_the_line_cannot_express_is_not_validated(tmp_path):
    res = _suite(tmp_path, lambda b: 0.001 + 1e-6 * b * b)  # quadratic in the batch
    (fit,) = cost_model.fit_costs(res)
    assert not fit.validated and fit.max_abs_error > cost_model.VALIDATION_TOLERANCE


def test_fixed_ratio_and_predicted_falls_tables(tmp_path):
    _suite(tmp_path, lambda b: 0.001 + 2e-5 * b)
    res = _suite(tmp_path, lambda b: 0.1 + 2e-5 * b, system="spark-mllib-native")
    fits = cost_model.fit_costs(res)
    ratios = cost_model.fixed_ratios_table(fits)
    (text,) = ratios["fixed ÷ ps's"]
    assert text.startswith("99") or text.startswith("100"), text  # 0.1 / 0.001
    falls = cost_model.predicted_falls(fits)
    assert len(falls) == 2 * (1 + len(cost_model.PAPER_SETUPS))
    spark_paper = falls[(falls["system"] == "spark-mllib-native") & falls["setup"].str.startswith("Kassela 2019: 141")]
    per_core = 11_000_000 / 282
    want = (0.1 + 2e-5 * per_core) / (0.1 + 2e-5 * per_core * 0.01)
    assert spark_paper["fall to 1 %"].iloc[0].estimate == pytest.approx(want, rel=0.03)


def test_the_check_at_another_size_matches_variants_by_their_options(tmp_path):
    """The second suite's native runs set no partitions_per_core (default 1): they check the
    1-per-core fit only, and an error beyond the tolerance there withholds validation."""
    for per_core, fixed in ((1, 0.05), (2, 0.06)):
        for seed in range(3):
            for batch in (1, 10, 100):
                spec = RunSpec("spark-mllib-native", "logreg-digits", workers=2, seed=seed, batch_size=batch,
                               options={"partitions_per_core": per_core})
                fake_run(tmp_path, "kassela", spec, step_s=(fixed + 1e-4 * batch) * (1 + 0.01 * seed), shards=True)
    for seed in range(2):
        for batch, step_s in ((1, 0.05 * 1.3), (100, 0.06)):  # the small batch 30% off the 1 M line
            spec = RunSpec("spark-mllib-native", "logreg-digits", workers=2, seed=seed, batch_size=batch,
                           options={"spark_conf": "spark.driver.memory=10g"})
            fake_run(tmp_path, "kassela-10m", spec, step_s=step_s, shards=True)
    res = load_suite(tmp_path / "kassela")
    fits = cost_model.fit_costs(res)
    check = cost_model.size_check(fits, cost_model.check_suite(res))
    assert set(check["system"]) == {"spark-mllib-native (partitions_per_core=1)"} and len(check) == 2
    assert cost_model.checked_labels(check) == {"spark-mllib-native (partitions_per_core=1)": False}
    falls = cost_model.predicted_falls_table(cost_model.predicted_falls(fits, cost_model.checked_labels(check)))
    assert set(falls["validated"]) == {"no (the other data size missed by > 15%)", "no (not checked at another data size)"}


def test_the_report_writes_the_fits_and_simulate_takes_sparks_job_cost_from_them(tmp_path):
    import json

    from psbench.bench.report.document import build_report
    from psbench.bench.sim.command import spark_cost_from_fit
    from psbench.bench.sim.analytic import PRESETS
    from psbench.core.errors import ConfigError

    _suite(tmp_path, lambda b: 0.001 + 2e-5 * b)
    _suite(tmp_path, lambda b: 0.3 + 2e-5 * b, system="spark-mllib")
    build_report(tmp_path / "kassela")
    saved = tmp_path / "kassela" / cost_model.COST_FILE
    fits = {f["label"]: f for f in json.loads(saved.read_text())["fits"]}
    assert fits["spark-mllib"]["fixed"]["s"] == pytest.approx(0.3 * 1.01, rel=0.02)
    assert load_suite(tmp_path / "kassela").runs["system"].nunique() == 2  # the file is a report output
    base = PRESETS["horovod-paper"]
    cal = spark_cost_from_fit(base, saved)
    assert cal.spark_job_overhead_s == pytest.approx(fits["spark-mllib"]["fixed"]["s"] - 2 * base.spark_task_overhead_s)
    assert "from the kassela fit" in cal.source
    with pytest.raises(ConfigError, match="does not exist"):
        spark_cost_from_fit(base, tmp_path / "none.json")
    saved.write_text(json.dumps({"fits": [fits["ps"]]}))
    with pytest.raises(ConfigError, match="no spark-mllib fit"):
        spark_cost_from_fit(base, saved)
