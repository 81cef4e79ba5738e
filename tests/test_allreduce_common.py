"""The shared allreduce worker loop in-process (one rank, no communication): the sync phase a
Strategy-Switch reuses stops on its criterion and hands over weights AND optimizer state."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from psbench.core.spec import RunSpec
from psbench.systems.allreduce_common import (concat_batch_reference, flat_momentum, load_state, read_state, ring_allreduce_bytes,
                                      run_sync, save_state)
from psbench.systems.common import flat_params, forward_backward, make_optimizer, prepare


class LocalComm:
    """World of one: the loop's collectives are identities."""
    rank, size, device = 0, 1, torch.device("cpu")

    def wrap(self, model, optimizer, clock=None):
        return model, optimizer

    def apply(self, optimizer, clock):
        with clock.update():
            optimizer.step()

    def barrier(self):
        pass

    def allreduce_once(self, tensor):
        pass

    def sum_floats(self, values):
        return list(values)

    def shutdown(self):
        pass


SPEC = RunSpec("ddp", "mlp-digits", workers=1, seed=3)


def test_stop_criterion_ends_the_sync_phase_at_an_eval_point():
    prep = prepare(SPEC)
    seen = []

    def stop_after_two_evals(step, splits):
        seen.append((step, splits["val"][1]))
        return len(seen) == 3  # evals at step 0, every, 2*every

    result = run_sync(prep, LocalComm(), should_stop=stop_after_two_evals)
    every = prep.eval_every()
    assert result.stopped_early and result.steps == 2 * every
    assert [s for s, _ in seen] == [0, every, 2 * every]
    assert [r["step"] for r in result.step_rows] == list(range(2 * every))
    assert seen[-1][1] > seen[0][1]  # it learned something before stopping


def test_sync_phase_state_continues_exactly_like_uninterrupted_training(tmp_path):
    """Weights and momentum saved after k steps, loaded into a fresh model and optimizer, give the
    same model after k+m steps as training straight through (what the async phase relies on)."""
    k, m = 20, 15
    prep = prepare(SPEC)
    first = run_sync(prep, LocalComm(), max_steps=k)
    assert first.steps == k and not first.stopped_early
    save_state(tmp_path, first.weights, first.momentum)
    weights, momentum = read_state(tmp_path)
    assert weights.dtype == np.float32 and np.array_equal(weights, first.weights)

    model = prep.build_model()
    optimizer = make_optimizer(model, prep.workload, prep.lr)
    load_state(model, optimizer, weights, momentum)
    loss_fn = prep.workload.loss_fn()
    stream = prep.batches(0)
    for _ in range(k):
        next(stream)
    for _ in range(m):
        _, x, y = next(stream)
        forward_backward(model, loss_fn, x, y)
        optimizer.step()
    straight_w, straight_m = concat_batch_reference(SPEC, k + m)
    np.testing.assert_allclose(flat_params(model), straight_w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(flat_momentum(model, optimizer), straight_m, rtol=0, atol=1e-6)
    # without the momentum buffers the continuation differs: the optimizer state matters
    fresh = prep.build_model()
    fresh_opt = make_optimizer(fresh, prep.workload, prep.lr)
    load_state(fresh, fresh_opt, weights, np.zeros_like(momentum))
    stream = prep.batches(0)
    for _ in range(k):
        next(stream)
    _, x, y = next(stream)
    forward_backward(fresh, loss_fn, x, y)
    fresh_opt.step()
    assert np.abs(flat_params(fresh) - concat_batch_reference(SPEC, k + 1)[0]).max() > 1e-4


def test_state_files_are_plain_npy(tmp_path):
    save_state(tmp_path, np.arange(5, dtype=np.float64), np.ones(5, np.float32))
    assert (tmp_path / "weights.npy").read_bytes()[:6] == b"\x93NUMPY"
    w, mom = read_state(tmp_path)  # loads with allow_pickle=False
    assert w.dtype == np.float32 and w.tolist() == [0, 1, 2, 3, 4] and mom.tolist() == [1] * 5


@pytest.mark.parametrize("n, world, expected", [(1000, 1, 0), (1000, 2, 4000), (1000, 4, 6000)])
def test_ring_allreduce_bytes(n, world, expected):
    assert ring_allreduce_bytes(n, world) == expected
