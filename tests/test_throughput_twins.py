"""The throughput finding by twins (bench/report/throughput_gap.py): PS BSP against spark-mllib and
spark-barrier at each worker count, by a margin of 1.2x, oversubscribed points shown and not
counted, a missing twin inconclusive; DDP ÷ spark-torch and PS ASP shown, never in the verdict."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from psbench.bench.harness.results import SuiteResults, load_suite
from psbench.bench.report import measures, thesis
from psbench.bench.report.claims import THROUGHPUT, Verdict
from psbench.bench.report import throughput_gap as tg
from psbench.bench.report.stats import Interval
from psbench.core.spec import RunSpec
from report_fixtures import fake_run

BSP, ASP = {"consistency": "bsp"}, {"consistency": "asp"}
WORKERS = (2, 8)  # a scaling comparison at its smallest: two counts


def _suite(root: Path, steps_s: dict, *, crowded=lambda system, workers: False, skip=lambda system, workers: False,
           workloads=("mlp-digits",)) -> Path:
    """Every system of `steps_s` (label -> step seconds at a worker count) at WORKERS, 3 seeds, 20
    steps a worker (synthetic runs: few rows keep the test fast; the ratios need no more);
    `crowded` says which runs oversubscribed the cores, `skip` which were not run."""
    for workload in workloads:
        for seed in range(3):
            for workers in WORKERS:
                for label, step in steps_s.items():
                    system, options = (("ps", BSP if "bsp" in label else ASP) if label.startswith("ps") else
                                       (label, {}))
                    if skip(label, workers):
                        continue
                    spec = RunSpec(system, workload, workers=workers, seed=seed, batch_size=8, options=options)
                    fake_run(root, "throughput", spec, step_s=step(workers) * (1 + 0.01 * seed * (label == "ddp")),
                             steps=20, setup_s=2.0 + 3.0 * (label == "spark-torch") + 0.1 * seed,
                             conditions={"oversubscribed": crowded(label, workers), "cores": 2},
                             extra={"allreduce_alone_s": 0.001 * workers, "ps_roundtrip_alone_s": 0.0012}
                             if label in ("ddp", "ps (bsp)") else None)
    return root / "throughput"


def _steps(bsp=lambda n: 0.02, mllib=lambda n: 0.3 * (1 + 0.2 * n), barrier=lambda n: 0.5, asp=None,
           ring: bool = False):
    """The synchronous twins' step times; PS ASP's where given; with `ring` DDP and spark-torch."""
    return {"ps (bsp)": bsp, "spark-mllib": mllib, "spark-barrier": barrier, **({"ps (asp)": asp} if asp else {}),
            **({"ddp": lambda n: 0.021, "spark-torch": lambda n: 0.0212} if ring else {})}


@pytest.fixture(scope="module")
def clear(tmp_path_factory) -> SuiteResults:
    """Both synchronous twins well above the margin at every count."""
    return measures.annotate(load_suite(_suite(tmp_path_factory.mktemp("clear"), _steps(ring=True))))


def _finding(root: Path, **kw) -> thesis.Finding:
    (found,) = thesis.findings(load_suite(_suite(root, **kw)))
    return found


def test_synchronous_twins_well_above_the_margin_reproduce_and_the_finding_says_so_in_its_fields(clear):
    (found,) = thesis.findings(clear)
    assert found.verdict == Verdict.REPRODUCED
    assert 0 < len(found.headline) <= thesis.SUMMARY_CELL and 0 < len(found.decides) <= thesis.SUMMARY_CELL
    assert "ps (bsp) ÷ spark-mllib" in found.headline and "(n=3)" in found.headline
    assert "ddp ÷ spark-torch" in found.headline  # the ring's twin beside, per step
    # the twins table with its flags, the launcher's cost and the exchanges alone; the rule is the
    # finding's own, printed once by thesis.md's renderer, not again in the section's detail
    assert found.rule == tg.TWIN_RULE and tg.TWIN_RULE not in found.detail
    assert thesis.render([found]).count(tg.TWIN_RULE) == 1
    assert "| mlp-digits | 8 | ps (bsp) ÷ spark-barrier |" in found.detail
    assert "Spark adds nothing measurable per step" in found.detail
    assert "emulated" in found.detail.lower() and "Workers per core: 2: 1, 8: 4" in found.detail
    assert "16x" not in THROUGHPUT.paper  # the paper's convergence figure is no throughput figure


def test_an_asp_only_advantage_never_passes(tmp_path):
    """PS ASP 15x faster than Spark, PS BSP only 1.1x: the verdict is BSP's, and 1.1x fails the margin."""
    found = _finding(tmp_path, steps_s=_steps(bsp=lambda n: 0.2 / 1.1, mllib=lambda n: 0.2, barrier=lambda n: 0.2,
                                              asp=lambda n: 0.2 / 15))
    assert found.verdict == Verdict.NOT_REPRODUCED
    table = tg.twin_table(tg.twins(load_suite(tmp_path / "throughput")))
    asp = table[table["pair"] == "ps (asp) ÷ spark-mllib"]
    assert (asp["in verdict"] == "no: shown beside").all() and (asp["above 1.2x"] == "yes").all()


def test_a_ratio_of_1_1_with_a_tight_interval_does_not_pass_the_margin():
    def twin(iv: Interval, role=tg.VERDICT, oversubscribed=False, general="spark-mllib") -> tg.Twin:
        return tg.Twin("w", 2, tg.PS_BSP, general, role, 110.0, 100.0, iv, oversubscribed)

    small = [twin(Interval(3, 1.1, 1.05, 1.15)), twin(Interval(3, 5.0, 4.0, 6.0), general="spark-barrier")]
    assert not tg.holds(small) and tg.fails(small)  # above 1, not above 1.2
    wide = [twin(Interval(3, 1.3, 1.1, 1.5)), twin(Interval(3, 5.0, 4.0, 6.0), general="spark-barrier")]
    assert not tg.holds(wide) and not tg.fails(wide)  # inconclusive
    clear = [twin(Interval(3, 1.5, 1.25, 1.8)), twin(Interval(3, 5.0, 4.0, 6.0), general="spark-barrier")]
    assert tg.holds(clear) and not tg.fails(clear)


def test_an_oversubscribed_point_never_counts(tmp_path):
    """spark-mllib as fast as PS BSP at 8 workers: not reproduced when those runs fit the
    cores; when they oversubscribed them, those points are shown, flagged, and not counted."""
    catch_up = _steps(mllib=lambda n: 0.02 if n >= 8 else 0.3)
    assert _finding(tmp_path / "fit", steps_s=catch_up).verdict == Verdict.NOT_REPRODUCED
    crowded = _finding(tmp_path / "crowded", steps_s=catch_up,
                       crowded=lambda label, n: label == "spark-mllib" and n >= 8)
    assert crowded.verdict == Verdict.REPRODUCED and "1 oversubscribed point not counted" in crowded.decides
    table = tg.twin_table(tg.twins(load_suite(tmp_path / "crowded" / "throughput")))
    flagged = table[(table["pair"] == "ps (bsp) ÷ spark-mllib") & (table["workers"] == 8)]
    assert (flagged["oversubscribed"] == "yes").all() and (flagged["in verdict"] == "no: oversubscribed").all()
    # a huge ratio at oversubscribed points alone proves nothing: a pair with no counted point
    alone = _finding(tmp_path / "alone", steps_s=_steps(), crowded=lambda label, n: label == "spark-barrier")
    assert alone.verdict == Verdict.INCONCLUSIVE


def test_a_twin_missing_at_a_worker_count_is_inconclusive_not_reproduced(tmp_path):
    sync = _steps()
    found = _finding(tmp_path, steps_s=sync, skip=lambda label, n: label == "spark-barrier" and n == 8)
    assert found.verdict == Verdict.INCONCLUSIVE
    assert found.decides.startswith("a twin missing: ps (bsp) ÷ spark-barrier at mlp-digits, 8 workers")
    gone = _finding(tmp_path / "b", steps_s={k: v for k, v in sync.items() if k != "spark-mllib"})
    assert gone.verdict == Verdict.INCONCLUSIVE  # every workload needs both synchronous twins


def test_every_workload_must_hold(tmp_path):
    """Two workloads: one clears the margin, the other's PS BSP only matches Spark: not reproduced."""
    root = tmp_path
    sync = _steps()
    _suite(root, sync, workloads=("mlp-digits",))
    _suite(root, {k: (lambda n: 0.3) for k in sync}, workloads=("mlp-wide-synthetic",))
    (found,) = thesis.findings(load_suite(root / "throughput"))
    assert found.verdict == Verdict.NOT_REPRODUCED
    assert "mlp-wide-synthetic" in found.decides


def test_launch_cost_and_exchanges_alone_come_from_the_records(clear):
    res = clear
    launch = tg.launch_cost(res, "mlp-digits", 8)
    assert launch.n == 3 and launch.estimate == pytest.approx(3.0)  # spark-torch's setup_s less ddp's
    table = tg.exchange_table(res).set_index("workers")
    assert table.loc[8, "ddp: allreduce alone (ms)"].startswith("8 ")
    assert table.loc[2, "ps (bsp): ps roundtrip alone (ms)"].startswith("1.2 ")
    twins = tg.twins(res)
    ring = [t for t in twins if t.role == tg.LAUNCHER]
    assert [t.workers for t in ring] == list(WORKERS) and all(abs(math.log(t.ratio.estimate)) < 0.05 for t in ring)
    assert not np.isnan([t.ratio.lo for t in tg.verdict_twins(twins)]).any()


def test_a_suite_with_no_twin_run_on_both_sides_holds_no_throughput_finding(tmp_path):
    """A suite that ran the PS but none of Spark's data-processing paths (the `systems` suite) is no
    throughput design: no finding, rather than an 'inconclusive' of missing twins."""
    res = load_suite(_suite(tmp_path, _steps(), skip=lambda system, workers: system.startswith("spark")))
    assert thesis.throughput(measures.annotate(res)) is None
