"""spark-torch: pyspark.ml.torch.distributor.TorchDistributor launching torch DDP over gloo. Spark
is the launcher, allreduce is the engine. local_mode (the default) starts the N torchrun ranks on
the driver; local_mode=false starts them from N barrier tasks (one rank per task)."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from psbench.core.accelerator import CPU, CUDA
from psbench.core.errors import ConfigError
from psbench.core.cpu import WORKERS, Proc
from psbench.core.records import Recorder, split_sync_wait
from psbench.core.spec import RunSpec
from psbench.systems.base import option
from psbench.systems.common import evaluate_splits, prepare, record_evals, set_flat_params
from psbench.systems.spark.partitions import adopt_task_clock
from psbench.systems.spark.session import (SparkOptions, SparkJobFailed, SparkSystem, error_line,
                                           start_session)


@dataclass(frozen=True)
class TorchOptions(SparkOptions):
    local_mode: bool = option(True, "TorchDistributor local_mode: ranks on the driver (true) or in Spark tasks (false)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hold:
            raise ConfigError("option hold: spark-torch's steps run in torchrun's ranks, which have no pause hook; "
                              "use spark-mllib or spark-barrier")


class SparkTorchSystem(SparkSystem):
    name = "spark-torch"
    devices = (CPU, CUDA)  # the ranks' DDP on a GPU each, NCCL between them (TorchDistributor's use_gpu)
    Options = TorchOptions

    @staticmethod
    def cpu_processes(options: TorchOptions, workers: int) -> list[Proc]:
        """torchrun (pyspark's wrapper; its command line names the training file too, so it is
        matched first) and the ranks it starts from its train.py; in local mode on the driver."""
        ranks = [Proc("torchrun", 1 if options.local_mode and workers else 0, r"torch_run_process_wrapper"),
                 Proc(WORKERS, workers, r"pyspark[./](daemon|worker)|/train\.py\b")]
        return ranks + [p for p in SparkSystem.cpu_processes(options, workers) if p.role != WORKERS]

    def _train(self, spec: RunSpec, options: TorchOptions, recorder: Recorder) -> None:
        start_session(spec, options, recorder)
        recorder.extra["torch_local_mode"] = options.local_mode
        from pyspark.ml.torch.distributor import TorchDistributor

        from psbench.systems.spark import ddp_fn

        # Data is read by each rank itself (TorchDistributor passes no data in function mode); the
        # driver's copy is for evaluation only.
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        model = prep.build_model()
        loss_fn = prep.workload.loss_fn()
        distributor = TorchDistributor(num_processes=spec.workers, local_mode=options.local_mode, use_gpu=spec.device == CUDA)
        logging.getLogger("TorchDistributor").setLevel(logging.WARNING)

        with tempfile.TemporaryDirectory(prefix="psbench-torch-") as tmp:
            # local mode: rank 0 writes its result here; in tasks (possibly on other hosts) it is
            # returned through Spark as run()'s value instead
            payload = {"spec": spec.to_dict(), "fail_at_step": options.fail_at_step,
                       "result_path": str(Path(tmp) / "result.npz") if options.local_mode else None}
            # torchrun's chatter, and the ranks' output that TorchDistributor streams to the driver's
            # stderr (tracebacks of torchrun's exit barrier among it): kept for the error message
            output = io.StringIO()
            saved = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS")}
            # gloo (and NCCL's bootstrap, on a GPU) on loopback only
            os.environ.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            t_call = time.time()
            try:
                with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                    returned = distributor.run(ddp_fn.train, payload)
            except Exception as exc:
                failed = SparkJobFailed(f"spark-torch: TorchDistributor training failed: "
                                        f"{error_line(exc, output.getvalue())}")
                # the run's failure log prints notes with the traceback; the one line stays one line
                failed.add_note(f"the ranks' output, last lines:\n{output.getvalue()[-8000:]}")
                raise failed from exc
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            t_done = time.time()
            source = payload["result_path"] if options.local_mode else returned
            if not (isinstance(source, bytes) or (source and Path(source).is_file())):
                raise SparkJobFailed("spark-torch: TorchDistributor finished but rank 0 gave no result; "
                                   f"output tail: {output.getvalue()[-300:]!r}")
            result = ddp_fn.read_result(source)

        rows = sorted(result["rows"], key=lambda r: (r["step"], r["worker"]))
        # the ranks' clock: from the barrier after their set-up (torchrun, imports, data, gloo)
        to_clock = adopt_task_clock(recorder, result["t_ready"], max((r["t_epoch"] for r in rows), default=t_done))
        record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data), t_wall=0.0)  # the initial model
        split_sync_wait(rows)  # DDP's allreduce waits for the slowest rank
        for r in rows:
            recorder.step(r["worker"], r["step"], r["n_samples"], r["loss"], nbytes=r["bytes"],
                          t_wall=to_clock(r["t_epoch"]), compute_s=r["compute_s"], emulated_s=r["emulated_s"],
                          comm_s=r["comm_s"], wait_s=r["wait_s"], update_s=r["update_s"], data_s=r["data_s"])
            recorder.event("spark_step", step=r["step"], worker=r["worker"], t_wall=to_clock(r["t_epoch"]),
                           step_s=r["step_s"])
        for step, t_epoch, weights in result["snapshots"]:
            set_flat_params(model, weights)
            record_evals(recorder, step, evaluate_splits(model, loss_fn, prep.data), t_wall=to_clock(t_epoch))
        from psbench.systems.spark.overheads import summarise

        last_step = max((r["t_epoch"] for r in rows), default=t_done)
        stats = summarise(rows, ["step_s"])
        # launch_s: run() called until the ranks are up (torchrun, process start, imports, data,
        # gloo rendezvous); finish_s: last step until run() returned.
        stats.update(launch_s=result["t_ready"] - t_call, rank_start_s=result["t_enter"] - t_call,
                     finish_s=t_done - last_step)
        recorder.extra["spark_overheads"] = stats
