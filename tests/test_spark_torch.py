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


@pytest.mark.parametrize("body, code", [("pass", 0), ("raise SystemError('the script failed')", 1)])
def test_a_rank_leaves_without_a_teardown_that_can_abort(body: str, code: int):
    """A finished rank must not die in interpreter teardown (torch's native threads could abort it
    with SIGABRT, and torchrun's agent on the other node then waited 300 s at its exit barrier):
    after the script, the rank exits at once, 0, or 1 if the script raised."""
    import subprocess
    import sys

    from psbench.systems.common import child_env

    script = ("import os\n"
              "from psbench.systems.spark.ddp_fn import exit_without_teardown\n"
              "class AbortsInTeardown:\n"
              "    def __del__(self):\n"
              "        os.abort()\n"
              "keep = AbortsInTeardown()\n"
              "exit_without_teardown()\n"
              f"{body}\n")
    done = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr[-2000:]
    assert ("the script failed" in done.stderr) == (code == 1)
    # without it, the same teardown aborts: the check above is not vacuous
    aborted = subprocess.run([sys.executable, "-c", script.replace("exit_without_teardown()\n", "")],
                             env=child_env(), capture_output=True, text=True, timeout=60)
    assert aborted.returncode == -6
