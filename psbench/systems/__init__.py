"""System adapters behind one interface (`systems.base.System`), looked up by name.

The registry holds what `psbench list` and `psbench --help` show (a description and the packages a
system needs), and "module:Class" for the adapter, which loads only when the system is used, so
neither torch nor pyspark nor horovod is imported to list or describe the systems.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from dataclasses import dataclass

from psbench.core.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    target: str                   # "module:Class" of the adapter
    description: str
    needs: tuple[str, ...] = ()   # importable packages, checked without importing them
    java: bool = False            # needs a JVM (Spark)


REGISTRY: dict[str, Entry] = {
    "single": Entry("psbench.systems.single.adapter:SingleSystem",
                    "one process, one core, no communication (the scaling baseline)"),
    "ps": Entry("psbench.systems.ps.adapter:PSSystem",
                "parameter server: S shard processes, N workers over zmq; bsp / asp / ssp:S, staleness mitigations"),
    "ddp": Entry("psbench.systems.ddp.adapter:DDPSystem",
                 "torch DistributedDataParallel over gloo, N worker processes (ring allreduce)"),
    "horovod": Entry("psbench.systems.horovod.adapter:HorovodSystem",
                     "Horovod (horovod.torch DistributedOptimizer, gloo), launched by horovodrun", needs=("horovod",)),
    "spark-mllib": Entry("psbench.systems.spark.mllib:SparkMllibSystem",
                         "Spark MLlib-style: one Spark job per mini-batch (broadcast weights, treeAggregate gradients)",
                         needs=("pyspark",), java=True),
    "spark-mllib-native": Entry("psbench.systems.spark.native:SparkNativeSystem",
                                "Spark MLlib's own JVM trainers: LogisticRegressionWithSGD's GradientDescent "
                                "(miniBatchFraction), MultilayerPerceptronClassifier (gd)",
                                needs=("pyspark",), java=True),
    "spark-barrier": Entry("psbench.systems.spark.barrier:SparkBarrierSystem",
                           "Spark barrier mode: N long-running tasks exchanging gradients with "
                           "BarrierTaskContext.allGather", needs=("pyspark",), java=True),
    "spark-torch": Entry("psbench.systems.spark.torch_distributor:SparkTorchSystem",
                         "Spark TorchDistributor launching torch DDP (gloo allreduce): Spark as launcher",
                         needs=("pyspark",), java=True),
    "switch": Entry("psbench.systems.switch.adapter:SwitchSystem",
                    "Strategy-Switch: sync (DDP allreduce or PS BSP) until a criterion fires, then async PS (ASP/SSP)"),
    "ray-ps": Entry("psbench.systems.ray_ps.adapter:RayPSSystem",
                    "peer PS: Ray actors as server shards and workers (Ray's parameter-server example); asp / bsp",
                    needs=("ray",)),
    "rpc-ps": Entry("psbench.systems.rpc_ps.adapter:RpcPSSystem",
                    "peer PS: torch.distributed.rpc (TensorPipe) server and trainer processes (PyTorch's PS "
                    "tutorials); asp / bsp"),
}


INSTALL_HINTS = {"horovod": ": run `make horovod`",
                 "ray": ": run `make setup` (installs the `ray` extra) or pip install -e '.[ray]'"}


def names() -> list[str]:
    return list(REGISTRY)


def entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise ConfigError(f"unknown system '{name}'; choose from: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def describe(name: str) -> str:
    return entry(name).description


def quick_unavailable_reason(name: str) -> str | None:
    """Why the system cannot run here, from installed packages alone (nothing imported); the
    adapter's own unavailable_reason() makes the full check when the system is used."""
    e = entry(name)
    for package in e.needs:
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed{INSTALL_HINTS.get(package, '')}"
    if e.java and not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "Java is not installed (pyspark needs a JVM)"
    return None


def get_system(name: str) -> type:
    module_name, class_name = entry(name).target.split(":")
    return getattr(importlib.import_module(module_name), class_name)
