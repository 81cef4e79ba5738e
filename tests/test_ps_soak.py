"""Soak: 8 worker processes push-pull against 2 shard processes on loopback (KVWorker, small tensors).
Every op is answered with the full parameters, every push is applied exactly once, and the shards'
resident memory does not grow beyond MAX_GROWTH_MB. The default is 8 x 500 ops; the full
8 x 10k run is in tests/soak_ps.py, outside the default suite (`make soak`)."""
from __future__ import annotations

import psutil

from psbench.systems.ps.soak import soak

MAX_GROWTH_MB = 50.0


def no_children() -> list:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


def check(result) -> None:
    print(f"\nsoak {result.workers}x{result.ops_per_worker} vs {result.servers} shards: {result.ops_per_s:.0f} ops/s, "
          f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, shard RSS {result.rss_before_mb} -> "
          f"{result.rss_after_mb} MB")
    assert result.ops == result.workers * result.ops_per_worker
    assert result.ops_per_s > 0 and 0 < result.p50_ms <= result.p99_ms
    assert result.growth_mb < MAX_GROWTH_MB, f"shard memory grew {result.growth_mb:.1f} MB"
    assert not no_children()


def test_soak_short():
    check(soak(workers=8, ops=500, servers=2))
