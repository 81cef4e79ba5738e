"""Workloads: datasets, models and data sharding. Knows nothing of systems."""
from workloads.datasets import Dataset, load_dataset
from workloads.errors import ConfigError
from workloads.registry import WORKLOADS, OptimizerSettings, Workload, get_workload

__all__ = ["ConfigError", "Dataset", "OptimizerSettings", "WORKLOADS", "Workload", "get_workload", "load_dataset"]
