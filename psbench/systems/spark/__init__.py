"""Spark adapters (real pyspark, local[N] by default, --spark-master spark://host:port for a cluster).

- spark-mllib   (mllib.py): one Spark job per mini-batch: broadcast weights, per-partition gradients,
                treeAggregate, SGD/momentum on the driver (how Spark MLlib trains).
- spark-barrier (barrier.py): one barrier stage of N long-running tasks exchanging gradients every
                step with BarrierTaskContext.allGather. Spark 4.3's barrier sync polls its RPC
                future with Thread.sleep(1000) (BarrierTaskContext.runBarrier), so every allGather
                costs about 1 s whatever the model: that floor is Spark's, and it is measured.
- spark-torch   (torch_distributor.py, ddp_fn.py): TorchDistributor launching torch DDP over gloo.

Shared: session.py (options, SparkSession, the adapter boundary: every Spark/Py4J/JVM error and a lost
executor become one SparkJobFailed line; the `hold` fault-injection points), partitions.py (shards as RDD records,
the batch schedule), overheads.py (job/stage timings from Spark's status store), benchmarks.py.

Recorded beside the usual rows: recorder.extra['spark_session_start_s'] (kept off the training
clock), 'spark_session_reused', 'spark_data_ready_s', 'spark_overheads' (means/medians per step:
mllib driver_job_s, task_python_s, overhead_s, job_s, task_run_s, first_task_delay_s...; barrier
compute_s, allgather_s, launch_s; torch launch_s, step_s) and one 'spark_step' event per step.
pyspark is imported only inside run(), so `psbench list` works without it.
"""
