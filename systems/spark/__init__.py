"""Spark adapters: job per mini-batch (spark-mllib), barrier mode (spark-barrier), TorchDistributor
(spark-torch). pyspark is imported only inside run(), so `psbench list` works without it."""
