"""Ratio benchmarks of the harness itself (registered in psbench.bench.regress.check.RATIO_BENCHMARKS).

Each function measures two things side by side in this process and returns their ratio, so the
figure means the same on a fast and a slow machine; the check repeats it and takes the median.
"""
from __future__ import annotations

import time

from psbench.bench.harness.runner import run_summary
from psbench.core.spec import RunSpec
from psbench.systems.common import configure_threads, forward_backward, make_optimizer, prepare

_warm = False


def _bare_loop_samples_per_s(spec: RunSpec) -> float:
    """Plain torch: the same model, optimizer and batches as the `single` system, nothing else."""
    prep = prepare(spec)
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    optimizer = make_optimizer(model, prep.workload, prep.lr)
    samples = 0
    start = time.perf_counter()
    for _, x, y in prep.batches(0):
        forward_backward(model, loss_fn, x, y)
        optimizer.step()
        samples += len(y)
    return samples / (time.perf_counter() - start)


def _harness_samples_per_s(spec: RunSpec) -> float:
    """The `single` system through the harness: planned, recorded, evaluations paused off the clock."""
    return float(run_summary(spec)["samples_per_s"])


def harness_overhead(quick: bool = False) -> dict[str, float]:
    """samples/s of `single` through the harness ÷ a bare torch loop (1.0 = no overhead; higher is better)."""
    global _warm
    configure_threads(1)
    spec = RunSpec("single", "mlp-digits", epochs=100, max_steps=600 if quick else 2000, evals_per_epoch=1)
    if not _warm:  # first-call costs (allocator, lazy imports) belong to neither side
        _bare_loop_samples_per_s(RunSpec("single", "mlp-digits", max_steps=50))
        _warm = True
    # Bare runs on both sides of the harness run: a drift in machine load hits both sides alike.
    bare_before = _bare_loop_samples_per_s(spec)
    harness = _harness_samples_per_s(spec)
    bare_after = _bare_loop_samples_per_s(spec)
    return {"single_vs_bare_loop": harness / ((bare_before + bare_after) / 2)}


def ps_overhead(quick: bool = False) -> dict[str, float]:
    """The parameter server against `single`, side by side: strict ASP (no pipelining) with 1 worker
    vs `single` per step on cnn-mnist1d and mlp-digits (a round trip costs about what a step does
    there: the PS's fixed cost laid bare), in alternating bursts (whole runs of a few hundred ms
    swung 3x under load), and that PS step against the same step over a raw pyzmq echo (the floor
    of any PS on pyzmq here). Higher is better. `echo_vs_single` is that floor against `single`: the
    most any PS over pyzmq could reach on this machine, so a goal for asp1_vs_single above it cannot
    be met by the PS's own code. (Push+pull against a raw pyzmq echo of the same bytes is timed by
    pytest-benchmark: regress's `micro`.)"""
    from psbench.bench.regress.ps_benchmarks import ratio_asp_vs_single_interleaved

    asp = ratio_asp_vs_single_interleaved(("cnn-mnist1d", "mlp-digits"), rounds=10 if quick else 20)
    out = {}
    for name in ("cnn_mnist1d", "mlp_digits"):
        out[f"asp1_vs_single_{name}"] = asp[f"asp1_vs_single_{name}"]
        # the same step with a raw pyzmq echo in place of the PS: what the PS itself costs
        out[f"asp1_vs_echo_{name}"] = asp[f"asp1_vs_echo_{name}"]
        out[f"echo_vs_single_{name}"] = asp[f"echo_vs_single_{name}"]  # the ceiling of asp1_vs_single
    return out
