"""psbench's PySpark application: one run of a Spark system on the cluster spark-submit names,
written as `psbench run` writes it. Submit it as it is:

    spark-submit --master spark://HOST:7077 \\
        --conf spark.authenticate=true --conf spark.network.crypto.enabled=true \\
        --properties-file secret.properties \\
        --conf spark.executorEnv.PYTHONPATH=$PWD \\
        deploy/spark/psbench_job.py --system spark-mllib --workload mlp-digits --workers 2 --results-dir DIR

Its flags are `psbench run`'s (--system spark-mllib|spark-barrier|spark-torch|spark-mllib-native,
--workload, --workers, --seed, --max-steps, ...); the master, the driver's addresses and Spark
settings are spark-submit's. docs/hosts.md ("Spark: spark-submit") has the whole story."""
import sys

try:
    from psbench.bench.spark_submit import main
except ImportError as exc:
    print(f"psbench: error: the driver cannot import psbench ({exc}): run spark-submit with "
          "the checkout on PYTHONPATH, or pip install psbench into the driver's Python (PYSPARK_PYTHON)", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
