"""The event model of the scale model (bench/sim/events.py): hand-computed cases, the Pacer's
stragglers, the consistency models' waits, a shard's saturation, the switch's phases; the
costs measured from records (bench/sim/costs.py) and the check against them (bench/sim/check.py),
end to end through `psbench simulate --from`."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from psbench.bench.harness.steady import steady_window, step_intervals
from psbench.bench.sim.events import Network, SimSpec, SystemCosts, simulate_run
from psbench.core.emulation import Pacer, parse_device, parse_stragglers
from psbench.core.errors import ConfigError

PS = SystemCosts(compute_cpu_s=0.001, update_cpu_s=0.0005, comm_fixed_s=0.002, worker_cpu_s=0.0006,
                 server_cpu_s=0.0004, model_bytes=1_000_000)
RING = SystemCosts(compute_cpu_s=0.001, update_cpu_s=0.0005, comm_fixed_s=0.0003, allreduce_alpha_s=0.0002,
                   allreduce_beta_s_per_byte=1e-9, model_bytes=1_000_000)


def frame(spec: SimSpec, costs: SystemCosts, **kw) -> pd.DataFrame:
    return pd.DataFrame(simulate_run(spec, costs, **kw).steps)


def rate(steps: pd.DataFrame) -> float:
    start, end, samples = steady_window(steps)
    return samples / (end - start)


def test_one_worker_steps_add_up_by_hand():
    """Device target (20 ms) then the whole measured round trip, then the update; single has no trip."""
    ps = frame(SimSpec("ps", "w", 1, 32, consistency="asp", emulate_device="step_ms=20", max_steps=50), PS)
    assert step_intervals(ps).median() == pytest.approx(0.020 + 0.002 + 0.0005)
    assert ps["device_s"].median() == pytest.approx(0.020) and ps["system_s"].iloc[5] == pytest.approx(0.0025)
    single = frame(SimSpec("single", "w", 1, 32, emulate_device="step_ms=20", max_steps=50), PS)
    assert step_intervals(single).median() == pytest.approx(0.020 + 0.0005)
    # without a device, the real compute is the step's compute
    bare = frame(SimSpec("single", "w", 1, 32, max_steps=50), PS)
    assert step_intervals(bare).median() == pytest.approx(0.001 + 0.0005)


def test_ring_allreduce_by_hand_with_links():
    n, net = 4, Network(bandwidth_Bps=1e9, latency_s=1e-5)
    steps = frame(SimSpec("ddp", "w", n, 32, emulate_device="step_ms=20", max_steps=40), RING, net=net)
    ring = 2 * (n - 1) * (0.0002 + 1e-5) + 2 * (n - 1) / n * 1e6 * (1e-9 + 1e-9)
    assert step_intervals(steps).median() == pytest.approx(0.020 + 0.0003 + ring + 0.0005)
    assert steps.groupby("step")["t_wall"].nunique().max() == 1  # a round ends for every rank at once


def test_stragglers_are_the_pacers():
    """The simulation's worker steps take what the measured run's Pacer gives the same seed."""
    spec = SimSpec("ps", "w", 3, 16, seed=5, consistency="asp", emulate_device="step_ms=10",
                   stragglers="slow:1=2+transient:p=0.2,ms=30", max_steps=60)
    steps = frame(spec, replace_costs(PS, compute_cpu_s=0.0))
    for w in range(3):
        pacer = Pacer(parse_device("step_ms=10"), parse_stragglers(spec.stragglers), "w", w, 3, 5)
        want = [pacer.due_s(k, 16, 1.0, 0.0) for k in range(60)]
        got = steps[steps["worker"] == w].sort_values("step")["device_s"].tolist()
        assert got == pytest.approx(want)
    assert any(d > 0.035 for d in steps["device_s"])  # the stalls happened


def replace_spec(spec: SimSpec, **kw) -> SimSpec:
    from dataclasses import replace

    return replace(spec, **kw)


def replace_costs(costs: SystemCosts, **kw) -> SystemCosts:
    from dataclasses import replace

    return replace(costs, **kw)


def test_consistency_models_wait_as_they_should():
    """A 3x slow worker: BSP runs at its pace, ASP does not wait, SSP(s) keeps clocks within s + 1."""
    base = dict(workload="w", workers=4, batch_size=16, emulate_device="step_ms=10", stragglers="slow:2=3",
                max_steps=60)
    bsp = frame(SimSpec(system="ps", consistency="bsp", **base), PS)
    asp = frame(SimSpec(system="ps", consistency="asp", **base), PS)
    ssp = frame(SimSpec(system="ps", consistency="ssp", staleness=2, **base), PS)
    fast = lambda df: step_intervals(df[df["worker"] == 0]).median()  # noqa: E731
    assert fast(bsp) == pytest.approx(0.030 + 0.002 + 0.0005, rel=0.02)
    assert fast(asp) == pytest.approx(0.010 + 0.002 + 0.0005, rel=0.02)
    assert bsp["staleness"].max() == 0 and asp["staleness"].max() > 3
    # SSP: at every step end, no worker is more than s + 1 steps ahead of the slow one
    for t in ssp["t_wall"]:
        done = ssp[ssp["t_wall"] <= t].groupby("worker").size().reindex(range(4), fill_value=0)
        assert done.max() - done[2] <= 2 + 1
    # a persistent straggler: SSP's bound holds everyone to its pace in the steady state, as BSP does
    assert rate(asp) > 1.5 * rate(ssp) and rate(ssp) == pytest.approx(rate(bsp), rel=0.05)


def test_one_shard_saturates_at_its_cpu_per_update():
    """ASP, 16 workers at 10 ms a step against a shard that needs 2 ms an update: 500 updates/s."""
    slow_shard = replace_costs(PS, server_cpu_s=0.002, comm_fixed_s=0.003)
    steps = frame(SimSpec("ps", "w", 16, 10, consistency="asp", emulate_device="step_ms=10", max_steps=80), slow_shard)
    assert rate(steps) == pytest.approx(500 * 10, rel=0.03)
    # two shards each take every worker's update of their half: the CPU per update still caps it
    two = frame(SimSpec("ps", "w", 16, 10, consistency="asp", servers=2, emulate_device="step_ms=10", max_steps=80),
                slow_shard)
    assert rate(two) == pytest.approx(500 * 10, rel=0.03)
    # shared cores: 4 workers whose real compute is 5 ms on 1 core cannot step faster than 20 ms
    busy = replace_costs(PS, compute_cpu_s=0.005)
    crowded = frame(SimSpec("ps", "w", 4, 10, consistency="asp", emulate_device="step_ms=2", max_steps=60, cores=1),
                    busy)
    assert step_intervals(crowded).median() >= 0.020


def test_switch_changes_phase_at_its_time_and_pays_the_handover():
    spec = SimSpec("switch", "w", 4, 16, consistency="asp", emulate_device="step_ms=10", stragglers="slow:1=2",
                   budget_s=2.0, switch_at_s=0.5)
    steps = frame(spec, replace_costs(PS, handover_s=0.3), sync_costs=RING)
    sync, after = steps[steps["phase"] == "sync"], steps[steps["phase"] == "async"]
    assert sync["t_wall"].max() <= 0.5 + 0.05 and after["t_wall"].min() >= sync["t_wall"].max() + 0.3
    assert steps["t_wall"].max() <= 2.0
    # asynchronous after the switch: the fast workers outpace the slow one
    assert after[after["worker"] == 0].shape[0] > 1.5 * after[after["worker"] == 1].shape[0]
    # a PS BSP sync phase: the workers meet at the switch, then the same async phase
    ps_sync = frame(replace_spec(spec, sync="ps-bsp"), replace_costs(PS, handover_s=0.3), sync_costs=PS)
    sync, after = ps_sync[ps_sync["phase"] == "sync"], ps_sync[ps_sync["phase"] == "async"]
    assert sync["staleness"].max() == 0 and after["t_wall"].min() >= sync["t_wall"].max() + 0.3
    assert after[after["worker"] == 0].shape[0] > 1.5 * after[after["worker"] == 1].shape[0]
    with pytest.raises(ConfigError, match="switch_at_s"):
        SimSpec("switch", "w", 2, 8, max_steps=5)
    with pytest.raises(ConfigError, match="no model of system"):
        SimSpec("mpi", "w", 2, 8, max_steps=5)


# ---- costs and check from records ------------------------------------------------------

def _suites(results: Path) -> None:
    from psbench.core.spec import RunSpec
    from tests.report_fixtures import fake_run

    parts = {"compute_s": 0.6, "comm_s": 0.35, "update_s": 0.05}
    for workers in (1, 4):
        for consistency in ("asp", "bsp"):
            spec = RunSpec("ps", "mlp-digits", workers=workers, batch_size=32, max_steps=40,
                           options={"consistency": consistency})
            fake_run(results, "systems", spec, step_s=0.01, steps=40, parts=parts)
    for workers in (1, 2):
        spec = RunSpec("ddp", "mlp-digits", workers=workers, batch_size=32, max_steps=40)
        fake_run(results, "systems", spec, step_s=0.01, steps=40, parts={"compute_s": 0.9, "comm_s": 0.05,
                                                                            "update_s": 0.05})


def test_measured_costs_name_their_runs_and_the_check_reads_both_alike(tmp_path: Path):
    from psbench.bench.sim.costs import costs_from_suites
    from psbench.bench.sim.check import check_suites

    _suites(tmp_path)
    measured = costs_from_suites([tmp_path / "systems"])
    costs = measured.for_run("ps", "mlp-digits", 32)
    assert costs.compute_cpu_s == pytest.approx(0.006, rel=0.05)
    assert costs.comm_fixed_s == pytest.approx(0.0035, rel=0.05)
    assert measured.for_run("ps", "mlp-digits", 64).compute_cpu_s == pytest.approx(2 * costs.compute_cpu_s)
    named = [f for f in measured.figures if f.system == "ps" and f.name.startswith("comm_fixed")]
    assert named and "ps-mlp-digits-w1" in named[0].source and named[0].lo <= named[0].value <= named[0].hi
    with pytest.raises(ConfigError, match="no measured costs of horovod"):
        measured.for_run("horovod", "mlp-digits", 32)
    check = check_suites([tmp_path / "systems"], measured)
    df = check.frame()
    assert set(df["workers"]) == {1, 2, 4} and df["calibration_run"].sum() == 3
    # the 1-worker runs are the costs' inputs: the event loop gives their step back
    assert df[df["calibration_run"]]["step_s_error"].abs().max() < 0.02
    summary = check.summary()
    assert summary["validated_runs"] == 3 and summary["samples_per_s_error_max"] < 0.10, df


def test_simulate_from_results_writes_validation_and_projections(tmp_path: Path, capsys):
    from psbench.bench.cli import main

    _suites(tmp_path / "res")
    out = tmp_path / "sim"
    assert main(["simulate", "--from", str(tmp_path / "res"), "--out", str(out), "--max-workers", "16"]) == 0
    printed = capsys.readouterr().out
    assert "validation: 3 runs" in printed
    for name in ("calibration.json", "validation.csv", "projection.csv", "gap.csv", "shards.csv", "setups.csv",
                 "anchors.csv", "report.md", "projection.png", "provenance.json"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert "## Measured costs" in report and "## Validation against the suites" in report and "goal: median" in report
    projection = pd.read_csv(out / "projection.csv")
    assert set(projection["workers"]) == {8, 16} and set(projection["link_gbit"]) == {1, 10, 25}
    assert projection["git_sha"].notna().all()
    assert json.loads((out / "calibration.json").read_text())["figures"]
    assert main(["simulate", "--from", str(tmp_path / "res"), "--spark-job-ms", "5"]) == 2
    assert "belongs to the analytic model" in capsys.readouterr().err


def test_a_capped_netlab_run_is_simulated_with_its_links_measured_goodput(tmp_path: Path):
    """`psbench netlab bench`'s runs (cluster files, tc-capped namespace hosts) are checked by the
    event model: each capped run's links get the cap's measured goodput (bandwidth.csv), the lab's
    hosts share the recording machine's cores, and an uncapped run keeps the loopback costs alone."""
    from psbench.bench.sim.costs import costs_from_suites
    from psbench.bench.sim.check import check_suites, run_network
    from psbench.bench.sim.from_results import netlab_goodput
    from psbench.bench.sim.model_size import model_bytes
    from psbench.core.spec import RunSpec
    from tests.report_fixtures import fake_run

    _suites(tmp_path)
    measured = costs_from_suites([tmp_path / "systems"])
    for cap in (1.0, None):
        spec = RunSpec("ps", "mlp-digits", workers=4, batch_size=32, max_steps=40,
                       seed=0 if cap else 1, options={"consistency": "bsp"})
        fake_run(tmp_path, "netlab", spec, step_s=0.01, steps=40, parts={"compute_s": 0.6, "comm_s": 0.4})
        manifest_path = tmp_path / "netlab" / spec.run_id / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["extra"]["cluster"] = {"launcher": "netns", "hosts": [
            {"name": name, "roles": [role], "cap_mbit": cap} for name, role in
            [("ps0", "ps-server"), *((f"w{k}", "worker") for k in range(4))]]}
        manifest["machine"] = {"cores": 2}
        manifest_path.write_text(json.dumps(manifest))
    pd.DataFrame({"cap_mbit": [1.0, None], "link_goodput_mbit": [0.9, None]}).to_csv(
        tmp_path / "netlab" / "bandwidth.csv", index=False)
    goodput = netlab_goodput(tmp_path)
    assert goodput == {1.0: 0.9}
    assert run_network({}, goodput) == (Network(), None)
    capped = {"extra": {"cluster": {"hosts": [{"cap_mbit": 1.0}, {"cap_mbit": 5.0}, {"cap_mbit": None}]}}}
    assert run_network(capped, goodput)[1] == 0.9 and run_network(capped, {})[1] == 1.0  # nominal when unmeasured
    rows = check_suites([tmp_path / "netlab"], measured, goodput).frame().set_index("conditions")
    slow = rows.loc["native, links capped (0.9 Mbit/s goodput)"]
    # BSP through one shard: its link carries the 4 workers' pushes in and 4 replies out each step
    wire_s = 2 * 4 * model_bytes("mlp-digits") * 8 / 0.9e6
    assert slow["predicted_step_ms"] / 1e3 >= 0.95 * wire_s
    assert rows.loc["native", "predicted_step_ms"] < 0.1 * slow["predicted_step_ms"]
