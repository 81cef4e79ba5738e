"""Parameter-server benchmarks (not in the default suite: the file name does not match test_*.py).

Run: `.venv/bin/python -m pytest tests/bench_ps.py -s` (a few minutes). Each test prints the
ratios measured side by side in one run; it asserts only that they were measured, never a time.
The goals from the issue are printed beside each figure.
"""
from __future__ import annotations

import json
import math

import pytest

from psbench.bench.regress import ps_benchmarks

pytestmark = pytest.mark.slow


def show(title: str, results: dict[str, float], goals: dict[str, float]) -> None:
    print(f"\n== {title}")
    print(json.dumps(results, indent=1, sort_keys=True))
    for key, goal in goals.items():
        print(f"{key}: {results[key]:.3f} (goal >= {goal}) {'ok' if results[key] >= goal else 'BELOW GOAL'}")
    assert all(math.isfinite(v) and v > 0 for k, v in results.items() if "accuracy" not in k and "staleness" not in k)


def test_roundtrip_vs_raw_zmq():
    r = benchmarks.ratio_roundtrip()
    show("push+pull vs raw pyzmq echo (ratio of round-trip times)", r, {f"roundtrip_{s}mb": 0.7 for s in (1, 10, 100)})


def test_asp_one_worker_vs_single():
    r = benchmarks.ratio_asp_vs_single()
    show("ps asp, 1 worker / single (samples/s)", r, {k: 0.95 for k in r if "_vs_single_" in k})


def test_consistency_two_workers():
    r = benchmarks.ratio_consistency()
    show("2 workers: bsp / asp / ssp:2 with 1 and 2 shards", r, {})
    assert all(r[k] > 0.5 for k in r if k.endswith("_val_accuracy"))
