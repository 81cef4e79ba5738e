"""spark-barrier: trains with gradients exchanged through BarrierTaskContext.allGather, fails fast
and clearly when a task fails (its peers are waiting in allGather), records its overheads."""
from __future__ import annotations

import numpy as np
import pytest

from spark_helpers import LOCAL2, final_val_accuracy, run_system, spark_session  # noqa: F401 (the module's session)

pytestmark = pytest.mark.spark


@pytest.mark.slow  # ~35 s (72 barrier stages): `make test-slow`, which CI runs
def test_trains_mlp_digits_with_two_workers_and_records_overheads():
    rec = run_system("spark-barrier", batch_size=64, lr=0.3, epochs=3, options=LOCAL2)
    assert final_val_accuracy(rec) >= 0.85
    steps = sorted(rec.steps, key=lambda r: (r["step"], r["worker"]))
    assert len(steps) == 2 * 36 and {r["worker"] for r in steps} == {0, 1}
    assert all(r["bytes"] > 0 for r in steps)
    assert np.all(np.diff([r["t_wall"] for r in steps if r["worker"] == 0]) > 0)
    # rank 0's snapshots, evaluated by the driver at the single adapter's cadence (6 = 12 steps / 2)
    assert [e["step"] for e in rec.evals if e["split"] == "val"] == list(range(0, 37, 6))
    over = rec.extra["spark_overheads"]
    for key in ("launch_s", "task_start_delay_s", "finish_s", "compute_s_mean", "allgather_s_mean",
                "update_s_mean", "allgather_fraction", "job_s"):
        assert over.get(key) is not None, key
    assert "spark_session_start_s" in rec.extra
    assert sum(1 for e in rec.events if e["kind"] == "spark_step") == 2 * 36


def test_gradient_message_round_trips():
    from psbench.systems.spark.barrier import decode, encode

    grad = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    back, n, loss = decode(encode(grad, 7, 0.25))
    assert n == 7 and loss == 0.25
    np.testing.assert_array_equal(back, grad)


def test_failing_task_is_one_clear_error_and_no_hung_stage():
    with pytest.raises(RuntimeError) as info:
        run_system("spark-barrier", max_steps=6, options={**LOCAL2, "fail_at_step": 1, "barrier_timeout_s": 60})
    message = str(info.value)
    assert "\n" not in message
    assert "injected failure in worker 1 at step 1" in message
