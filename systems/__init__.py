"""System adapters behind one interface (`systems.base.System`), looked up by name.

The registry maps names to "module:Class" so a system's heavy imports (pyspark, horovod)
load only when it is used.
"""
from __future__ import annotations

import importlib

from workloads.errors import ConfigError

REGISTRY: dict[str, str] = {
    "single": "systems.single.adapter:SingleSystem",
    "ps": "systems.ps.adapter:PSSystem",
    "ddp": "systems.ddp.adapter:DDPSystem",
    "horovod": "systems.horovod.adapter:HorovodSystem",
    "spark-mllib": "systems.spark.mllib:SparkMllibSystem",
    "spark-barrier": "systems.spark.barrier:SparkBarrierSystem",
    "spark-torch": "systems.spark.torch_distributor:SparkTorchSystem",
    "switch": "systems.switch.adapter:SwitchSystem",
    "ray-ps": "systems.ray_ps.adapter:RayPSSystem",
    "rpc-ps": "systems.rpc_ps.adapter:RpcPSSystem",
}


def names() -> list[str]:
    return list(REGISTRY)


def get_system(name: str) -> type:
    if name not in REGISTRY:
        raise ConfigError(f"unknown system '{name}'; choose from: {', '.join(REGISTRY)}")
    module_name, class_name = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)
