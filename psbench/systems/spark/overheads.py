"""Where Spark's time goes: job and stage timings read back from Spark's own status store
(the data its UI shows), after training, so reading them costs the run nothing."""
from __future__ import annotations

from typing import Any

import numpy as np


def _ms(option: Any) -> float | None:
    """A scala Option[java.util.Date] as epoch milliseconds."""
    return float(option.get().getTime()) if option.isDefined() else None


def job_timings(sc: Any, group: str) -> list[dict[str, float | None]]:
    """Timings of every job run under job group `group`, in job order: the job's wall time in the
    scheduler, the delay before its first task ran, and task time summed over its stages."""
    jsc = sc._jsc.sc()
    try:
        jsc.listenerBus().waitUntilEmpty(10_000)  # the store is filled by an asynchronous listener
    except Exception:  # noqa: BLE001 - best effort: the timings below are then possibly incomplete
        pass
    store = jsc.statusStore()
    out = []
    for job_id in sorted(sc.statusTracker().getJobIdsForGroup(group)):
        job = store.job(job_id)
        submitted, completed = _ms(job.submissionTime()), _ms(job.completionTime())
        row: dict[str, float | None] = {
            "job_id": float(job_id),
            "job_s": (completed - submitted) / 1e3 if submitted and completed else None,
            "tasks": 0.0, "task_run_s": 0.0, "task_deserialize_s": 0.0, "task_cpu_s": 0.0,
            "result_serialize_s": 0.0, "first_task_delay_s": None,
        }
        stage_ids = job.stageIds()
        for i in range(stage_ids.length()):
            stage = store.lastStageAttempt(stage_ids.apply(i))
            row["tasks"] += stage.numTasks()
            row["task_run_s"] += stage.executorRunTime() / 1e3
            row["task_deserialize_s"] += stage.executorDeserializeTime() / 1e3
            row["task_cpu_s"] += stage.executorCpuTime() / 1e9
            row["result_serialize_s"] += stage.resultSerializationTime() / 1e3
            first = _ms(stage.firstTaskLaunchedTime())
            if i == 0 and first is not None and submitted is not None:
                row["first_task_delay_s"] = (first - submitted) / 1e3
        out.append(row)
    return out


def summarise(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, float]:
    """Mean and median of each key over rows (None values skipped)."""
    out: dict[str, float] = {}
    for key in keys:
        values = np.array([r[key] for r in rows if r.get(key) is not None], dtype=float)
        if len(values):
            out[f"{key}_mean"] = float(values.mean())
            out[f"{key}_median"] = float(np.median(values))
    return out
