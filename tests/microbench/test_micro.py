"""Both sides of every micro-benchmark ratio, timed by pytest-benchmark's fixture (see
psbench.bench.regress.micro for the cases; `make microbench` to run them for real)."""
from __future__ import annotations

import pytest

from psbench.bench.regress.micro import CASES, ROUNDS, SIDES, WARMUP_ROUNDS


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("case", list(CASES))
def test_micro(benchmark, case_sides, case: str, side: str) -> None:
    benchmark.group = case
    benchmark.extra_info.update(case=case, side=side)
    benchmark.pedantic(case_sides(case)[side], rounds=ROUNDS[case], warmup_rounds=WARMUP_ROUNDS)
