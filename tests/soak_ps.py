"""The full soak (8 workers x 10k push-pull ops vs 2 shards), outside the default suite: `make soak`."""
from __future__ import annotations

import pytest

from psbench.systems.ps.soak import soak
from tests.test_ps_soak import check

pytestmark = pytest.mark.slow


def test_soak_full():
    check(soak(workers=8, ops=10000, servers=2))
