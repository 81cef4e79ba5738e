"""A workload's model size: the bytes M that both scale models move per push, pull or allreduce."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)  # it loads the data set: once per workload and seed
def model_bytes(workload: str, seed: int = 0) -> int:
    """The model's parameters as float32, in bytes."""
    from psbench.core.spec import RunSpec
    from psbench.systems.common import prepare

    prep = prepare(RunSpec("single", workload, seed=seed))
    return 4 * sum(p.numel() for p in prep.build_model().parameters())
