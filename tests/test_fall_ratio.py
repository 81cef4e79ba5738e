"""The mini-batch fall ratio (Kassela et al. 2019) the report and the thesis table compute:
bench/report/measures.py batch_fall_ratios, on runs written through the real Recorder."""
from __future__ import annotations

import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.report.measures import batch_fall_ratios, batch_fractions
from psbench.core.spec import RunSpec
from tests.report_fixtures import fake_run


def test_fall_ratio_is_largest_over_smallest_with_an_interval_and_fractions(tmp_path):
    for batch, step_s in ((1, 0.001), (10, 0.004), (100, 0.02)):
        fake_run(tmp_path, "fall", RunSpec("ps", "logreg-digits", workers=2, batch_size=batch), step_s=step_s,
                 shards=True, parts={"compute_s": 0.2, "emulated_s": 0.7, "comm_s": 0.1})
    fake_run(tmp_path, "fall", RunSpec("ddp", "logreg-digits", workers=2, batch_size=1), step_s=0.003, shards=True)
    res = load_suite(tmp_path / "fall")
    falls = batch_fall_ratios(res)
    assert list(falls["system"]) == ["ps"]  # ddp has one batch size: no ratio
    row = falls.iloc[0]
    assert row["fall_ratio"] == pytest.approx(20.0, rel=1e-6)
    assert row["lo"] <= 20.0 <= row["hi"] and row["lo"] > 19 and row["hi"] < 21  # workers differ by 2 %
    assert row["n"] == 2 * (24 - 3)  # both workers' step intervals after a 10 % warm-up (3 of 24 steps)
    assert row["largest_batch"] == 100 and row["smallest_batch"] == 1
    assert row["largest_fraction"] == pytest.approx(200 / 300) and row["smallest_fraction"] == pytest.approx(2 / 300)
    assert row["largest_emulated_s"] == pytest.approx(0.7 * 0.02, rel=0.05)  # the breakdown at both ends
    assert row["smallest_comm_s"] == pytest.approx(0.1 * 0.001, rel=0.05)
    assert batch_fractions(res).max() <= 1.0
