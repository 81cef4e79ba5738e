"""The thesis' verdicts (bench/report/thesis.py) on suites whose answers are known, written through
the real Recorder, and the paired statistics behind them."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr

from psbench.bench.cli import main
from psbench.bench.harness.results import load_suite
from psbench.bench.report import measures, sharding, thesis
from psbench.bench.report.claims import Verdict
from psbench.bench.report.stats import paired_diff_ci, paired_ratio_ci, paired_variance_ratio, variance_ratio
from psbench.core.spec import RunSpec
from report_fixtures import fake_run


# ---- paired statistics ---------------------------------------------------------------------------

def test_paired_variance_ratio_finds_a_real_reduction():
    """Runs share a seed effect (initial weights, batch order); the treatment's own noise differs."""
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 0.3, 20)
    noisy = seed_effect + rng.normal(0, 0.6, 20)
    calm = seed_effect + rng.normal(0, 0.1, 20)
    paired = paired_variance_ratio(noisy, calm)
    assert paired.p_pitman_morgan < 0.05 and paired.lo > 1
    # Pitman–Morgan is the test of zero correlation between the pairs' sums and differences
    assert paired.p_pitman_morgan == pytest.approx(pearsonr(noisy + calm, noisy - calm).pvalue)
    assert paired.ratio == pytest.approx(variance_ratio(noisy, calm).ratio)  # the same ratio, a paired interval


def test_paired_variance_ratio_of_equal_treatments_is_not_significant():
    rng = np.random.default_rng(1)
    seed_effect = rng.normal(0, 1.0, 20)
    a, b = seed_effect + rng.normal(0, 0.3, 20), seed_effect + rng.normal(0, 0.3, 20)
    vr = paired_variance_ratio(a, b)
    assert vr.p_pitman_morgan > 0.05 and vr.lo < 1 < vr.hi


def test_paired_brown_forsythe_and_the_spread_ratio():
    """The robust paired test is a paired t on absolute deviations from each sample's median; its
    effect size, the spread ratio, is the variance ratio where the two differ only in scale."""
    from scipy.stats import ttest_rel
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(200), rng.standard_normal(200) / 2  # a 4x variance ratio, scale only
    vr = paired_variance_ratio(a, b, spread_confidence=0.999)
    dev_a, dev_b = np.abs(a - np.median(a)), np.abs(b - np.median(b))
    assert vr.p_paired_brown_forsythe == pytest.approx(ttest_rel(dev_a, dev_b).pvalue)
    assert vr.spread_ratio == pytest.approx((dev_a.mean() / dev_b.mean()) ** 2)
    assert vr.spread_lo < 4 < vr.spread_hi and vr.spread_confidence == 0.999
    at_95 = paired_variance_ratio(a, b)
    assert at_95.spread_lo > vr.spread_lo and at_95.spread_hi < vr.spread_hi  # the corrected level is wider


def test_paired_ratio_counts_unreached_targets_as_infinitely_late():
    iv = paired_ratio_ci([4.0, 5.0, np.inf, 6.0, 5.0], [2.0, 2.5, 3.0, 3.0, 2.5], "median")
    assert iv.estimate == pytest.approx(2.0) and iv.n == 5 and iv.hi == np.inf
    with pytest.raises(ValueError, match="differ in length"):
        paired_ratio_ci([1.0, 2.0], [1.0])
    diff = paired_diff_ci([0.80, 0.81, 0.82], [0.79, 0.80, 0.81])
    assert diff.estimate == pytest.approx(0.01) and diff.lo == pytest.approx(0.01)


# ---- verdicts --------------------------------------------------------------------------------------

_BUILT: dict[str, Path] = {}  # a suite's arguments -> where it was built, once a module


@pytest.fixture(scope="module", autouse=True)
def _built_suites(tmp_path_factory) -> Iterator[None]:
    global _BUILT_ROOT
    _BUILT_ROOT = tmp_path_factory.mktemp("built")
    yield
    _BUILT.clear()


def _copy_of_built(root: Path, suite: str, build: Callable[..., None], **arguments) -> Path:
    """The suite `build(folder, suite, **arguments)` writes, built the first time a module asks for it
    and copied into root/suite each time: a test that edits its records edits its own copy."""
    import shutil

    key = repr((build.__name__, suite, sorted(arguments.items())))
    if key not in _BUILT:
        folder = _BUILT_ROOT / str(len(_BUILT))
        build(folder, suite, **arguments)
        _BUILT[key] = folder / suite
    shutil.copytree(_BUILT[key], root / suite, dirs_exist_ok=True)
    return root / suite


def _sharding_suite(root: Path, calm: float, stragglers: tuple[str | None, ...] = (None,), seeds: int = 20,
                    suite: str = "sharding", steps: int = 24) -> Path:
    return _copy_of_built(root, suite, _write_sharding_suite, calm=calm, stragglers=stragglers, seeds=seeds,
                          steps=steps)


def _write_sharding_suite(root: Path, suite: str, calm: float, stragglers: tuple[str | None, ...], seeds: int,
                          steps: int) -> None:
    for strategy, spread in (("random", 0.05), ("stratified", calm)):
        for seed in range(seeds):
            for slow in stragglers:
                spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                               options={"consistency": "asp"}, stragglers=slow)
                fake_run(root, suite, spec, step_s=0.002, final_noise=spread, steps=steps)


def test_sharding_verdict_follows_the_records(tmp_path, monkeypatch):
    calm = thesis.findings(load_suite(_sharding_suite(tmp_path / "a", calm=0.005)))
    assert [f.verdict for f in calm] == [Verdict.REPRODUCED]
    assert calm[0].finding == "stratified shards lower run-to-run variance"
    assert "2 of 2 ratios point the paper's way, 0 the other; significant (Holm at 0.05): 2 lower, 0 higher" \
        in calm[0].ours
    # both powers stated beside the verdict: to detect the paper's smallest effect and to rule it out,
    # from the random runs' tails where there are enough of them (the normal-theory figure beside it),
    # and the paper's 5-run design under no effect
    assert ("power to detect 2x: 20 seeds a strategy; too few random-shard results to read the tails from (40; "
            "200 needed)") in calm[0].ours
    assert "power to rule 2x out: too few random-shard results" in calm[0].ours
    assert re.search(r"were the metrics normal, an F test would detect [\d.]+x and 2x would need \d+ seeds",
                     calm[0].ours)
    assert "P(F ≥ 8.48) = 0.031 alone" in calm[0].detail
    from psbench.bench.report import variance_power
    monkeypatch.setattr(variance_power, "MIN_POOL", 40)
    (told,) = thesis.findings(load_suite(tmp_path / "a" / "sharding"))
    assert re.search(r"power to detect 2x: 20 seeds a strategy detect [\d.]+x with 80% power by the paired "
                     r"Brown–Forsythe test at 0.025; 2x needs \d+ seeds \(simulated from 40 standardised random-shard "
                     r"results", told.ours), told.ours
    assert re.search(r"power to rule 2x out: with no true effect, one ratio's 0.975 upper bound falls below 2x in "
                     r"\d+% of simulated 20-seed designs \(\d+% for all 2 at once", told.ours), told.ours
    assert re.search(r"with tails like ours, the largest of its 12 null ratios reaches 8.48 with probability 0\.\d\d",
                     told.detail.lower())
    alike = thesis.findings(load_suite(_sharding_suite(tmp_path / "b", calm=0.05)))
    assert [f.verdict for f in alike] in ([Verdict.INCONCLUSIVE], [Verdict.NOT_REPRODUCED])
    assert alike[0].verdict != Verdict.REPRODUCED


def test_each_strategy_is_its_own_family_at_a_split_level(tmp_path):
    """Two strategies: two findings, each tested at 0.05 / 2 with Holm inside it; the k of a
    distribution-aware strategy is per data set, so its ratios are one family."""
    root = tmp_path / "two"
    for strategy, spread in (("random", 0.05), ("stratified", 0.005), ("distribution-aware:20", 0.05)):
        for seed in range(20):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            fake_run(root, "sharding", spec, step_s=0.002, final_noise=spread, steps=4)
    found = {f.finding: f for f in thesis.findings(load_suite(root / "sharding"))}
    assert set(found) == {"stratified shards lower run-to-run variance",
                          "distribution-aware shards lower run-to-run variance"}
    assert found["stratified shards lower run-to-run variance"].verdict == Verdict.REPRODUCED
    assert found["distribution-aware shards lower run-to-run variance"].verdict != Verdict.REPRODUCED
    assert all("(Holm at 0.025)" in f.ours for f in found.values())
    assert "| mlp-digits | native | 20 |" in found["distribution-aware shards lower run-to-run variance"].detail


def test_holm_within_a_strategy_rejects_what_bonferroni_would_not():
    """The family's step-down: the smallest p against alpha / m, the next against alpha / (m - 1)."""
    import pandas as pd
    rows = pd.DataFrame({"sharding": ["stratified"] * 2, "p_bf_paired": [0.02, 0.03], "spread": [3.0, 3.0],
                         "spread_hi": [9.0, 9.0]})
    (test,) = sharding.strategy_tests(rows)  # Bonferroni at 0.05 / 2 would reject only the first
    assert test.lower == 2 and test.verdict == Verdict.REPRODUCED
    rows["p_bf_paired"] = [0.03, 0.03]
    (test,) = sharding.strategy_tests(rows)
    assert test.lower == 0 and test.verdict == Verdict.INCONCLUSIVE and "2 of 2 upper bounds still reach 2x" in test.reason


def test_a_sharding_comparison_whose_runs_did_not_learn_is_left_out(tmp_path):
    """Variance ratios of models at chance (an async step that diverged) say nothing of sharding: the
    verdict leaves them out and names them, whatever the ratios."""
    for strategy, spread in (("random", 0.05), ("stratified", 0.005)):
        for seed in range(20):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            fake_run(tmp_path, "sharding", spec, step_s=0.002, final_noise=spread, acc_max=0.11, shards=True)
    res = load_suite(tmp_path / "sharding")
    assert sharding.untrained(res)  # 10 classes: chance 0.1, the runs end near it
    (found,) = thesis.findings(res)
    assert found.verdict == Verdict.INCONCLUSIVE and "did not learn" in found.ours
    # the same design with runs that learned: judged as before
    for strategy, spread in (("random", 0.05), ("stratified", 0.005)):
        for seed in range(20):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            fake_run(tmp_path / "ok", "sharding", spec, step_s=0.002, final_noise=spread, shards=True)
    (learned,) = thesis.findings(load_suite(tmp_path / "ok" / "sharding"))
    assert learned.verdict == Verdict.REPRODUCED and "did not learn" not in learned.ours


def test_sharding_ratios_are_per_condition_with_and_without_a_speed_spread(tmp_path):
    res = load_suite(_sharding_suite(tmp_path, calm=0.005, stragglers=(None, "spread:lo=1,hi=4.5")))
    ratios = sharding.sharding_ratios(res)
    from psbench.bench.report.sharding import SHARDING_METRICS

    assert ratios["conditions"].nunique() == 2 and len(ratios) == 2 * len(SHARDING_METRICS)  # per condition
    assert (ratios["seeds"] == 20).all()  # paired within a condition, never pooled across
    (found,) = thesis.findings(res)
    assert "spread" in found.ours and "power to detect 2x: 20 seeds" in found.ours
    # the family is the accuracies' ratios (2 conditions x 2 metrics here), not the losses' too
    assert ratios["tested"].sum() == 4 and "of 4 ratios point" in found.ours


def test_a_loss_ratio_is_shown_not_tested(tmp_path):
    """The verdict tests the accuracies' ratios: a huge ratio on a loss alone reproduces nothing."""
    for strategy in ("random", "stratified"):
        for seed in range(20):
            spec = RunSpec("ps", "mlp-digits", workers=4, seed=seed, batch_size=16, sharding=strategy,
                           options={"consistency": "asp"})
            fake_run(tmp_path, "sharding", spec, step_s=0.002, final_noise=0.02)
    for run in (tmp_path / "sharding").glob("*/manifest.json"):  # losses: random 100x noisier
        import json
        m = json.loads(run.read_text())
        if m["spec"]["sharding"] == "random":
            for key in ("final_train_loss", "final_val_loss"):
                m["summary"][key] = 0.5 + (m["seed"] % 5 - 2) * 0.2
        else:
            for key in ("final_train_loss", "final_val_loss"):
                m["summary"][key] = 0.5 + (m["seed"] % 5 - 2) * 0.002
        run.write_text(json.dumps(m))
    res = load_suite(tmp_path / "sharding")
    ratios = sharding.sharding_ratios(res).set_index("metric")
    assert ratios.loc["final training loss", "lo"] > 10 and not ratios.loc["final training loss", "tested"]
    (found,) = thesis.findings(res)
    assert found.verdict != Verdict.REPRODUCED and "loss" not in found.ours.split("; the paper")[0]


def _set_final_accuracies(suite: Path, values: dict[str, np.ndarray],
                          metrics: tuple[str, ...] = ("final_train_accuracy", "final_val_accuracy")) -> None:
    """Give each run's final `metrics` from `values[strategy][seed]`."""
    import json
    for manifest in suite.glob("*/manifest.json"):
        m = json.loads(manifest.read_text())
        for key in metrics:
            m["summary"][key] = float(values[m["spec"]["sharding"]][m["seed"]])
        manifest.write_text(json.dumps(m))


@pytest.fixture(scope="module")
def forty_seeds(tmp_path_factory) -> Path:
    """random and stratified over 40 seeds (short runs): the tests below set their final accuracies."""
    return _sharding_suite(tmp_path_factory.mktemp("forty"), calm=0.0, seeds=40, steps=4)


def _copy(suite: Path, to: Path) -> Path:
    import shutil
    return Path(shutil.copytree(suite, to / suite.name))


def test_a_few_far_runs_do_not_make_a_variance_reduction(tmp_path, forty_seeds):
    """Heavy tails: two far-off random-shard runs of 40 inflate random's variance 5x, and the
    Pitman–Morgan test (exact for normal metrics) calls that significant; the spread of the
    other 38 is the strategy's. The verdict's robust test does not count it."""
    rng = np.random.default_rng(7)
    calm = 0.85 + rng.normal(0, 0.01, 40)
    far = 0.85 + rng.normal(0, 0.01, 40)
    far[[3, 17]] = [0.77, 0.92]
    suite = _copy(forty_seeds, tmp_path)
    _set_final_accuracies(suite, {"random": far, "stratified": calm})
    res = load_suite(suite)
    tested = sharding.sharding_ratios(res)
    tested = tested[tested["tested"]]
    assert (tested["ratio"] > 4).all() and (tested["p_paired"] < 1e-5).all()  # the normal theory's answer
    assert (tested["p_bf_paired"] > 0.025).all()
    (found,) = thesis.findings(res)
    assert found.verdict == Verdict.INCONCLUSIVE and "significant (Holm at 0.05): 0 lower, 0 higher" in found.ours


def test_a_strategy_that_raises_the_variance_counts_against_the_paper(tmp_path, forty_seeds):
    """A significant ratio below 1 is named; alone it is not reproduced, beside one above 1 the
    strategies' effect has no one direction: inconclusive."""
    rng = np.random.default_rng(3)
    noisy, calm = 0.85 + rng.normal(0, 0.05, 40), 0.85 + rng.normal(0, 0.005, 40)
    raised = _copy(forty_seeds, tmp_path / "raised")
    _set_final_accuracies(raised, {"random": calm, "stratified": noisy})
    (found,) = thesis.findings(load_suite(raised))
    assert found.verdict == Verdict.NOT_REPRODUCED
    assert "0 lower, 2 higher" in found.ours and found.decides.startswith("more variable than random")
    assert found.detail.count("| rejects |") == 2  # each significant ratio named in the section's table
    both = _copy(forty_seeds, tmp_path / "both")  # lower on training accuracy, higher on validation
    _set_final_accuracies(both, {"random": noisy, "stratified": calm}, ("final_train_accuracy",))
    _set_final_accuracies(both, {"random": calm, "stratified": noisy}, ("final_val_accuracy",))
    (found,) = thesis.findings(load_suite(both))
    assert found.verdict == Verdict.INCONCLUSIVE
    assert "1 lower, 1 higher" in found.ours and "both ways" in found.decides


def _switch_suite(root: Path, switch_step_s: float, seeds=range(5), switch_at: int | None = 6,
                  stragglers: str | None = None) -> Path:
    return _copy_of_built(root, "switch", _write_switch_suite, switch_step_s=switch_step_s, seeds=tuple(seeds),
                          switch_at=switch_at, stragglers=stragglers)


def _write_switch_suite(root: Path, suite: str, switch_step_s: float, seeds: tuple[int, ...], switch_at: int | None,
                        stragglers: str | None) -> None:
    for seed in seeds:
        common = dict(workload="mlp-digits", workers=4, seed=seed, batch_size=16, stragglers=stragglers)
        jitter = 1 + 0.01 * (seed % 5)  # seeds differ a little: a paired t needs some spread
        fake_run(root, "switch", RunSpec("ddp", **common), step_s=0.004 * jitter, target=0.8)
        fake_run(root, "switch", RunSpec("ps", **common, options={"consistency": "bsp"}), step_s=0.005 * jitter,
                 target=0.8)
        fake_run(root, "switch", RunSpec("ps", **common, options={"consistency": "asp"}), step_s=0.002, target=0.8)
        fake_run(root, "switch", RunSpec("switch", **common, options={"criterion": "fixed:fraction=0.3"}),
                 step_s=switch_step_s * (1 + 0.013 * (seed % 4)), switch_at=switch_at, target=0.8)


def test_switch_verdict_follows_the_records(tmp_path):
    fast = thesis.findings(load_suite(_switch_suite(tmp_path / "fast", switch_step_s=0.002)))
    assert [f.verdict for f in fast] == [Verdict.REPRODUCED]
    # ddp: the faster sync; each side's time to target with its interval, then the speed-up
    assert re.search(r"vs ddp: time to target [\d.]+ s \[[^]]+\] \(n=5\) vs [\d.]+ s \[[^]]+\] \(n=5\), "
                     r"speed-up (1\.9|2\.0)", fast[0].ours), fast[0].ours
    assert "Holm" in fast[0].rule
    slow = thesis.findings(load_suite(_switch_suite(tmp_path / "slow", switch_step_s=0.0039)))
    assert [f.verdict for f in slow] == [Verdict.NOT_REPRODUCED]


def test_switch_verdict_uses_calibration_seeds_for_the_target_and_leaves_them_out(tmp_path):
    """Seeds >= 100 set the target (the fastest sync system's final accuracy) and pick that system; the verdict
    pairs the other seeds only; a variant that never switched is shown as such, not tested."""
    root = tmp_path / "calibrated"
    _switch_suite(root, switch_step_s=0.002, seeds=[0, 1, 2, 3, 4, 100, 101])
    found = thesis.switch_comparisons(load_suite(root / "switch"))
    (sw,) = [c for c in found if c.variant.startswith("switch")]
    assert sw.speedup.n == 5 and "calibration seed" in sw.target_source and sw.baseline == "ddp"
    assert sw.target < 0.9 * 0.98
    never = tmp_path / "never"
    _switch_suite(never, switch_step_s=0.002, switch_at=None)
    (finding,) = thesis.findings(load_suite(never / "switch"))
    assert finding.verdict == Verdict.INCONCLUSIVE and "never acted" in finding.ours


def test_switch_verdict_tests_the_thesis_point_and_shows_the_map_slice_untested(tmp_path, monkeypatch):
    """A configuration with fewer seeds than the most-seeded one is a map cell: in the table and
    the heatmap, never in the verdict or its Holm family (a slow switch there cannot sink it)."""
    _switch_suite(tmp_path, switch_step_s=0.002, seeds=[0, 1, 2, 3, 4, 100])
    alone = thesis.findings(load_suite(tmp_path / "switch"))
    _switch_suite(tmp_path, switch_step_s=0.0039, seeds=[0, 1, 2, 100], stragglers="slow:1=2.5")
    res = load_suite(tmp_path / "switch")
    found = thesis.switch_comparisons(res)
    assert {(c.conditions, c.map_cell) for c in found} == {("native", False), ("stragglers slow:1=2.5", True)}
    assert [c.speedup.n for c in found if c.in_verdict] == [5]
    (tested,) = [c for c in found if c.in_verdict]  # each side's time to target with its interval, same seeds
    for t in (tested.time_to_target, tested.base_time_to_target):
        assert t.n == 5 and t.lo < t.estimate < t.hi
    assert tested.base_time_to_target.estimate / tested.time_to_target.estimate == pytest.approx(
        tested.speedup.estimate, rel=1e-9)
    table = thesis.switch_verdict_table(found)
    assert sorted(table["in the verdict"]) == ["no: a map cell (fewer seeds)", "no: pure ASP, shown beside",
                                               "no: pure ASP, shown beside", "yes"]
    (finding,) = thesis.findings(res)
    assert finding.verdict == alone[0].verdict == Verdict.REPRODUCED
    assert "map cell (stragglers slow:1=2.5, n=3, not tested)" in finding.ours
    import matplotlib.pyplot as plt

    import psbench.bench.report.plots as plots

    rows: dict[str, list[str]] = {}

    def keep(fig: plt.Figure, out_dir, name: str) -> list:
        rows.update({ax.get_title(): [t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes if ax.get_title()})
        plt.close(fig)
        return []

    monkeypatch.setattr(plots, "save", keep)
    plots.switch_map(res, tmp_path)  # the map cell's switch is drawn beside the thesis' point
    assert rows["mlp-digits: switch (best variant)"] == ["native", "stragglers slow:1=2.5"]


def _own_sync_suite(root: Path, fast_seeds, slow_seeds, ddp_phase: bool = True) -> Path:
    """ps bsp faster than ddp (ddp on the calibration seeds only), a switch whose sync phase is ps bsp
    (fast on `fast_seeds`, as slow as ps bsp on `slow_seeds`), and a DDP-phase switch beside it."""
    common = dict(workload="mlp-digits", workers=4, batch_size=16)
    for seed in [100, 101]:
        fake_run(root, "switch", RunSpec("ddp", seed=seed, **common), step_s=0.006, target=0.8)
    for seed in [*fast_seeds, *slow_seeds, 100, 101]:
        jitter = 1 + 0.01 * (seed % 5)
        fake_run(root, "switch", RunSpec("ps", seed=seed, **common, options={"consistency": "bsp"}),
                 step_s=0.004 * jitter, target=0.8)
    for seed in [*fast_seeds, *slow_seeds]:
        step_s = (0.002 if seed in fast_seeds else 0.0039) * (1 + 0.013 * (seed % 4))
        fake_run(root, "switch", RunSpec("switch", seed=seed, **common,
                                         options={"criterion": "plateau:window=30,threshold=0.05", "sync": "ps-bsp"}),
                 step_s=step_s, switch_at=6, target=0.8)
    for seed in fast_seeds if ddp_phase else []:
        fake_run(root, "switch", RunSpec("switch", seed=seed, **common, options={"criterion": "fixed:fraction=0.3"}),
                 step_s=0.002, switch_at=6, target=0.8)
    return root / "switch"


def test_switch_target_is_the_fastest_sync_systems_final_accuracy_and_final_is_a_mean_of_evaluations(tmp_path):
    """The target: 0.99 x the fastest sync system's (ps bsp: more samples/s than ddp) mean final accuracy
    on the calibration seeds; a run's final accuracy is the mean of its last FINAL_K evaluations, so a
    last evaluation that collapses moves it by a FINAL_K-th; only the switch whose sync phase is ps bsp is
    tested, the DDP-phase switch is shown beside."""
    from psbench.bench.report import switching

    res = load_suite(_own_sync_suite(tmp_path, fast_seeds=[0, 1, 2, 3], slow_seeds=[]))
    found = switching.switch_comparisons(res)
    val = res.evals[res.evals["split"] == "val"].sort_values("t_wall", kind="stable")
    final = {r: g["accuracy"].tail(switching.FINAL_K).mean() for r, g in val.groupby("run_id")}
    runs = res.runs.assign(final=res.runs["run_id"].map(final))
    bsp = runs[runs["opt_consistency"] == "bsp"]
    expected = np.floor(0.99 * bsp[bsp["seed"] >= 100]["final"].mean() / 0.005) * 0.005
    own = next(c for c in found if "ps-bsp" in c.variant)
    assert own.baseline == "ps (bsp)" and own.target == pytest.approx(expected) and own.in_verdict
    sw = runs[runs["label"] == own.variant].set_index("seed")["final"]
    base = bsp[bsp["seed"] < 100].set_index("seed")["final"]
    assert own.accuracy_pp.estimate == pytest.approx(100 * (sw - base.loc[sw.index]).mean())
    (ddp_phase,) = [c for c in found if c.variant != own.variant and c.never_switched != "–"]
    assert not ddp_phase.in_verdict
    assert switching.variant_role(ddp_phase) == "no: its sync phase is not ps (bsp), shown beside"
    collapse = pd.DataFrame({"t_wall": range(8), "accuracy": [0.5, 0.9, 0.97, 0.98, 0.99, 0.985, 0.986, 0.593]})
    assert switching._final_accuracy(collapse) == pytest.approx(np.mean([0.98, 0.99, 0.985, 0.986, 0.593]))


def test_switch_verdict_is_inconclusive_when_the_seed_blocks_disagree(tmp_path):
    """Seeds 0-9 and 10-19 are two pre-specified blocks: a switch shown fast on one and as slow as sync on
    the other gives two outcomes, so the verdict is inconclusive (more seeds needed), whatever all seeds say;
    the section shows each block's table. (~40 synthetic runs: two blocks of a paired design, twice.)"""
    from psbench.bench.report import switching

    res = load_suite(_own_sync_suite(tmp_path, fast_seeds=[0, 1, 2, 3], slow_seeds=[10, 11, 12, 13], ddp_phase=False))
    judged = switching.switch_verdict(res)
    assert judged.block_outcomes == {"seeds 0–9": switching.Outcome.HOLDS, "seeds 10–19": switching.Outcome.FAILS}
    assert judged.outcome == switching.Outcome.BLOCKS_DISAGREE
    (finding,) = thesis.findings(res)
    assert finding.verdict == Verdict.INCONCLUSIVE and "blocks disagree" in finding.decides
    assert len(finding.headline) <= thesis.SUMMARY_CELL and len(finding.decides) <= thesis.SUMMARY_CELL
    assert "(n=8)" in finding.headline and "| seeds 10–19 |" in finding.detail and "Rule: " + finding.rule in thesis.render([finding])
    agree = load_suite(_own_sync_suite(tmp_path / "agree", fast_seeds=[0, 1, 2, 10, 11, 12], slow_seeds=[],
                                       ddp_phase=False))
    judged = switching.switch_verdict(agree)
    assert set(judged.block_outcomes.values()) == {switching.Outcome.HOLDS} and judged.outcome == switching.Outcome.HOLDS
    assert thesis.findings(agree)[0].verdict == Verdict.REPRODUCED


def test_switch_verdict_corrects_over_the_tested_variants_only():
    """Holm's family is the variants that switched in the verdict's configuration: a map cell's or a
    never-switched variant's p-value neither enters it nor tightens it."""
    from psbench.bench.report.stats import PairedT
    from psbench.bench.report.switching import SwitchComparison, switch_verdict_table

    def comparison(variant: str, p: float, switched: bool, map_cell: bool = False) -> SwitchComparison:
        t = PairedT(10, 1.5, 1.3, 1.7, p, 1.2)
        return SwitchComparison("mlp-digits", 8, "native", variant, "ddp", 0.9, "calibration", t,
                                PairedT(10, 0.0, -0.2, 0.2, p, 0.3), t, t, "10/10 vs 10/10", "0/10",
                                0.0, switched, map_cell)

    tested = [comparison("switch (a)", 0.01, True), comparison("switch (b)", 0.04, True)]
    untested = [comparison("switch (map)", 0.5, True, map_cell=True), comparison("switch (never)", 0.5, False)]
    column = "> 1.3x after Holm"
    assert list(switch_verdict_table(tested)[column]) == ["yes", "yes"]   # 0.01 <= 0.025, 0.04 <= 0.05
    # in a family of three, 0.04 > 0.05 / 2 would fail: the untested rows must leave the family as it was
    assert list(switch_verdict_table(tested + untested)[column]) == ["yes", "yes", "–", "–"]
    tight = [comparison("switch (a)", 0.03, True), comparison("switch (b)", 0.04, True)]
    assert list(switch_verdict_table(tight)[column]) == ["no", "no"]     # each < 0.05 uncorrected


def _sweep_suite(root: Path, ps_cost, spark_cost, emulate: str | None = None, seed_noise: float = 0.01,
                 suite: str = "sweep") -> Path:
    """ps and Spark's native trainer, 3 seeds at batch 1, 10 and 100 (150 rows per core): each
    run's step time from its cost line (seconds for a batch)."""
    for seed in range(3):
        for system, cost in (("ps", ps_cost), ("spark-mllib-native", spark_cost)):
            for batch in (1, 10, 100):
                spec = RunSpec(system, "logreg-digits", workers=2, seed=seed, batch_size=batch, emulate_device=emulate)
                fake_run(root, suite, spec, step_s=cost(batch) * (1 + seed_noise * seed), shards=True)
    return root / suite


# Kassela's two setups as data per core on one worker (39k: 141 x 2-vCPU VMs; 1.1 M: 5 nodes), each
# at 100 %, 1 % and 0.01 % of its rows (batch sizes per worker)
PAPER_POINTS = {"logreg-higgs-49k": (39_000, 390, 4), "logreg-higgs-1375k": (1_100_000, 11_000, 110)}
AWAY_POINT = {"logreg-higgs-1m": (400_000, 4000, 40)}  # 400k rows a core: no paper setup's


def _paper_sweep(root: Path, ps_cost, spark_cost, points=PAPER_POINTS, suite: str = "kassela",
                 seeds=range(3), workers: int = 1, oversubscribed: bool = False) -> Path:
    """ps and Spark's native trainer at each point's batch sizes, 3 seeds: each run's step time from
    its cost line (seconds for a batch), 1 % apart between seeds; the fraction in the manifest.
    Data per core is each point's rows over `workers` (the workload's rows split between them)."""
    for workload, batches in points.items():
        for seed in seeds:
            for system, cost in (("ps", ps_cost), ("spark-mllib-native", spark_cost)):
                for batch in batches:
                    spec = RunSpec(system, workload, workers=workers, seed=seed, batch_size=batch // workers)
                    fake_run(root, suite, spec, step_s=cost(batch) * (1 + 0.01 * seed),
                             conditions={"oversubscribed": oversubscribed},
                             extra={"mini_batch_fraction": batch / batches[0]})
    return root / suite


def test_kassela_verdict_is_read_at_the_papers_data_per_core(tmp_path):
    """The PS falls ~70x from 100 % to 1 % at 39k rows a core, Spark ~1.04x: reproduced there. A PS
    that does not fall (1.2x) at both setups: not reproduced. The fall to 0.01 % is shown only."""
    (found,) = thesis.findings(load_suite(_paper_sweep(tmp_path / "a", lambda b: 1e-4 + 2e-6 * b,
                                                       lambda b: 0.1 + 1e-7 * b)))
    assert found.verdict == Verdict.REPRODUCED
    assert "39k rows/core: PS" in found.headline and "(100 → 1 %, n=3)" in found.headline
    assert len(found.headline) <= thesis.SUMMARY_CELL and len(found.decides) <= thesis.SUMMARY_CELL
    assert "≥ 10x" in found.decides and "| 1.1 M rows (1 w) |" in found.detail
    assert "Rule:" not in found.detail and measures.FALL_RULE in found.rule  # the rule once, by the renderer
    assert thesis.render([found]).count(found.rule) == 1
    assert "0.0103%" in found.detail and "Conditions: real compute" in found.detail
    ends = {workload: batches[:2] for workload, batches in PAPER_POINTS.items()}  # 100 % and 1 % suffice
    (flat,) = thesis.findings(load_suite(_paper_sweep(tmp_path / "b", lambda b: 0.002 + 1e-8 * b,
                                                      lambda b: 0.1 + 1e-7 * b, points=ends)))
    assert flat.verdict == Verdict.NOT_REPRODUCED and flat.decides.count("PS upper bound") == 2


def test_kassela_needs_both_setups_to_say_not_reproduced(tmp_path):
    """The PS does not fall at 39k rows a core, and the 1.1 M setup was not measured: inconclusive."""
    small = {"logreg-higgs-49k": PAPER_POINTS["logreg-higgs-49k"][:2]}
    (found,) = thesis.findings(load_suite(_paper_sweep(tmp_path, lambda b: 0.002 + 1e-8 * b,
                                                       lambda b: 0.1 + 1e-7 * b, points=small)))
    assert found.verdict == Verdict.INCONCLUSIVE and "not measured at 1 of the paper's setups" in found.decides


def test_oversubscribed_runs_at_the_papers_data_per_core_are_shown_never_counted(tmp_path):
    """The same falls as a reproduction, but every run oversubscribed the cores (two PS workers and
    their shard on two cores): the table shows them, flagged; the verdict has nothing to stand on."""
    (found,) = thesis.findings(load_suite(_paper_sweep(tmp_path, lambda b: 1e-4 + 2e-6 * b,
                                                       lambda b: 0.1 + 1e-7 * b, oversubscribed=True)))
    assert found.verdict == Verdict.INCONCLUSIVE
    assert "only runs that oversubscribed the cores" in found.headline
    assert "| 39k rows (1 w, oversubscribed: not counted) |" in found.detail
    (fits,) = thesis.findings(load_suite(_paper_sweep(tmp_path / "b", lambda b: 1e-4 + 2e-6 * b,
                                                      lambda b: 0.1 + 1e-7 * b)))
    assert fits.verdict == Verdict.REPRODUCED and "oversubscribed: not counted" not in fits.detail


def test_a_model_projection_alone_never_gives_not_reproduced(tmp_path):
    """Measured only at 400k rows a core, where the PS does not fall and Spark does: the cost model,
    even checked at a second size (kassela-10m) within 15 %, projects to the paper's setups and is
    shown, but the verdict stays inconclusive: the paper's data per core was not measured. The check
    suite is shown in the section, not a second verdict row."""
    def ps(b):
        return 0.002 + 1e-8 * b

    def spark(b):
        return 0.1 + 1e-6 * b

    root = tmp_path / "a"
    main_suite = _paper_sweep(root, ps, spark, points=AWAY_POINT)
    _paper_sweep(root, ps, spark, points={"logreg-higgs-10m": (4_000_000, 400)}, suite="kassela-10m", seeds=range(2))
    (found,) = thesis.findings(load_suite(main_suite))
    assert found.verdict == Verdict.INCONCLUSIVE and "not measured at the paper's data per core" in found.headline
    assert "projected to the paper's setups" in found.detail and "never the verdict" in found.detail
    assert "Shown, not a verdict (kassela-10m" in found.detail
    assert thesis.findings(load_suite(root / "kassela-10m")) == []  # shown in kassela's section only


def test_kassela_on_an_emulated_device_is_inconclusive_by_construction(tmp_path):
    (found,) = thesis.findings(load_suite(_sweep_suite(tmp_path / "a", lambda b: 1e-4 + 2e-4 * b,
                                                       lambda b: 0.1 + 1e-5 * b, emulate="step_ms=1")))
    assert found.verdict == Verdict.INCONCLUSIVE and "device profile" in found.ours
    assert found.decides == "an emulated device on one side only"


def test_thesis_command_gathers_the_suites(tmp_path, capsys):
    _switch_suite(tmp_path, switch_step_s=0.002)
    _sharding_suite(tmp_path, calm=0.005)
    assert main(["thesis", str(tmp_path)]) == 0
    text = (tmp_path / "thesis.md").read_text()
    summary = text.split("## Summary")[1].split("\n## ")[0]
    rows = [line for line in summary.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 2 and all("**reproduced**" in row for row in rows)
    assert text.count("**Verdict: reproduced**") == 2 and text.count("\n## ") == 3  # the summary, then a section each
    # a reader's table: every cell within its bound, each rule printed once
    assert all(len(cell.strip()) <= thesis.SUMMARY_CELL + 4 for row in rows for cell in row.split("|"))
    found, _ = thesis.collect(tmp_path)
    assert all(text.count(f.rule) == 1 for f in found)
    assert "Records: " in text and "0 from a dirty checkout" in text
    assert main(["thesis", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_sharding_verdict_is_the_design_with_the_most_seeds(tmp_path):
    """make bench's 20-seed sharding suite beside the powered one: thesis.md's sharding verdict is the
    powered design's, whichever way the smaller one came out; the smaller stays in the table, named
    as a smaller design with its own verdict in words, not counted."""
    _sharding_suite(tmp_path, calm=0.005)                                          # alone: reproduced
    _sharding_suite(tmp_path, calm=0.05, seeds=30, suite="sharding-powered")       # no effect
    found, _ = thesis.collect(tmp_path)
    by_suite = {f.suite: f for f in found}
    assert by_suite["sharding-powered"].verdict in (Verdict.INCONCLUSIVE, Verdict.NOT_REPRODUCED)
    small = by_suite["sharding"]
    assert small.verdict == Verdict.SUBSET
    assert small.ours.startswith("a smaller design (20 seeds a comparison; the verdict is sharding-powered's, 30); "
                                 "by itself: reproduced; ")
    text = thesis.render(found)
    assert "**reproduced**" not in text and f"**{Verdict.SUBSET}**" in text


def test_a_batch_sweep_is_not_a_throughput_finding(tmp_path):
    """kassela's suite has ps and Spark at one worker count: no scaling comparison, no row."""
    names = [f.finding for f in thesis.findings(load_suite(_sweep_suite(tmp_path, lambda b: 1e-4 + 2e-4 * b,
                                                                         lambda b: 0.1 + 1e-5 * b)))]
    assert len(names) == 1 and names[0].startswith("per-mini-batch time")


def test_the_regime_map_draws_each_cell_where_switching_and_asp_pay_or_not(tmp_path, monkeypatch):
    """The switch map (its heatmap): per workload one panel for pure ASP and one for the best
    switch variant, a cell per worker count and conditions, each annotated with the speed-up over
    the fastest sync system; here the async side is faster under a straggler and slower without."""
    import matplotlib.pyplot as plt

    import psbench.bench.report.plots as plots

    for workers in (4, 8):
        for stragglers, async_step_s in ((None, 0.008), ("slow:1=2.5", 0.002)):
            for seed in (0, 1, 2, 3, 100):
                common = dict(workload="mlp-digits", workers=workers, seed=seed, batch_size=16, stragglers=stragglers)
                jitter = 1 + 0.01 * (seed % 5)
                fake_run(tmp_path, "map", RunSpec("ddp", **common), step_s=0.004 * jitter, target=0.8)
                fake_run(tmp_path, "map", RunSpec("ps", **common, options={"consistency": "bsp"}),
                         step_s=0.005 * jitter, target=0.8)
                fake_run(tmp_path, "map", RunSpec("ps", **common, options={"consistency": "asp"}),
                         step_s=async_step_s * jitter, target=0.8)
                fake_run(tmp_path, "map", RunSpec("switch", **common, options={"criterion": "fixed:fraction=0.3"}),
                         step_s=async_step_s * 1.2 * jitter, switch_at=6, target=0.8)
    drawn: dict[str, list[str]] = {}

    def keep(fig: plt.Figure, out_dir, name: str) -> list:
        drawn["titles"] = [ax.get_title() for ax in fig.axes if ax.get_title()]
        drawn["cells"] = [(round(t.get_position()[1]), t.get_text()) for ax in fig.axes for t in ax.texts]
        drawn["rows"] = [t.get_text() for ax in fig.axes[:1] for t in ax.get_yticklabels()]
        plt.close(fig)
        return []

    monkeypatch.setattr(plots, "save", keep)
    plots.switch_map(load_suite(tmp_path / "map"), tmp_path)
    assert drawn["titles"] == ["mlp-digits: pure ASP", "mlp-digits: switch (best variant)"]
    assert len(drawn["cells"]) == 8 and all(text.count("pp") == 1 for _, text in drawn["cells"])
    assert drawn["rows"] == ["native", "stragglers slow:1=2.5"]
    speedup = {row: sorted(float(text.split("x")[0]) for r, text in drawn["cells"] if r == row) for row in (0, 1)}
    assert max(speedup[0]) < 1 < min(speedup[1]), speedup  # async pays under the straggler only
