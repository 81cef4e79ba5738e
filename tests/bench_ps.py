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
    r = ps_benchmarks.ratio_roundtrip()
    # the goals: >= 0.8 of the raw echo at 1 MB, >= 0.9 at 10 MB
    show("push+pull vs raw pyzmq echo (ratio of round-trip times)", r, {"roundtrip_1mb": 0.8, "roundtrip_10mb": 0.9})


def test_asp_one_worker_vs_single():
    r = ps_benchmarks.ratio_asp_vs_single()
    goals = {"cnn-mnist1d": 0.9, "mlp-digits": 0.6}  # strict ASP (the pipelined run: the same bar)
    show("ps asp, 1 worker / single (samples/s, whole runs)", r,
         {k: goals[w] for k in r for w in goals if k.endswith(f"_vs_single_{w}")})


def test_asp_one_worker_vs_single_and_echo_interleaved():
    r = ps_benchmarks.ratio_asp_vs_single_interleaved()
    # the goals for strict ASP with one worker vs single: cnn-mnist1d >= 0.9, mlp-digits >= 0.6
    show("strict ps asp, 1 worker / single and / raw echo step (alternating bursts)", r,
         {"asp1_vs_single_cnn_mnist1d": 0.9, "asp1_vs_single_mlp_digits": 0.6})


def test_consistency_two_workers():
    r = ps_benchmarks.ratio_consistency()
    show("2 workers: bsp / asp / ssp:2 with 1 and 2 shards", r, {})
    assert all(r[k] > 0.5 for k in r if k.endswith("_val_accuracy"))
