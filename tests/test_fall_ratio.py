"""The mini-batch fall ratio (Kassela et al. 2019) the report and the thesis table compute:
bench/report/measures.py batch_fall_ratios, on runs written through the real Recorder."""
from __future__ import annotations

import pytest

from psbench.bench.harness.results import load_suite
from psbench.bench.report.measures import batch_fall_ratios, batch_fractions
from psbench.core.spec import RunSpec
from tests.report_fixtures import fake_run


def test_fall_ratio_is_largest_over_smallest_paired_by_seed_with_an_interval_and_fractions(tmp_path):
    for seed in range(3):
        for batch, step_s in ((1, 0.001), (10, 0.004), (100, 0.02 * (1 + 0.02 * seed))):
            fake_run(tmp_path, "fall", RunSpec("ps", "logreg-digits", workers=2, batch_size=batch, seed=seed),
                     step_s=step_s, shards=True, parts={"compute_s": 0.2, "emulated_s": 0.7, "comm_s": 0.1})
    fake_run(tmp_path, "fall", RunSpec("ddp", "logreg-digits", workers=2, batch_size=1), step_s=0.003, shards=True)
    res = load_suite(tmp_path / "fall")
    falls = batch_fall_ratios(res)
    assert list(falls["system"]) == ["ps"]  # ddp has one batch size: no ratio
    row = falls.iloc[0]
    geometric = (20.0 * 20.4 * 20.8) ** (1 / 3)  # one ratio a seed, each run's mean over both workers
    assert row["fall_ratio"] == pytest.approx(geometric, rel=1e-3)
    assert row["lo"] < row["fall_ratio"] < row["hi"] and row["lo"] > 19 and row["hi"] < 22
    assert row["n"] == 3  # seeds, not step intervals
    assert row["largest_batch"] == 100 and row["smallest_batch"] == 1
    assert row["largest_fraction"] == pytest.approx(200 / 300) and row["smallest_fraction"] == pytest.approx(2 / 300)
    assert row["largest_emulated_s"] == pytest.approx(0.7 * 0.02, rel=0.05)  # the breakdown at both ends
    assert row["smallest_comm_s"] == pytest.approx(0.1 * 0.001, rel=0.05)
    assert batch_fractions(res).max() <= 1.0


def test_one_seed_a_side_has_no_interval(tmp_path):
    for batch, step_s in ((1, 0.001), (100, 0.02)):
        fake_run(tmp_path, "fall", RunSpec("ps", "logreg-digits", workers=2, batch_size=batch), step_s=step_s,
                 shards=True)
    row = batch_fall_ratios(load_suite(tmp_path / "fall")).iloc[0]
    assert row["n"] == 1 and row["fall_ratio"] == pytest.approx(20.0, rel=1e-6) and row["lo"] != row["lo"]


def test_the_plots_legends_give_the_tables_fall_ratio(tmp_path, monkeypatch):
    """One definition of the fall (FALL_RULE): the legend of the step-time plots shows the table's
    seed-paired geometric mean, not a ratio of median step times (here 28.8x against 20x)."""
    import matplotlib.pyplot as plt

    import psbench.bench.report.plots as plots

    for seed, big_step_s in enumerate((0.02, 0.02, 0.06)):
        for batch, step_s in ((1, 0.001), (100, big_step_s)):
            fake_run(tmp_path, "fall", RunSpec("ps", "logreg-digits", workers=2, batch_size=batch, seed=seed),
                     step_s=step_s, shards=True)
    res = load_suite(tmp_path / "fall")
    table = batch_fall_ratios(res).iloc[0]["fall_ratio"]
    assert table == pytest.approx((20 * 20 * 60) ** (1 / 3), rel=1e-3)
    legends: dict[str, list[str]] = {}

    def keep(fig: plt.Figure, out_dir, name: str) -> list:
        legends[name] = [text for ax in fig.axes for text in ax.get_legend_handles_labels()[1]]
        plt.close(fig)
        return []

    monkeypatch.setattr(plots, "save", keep)
    plots.step_time_vs_fraction(res, tmp_path)
    plots.step_time_vs_batch(res, tmp_path)
    assert legends["step_time_vs_fraction"] == [f"ps ({table:.3g}x)"]
    assert legends["step_time_vs_batch"] == [f"ps ({table:.2f}x)"]
