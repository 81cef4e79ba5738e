"""How bench/sim/analytic_check.py feeds the bandwidth experiment's rows to the analytic model (no
processes). The model against measured runs: tests/test_multihost.py::test_bandwidth_cap_makes_the_ps_server_link_the_bottleneck."""
from __future__ import annotations

import pandas as pd
import pytest

from psbench.bench.sim.analytic import AnalyticInputs
from psbench.bench.sim.analytic_check import netlab_runs, validate_netlab

def test_netlab_rows_use_the_measured_link_goodput():
    inputs = AnalyticInputs(0.0, 1e-4, 4_000_000, 1e9, 1e-4, cores=2)
    table = pd.DataFrame([
        {"system": "ps", "consistency": "bsp", "cap_mbit": 100.0, "workers": 4, "batch_size": 64,
         "samples_per_s": 90.0, "run_id": "a", "link_goodput_mbit": 96.0},
        {"system": "ddp", "consistency": None, "cap_mbit": 100.0, "workers": 4, "batch_size": 64,
         "samples_per_s": 400.0, "run_id": "b", "link_goodput_mbit": 96.0},
        {"system": "ddp", "consistency": None, "cap_mbit": None, "workers": 4, "batch_size": 64,
         "samples_per_s": 3000.0, "run_id": "c", "link_goodput_mbit": None}])
    assert [(r.system, bw) for r, bw, _ in netlab_runs(table)] == [("ps", 12e6), ("ddp", 12e6)]
    v = validate_netlab(table, inputs)
    # PS BSP, 4 workers, 1 server: T = 2 * 6.4 ms (4 workers on 2 cores) + 2r + 2 * 4 * M/B
    expected = 4 * 64 / (2 * 0.0064 + 2e-4 + 8 * 4e6 / 12e6)
    assert v.rows[0]["predicted_samples_per_s"] == pytest.approx(expected)
    assert len(v.rows) == 2 and v.rows[1]["cap_mbit"] == 100.0
