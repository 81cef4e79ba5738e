"""Every system's mini-batches (systems/common.py Prepared.batches): seeded and deterministic, each
epoch a permutation of the shard gathered once, each step a contiguous view of it (no copy), and the
assembly time handed to the step's clock (data_s)."""
from __future__ import annotations

import numpy as np
import torch

from psbench.core.emulation import pacer_for
from psbench.core.spec import RunSpec
from psbench.systems.common import StepClock, epoch_arrays, epoch_order, prepare

SPEC = RunSpec("single", "mlp-digits", workers=2, batch_size=64, epochs=3, seed=7)


def _stream(spec: RunSpec, worker: int = 0) -> list[tuple[int, np.ndarray, np.ndarray]]:
    return [(step, x.numpy().copy(), y.numpy().copy()) for step, x, y in prepare(spec).batches(worker)]


def test_the_same_seed_gives_the_same_batches_and_another_seed_others():
    first, again = _stream(SPEC), _stream(SPEC)
    assert [s for s, _, _ in first] == list(range(len(first)))
    for (_, x0, y0), (_, x1, y1) in zip(first, again, strict=True):
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)
    other = _stream(RunSpec("single", "mlp-digits", workers=2, batch_size=64, epochs=3, seed=8))
    assert not np.array_equal(first[0][1], other[0][1])


def test_each_epoch_reads_the_shard_once_in_its_own_order():
    prep = prepare(SPEC)
    shard = np.asarray(prep.plan.shards[1])
    per_epoch = prep.steps_per_epoch(1)
    stream = list(prep.batches(1))
    assert len(stream) == SPEC.epochs * per_epoch
    for epoch in range(SPEC.epochs):
        x_epoch, y_epoch = epoch_arrays(prep.data, epoch_order(SPEC.seed, 1, epoch, shard, SPEC.batch_size))
        xs = np.concatenate([x.numpy() for _, x, _ in stream[epoch * per_epoch:(epoch + 1) * per_epoch]])
        ys = np.concatenate([y.numpy() for _, _, y in stream[epoch * per_epoch:(epoch + 1) * per_epoch]])
        np.testing.assert_array_equal(xs, x_epoch)  # the epoch's order, read front to back
        np.testing.assert_array_equal(ys, y_epoch)
    order = epoch_order(SPEC.seed, 1, 0, shard, SPEC.batch_size)
    assert sorted(order) == sorted(shard)  # a permutation of the shard
    assert not np.array_equal(order, epoch_order(SPEC.seed, 1, 1, shard, SPEC.batch_size))
    batches = [set(order[i:i + SPEC.batch_size]) for i in range(0, len(order), SPEC.batch_size)]
    assert len(batches) > 2 and batches != [set(b) for b in np.array_split(np.sort(shard), len(batches))]


def test_a_step_is_a_view_of_the_epochs_array_not_a_copy():
    prep = prepare(SPEC)
    stream = prep.batches(0)
    (_, x0, y0), (_, x1, y1) = next(stream), next(stream)
    row = x0.stride(0) * x0.element_size()
    # the second batch starts where the first ends, in one buffer: both are slices of the epoch's array
    assert x1.data_ptr() == x0.data_ptr() + SPEC.batch_size * row
    assert y1.data_ptr() == y0.data_ptr() + SPEC.batch_size * y0.element_size()
    assert x0.is_contiguous() and x1.is_contiguous()


def test_a_batch_of_the_whole_shard_is_gathered_once_for_every_epoch():
    spec = RunSpec("single", "mlp-digits", workers=2, batch_size=10_000, epochs=4, seed=3)
    prep = prepare(spec)
    stream = list(prep.batches(0))
    assert len(stream) == 4 and all(len(y) == len(prep.plan.shards[0]) for _, _, y in stream)
    assert len({x.data_ptr() for _, x, _ in stream}) == 1  # the same array each epoch: no gather after the first


def test_the_clock_is_told_each_batchs_assembly_as_data_s():
    prep = prepare(SPEC)
    clock = StepClock(pacer_for(None, None, SPEC.workload, 0, SPEC.workers, SPEC.seed))
    for step, x, y in prep.batches(0, clock):
        clock.begin(step, len(y))
        times = clock.split()
        assert times.data_s > 0 and times.data_s == clock.data_s
        if step == 2:
            break
    clock.begin(3, 1)  # a step with no batch fetched through the stream owes no assembly
    assert clock.split().data_s == 0.0
    assert isinstance(x, torch.Tensor)
