"""Micro-benchmarks (pytest-benchmark): each case of psbench.bench.regress.micro timed on both sides.

`make microbench` runs them with benchmarks enabled, saves the JSON and compares it with the last
save; in `make test` (benchmarks disabled) each side runs once, a smoke test. The ratios of each
pair (reference ÷ psbench mins) are added to the JSON as `psbench_ratios` and printed."""
from __future__ import annotations

import contextlib
from typing import Any

import pytest

from psbench.bench.regress.micro import CASES, ratios_from_json


@pytest.fixture(scope="module")
def case_sides():
    """case name -> its {side: callable}, each case set up once (a PS shard, an echo server) and torn
    down after this module, so no server outlives the micro-benchmarks in a whole-suite run."""
    with contextlib.ExitStack() as stack:
        entered: dict[str, Any] = {}

        def get(case: str) -> dict[str, Any]:
            if case not in entered:
                entered[case] = stack.enter_context(CASES[case]())
            return entered[case]

        yield get


def pytest_benchmark_update_json(config, benchmarks, output_json: dict) -> None:
    output_json["psbench_ratios"] = ratios_from_json(output_json)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    session = getattr(config, "_benchmarksession", None)
    if session is None or session.disabled or not session.benchmarks:
        return
    data = {"benchmarks": [{"extra_info": b.extra_info, "stats": {"min": b.stats.min}}
                           for b in session.benchmarks if b.stats is not None]}
    ratios = ratios_from_json(data)
    if ratios:
        terminalreporter.section("psbench ratios: reference min / psbench min (1 = psbench adds nothing)")
        for case, ratio in ratios.items():
            terminalreporter.write_line(f"{case:<16} {ratio:.3f}")
