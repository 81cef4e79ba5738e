"""spark-torch: TorchDistributor launches torch DDP (gloo) ranks that train; a failing rank ends the
run with one clear error; launch overheads are recorded."""
from __future__ import annotations

import pytest

from spark_helpers import LOCAL2, final_val_accuracy, run_system, spark_session  # noqa: F401 (the module's session)

pytestmark = pytest.mark.spark


def test_trains_mlp_digits_with_two_workers_and_records_overheads():
    rec = run_system("spark-torch", batch_size=64, lr=0.3, epochs=3, options=LOCAL2)
    assert final_val_accuracy(rec) >= 0.85
    assert len(rec.steps) == 2 * 36 and {r["worker"] for r in rec.steps} == {0, 1}
    assert [e["step"] for e in rec.evals if e["split"] == "val"] == list(range(0, 37, 6))
    over = rec.extra["spark_overheads"]
    for key in ("launch_s", "rank_start_s", "finish_s", "step_s_mean"):
        assert over.get(key) is not None, key
    assert over["launch_s"] >= over["rank_start_s"] > 0
    assert rec.extra["torch_local_mode"] is True


def test_failing_rank_is_one_clear_error():
    with pytest.raises(RuntimeError) as info:
        run_system("spark-torch", max_steps=6, options={**LOCAL2, "fail_at_step": 2})
    message = str(info.value)
    assert "\n" not in message
    assert "injected failure in worker 1 at step 2" in message
