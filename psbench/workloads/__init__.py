"""Workloads: datasets, models and data sharding. Knows nothing of systems."""
from psbench.workloads.datasets import Dataset, load_dataset
from psbench.workloads.registry import WORKLOADS, OptimizerSettings, Workload, get_workload

__all__ = ["Dataset", "OptimizerSettings", "WORKLOADS", "Workload", "get_workload", "load_dataset"]
