"""System adapters behind one interface (`systems.base.System`), looked up by name.

The registry holds each system's facts: what `psbench list` and `psbench --help` show (a
description and the packages it needs), what the report, the scale model and the regression
benchmarks group it by (family, kind, synchrony, plot colour, how its bytes are counted, older
names), and "module:Class" for the adapter, which loads only when the system is used, so neither
torch nor pyspark nor horovod is imported to list, describe or group the systems.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from psbench.core.errors import ConfigError

if TYPE_CHECKING:
    from psbench.systems.base import System

# How its workers exchange: alone; a parameter server; an allreduce ring; Spark's Python paths (a
# job a mini-batch, barrier mode, TorchDistributor); Spark MLlib's own JVM trainer (no Python step
# to pace or to model: the event model, bench/sim/events.py, leaves it out); sync, then the PS.
FAMILIES = ("single", "ps", "allreduce", "spark", "spark-jvm", "switch")
# The thesis' first question: specialised systems (our PS and allreduce, the peer PSs, Strategy-Switch
# built of both) against general-purpose ones (Spark's paths); the one-process baseline is neither.
SPECIALISED, GENERAL_PURPOSE, BASELINE = "specialised", "general-purpose", "baseline"
KINDS = (SPECIALISED, GENERAL_PURPOSE, BASELINE)
# Whether its workers wait for each other each step: always; as its consistency option says (bsp, asp,
# ssp); synchronous, then asynchronous (Strategy-Switch); no question with one worker.
SYNC, BY_OPTION, SWITCHED, ONE_WORKER = "sync", "by option", "sync, then async", "one worker"
SYNCHRONIES = (SYNC, BY_OPTION, SWITCHED, ONE_WORKER)


@dataclass(frozen=True)
class Entry:
    target: str                   # "module:Class" of the adapter
    description: str
    family: str                   # one of FAMILIES
    kind: str                     # one of KINDS
    synchrony: str                # one of SYNCHRONIES
    colour: str                   # its colour in every plot (variants of it share it)
    bytes_source: str             # what its records' `bytes` column holds (how its adapter fills it)
    needs: tuple[str, ...] = ()   # importable packages, checked without importing them
    java: bool = False            # needs a JVM (Spark)
    aliases: tuple[str, ...] = ()  # other names its runs' records may carry
    peer_of: str | None = None    # a peer's implementation of this system, set beside ours

    def __post_init__(self) -> None:
        for name, allowed in (("family", FAMILIES), ("kind", KINDS), ("synchrony", SYNCHRONIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{self.target}: {name} '{getattr(self, name)}'; allowed: {', '.join(allowed)}")


RING_BYTES = "computed (ring allreduce of the model size)"
PEER_BYTES = "computed (gradients out, parameters back: twice the model size)"

REGISTRY: dict[str, Entry] = {
    "single": Entry("psbench.systems.single.adapter:SingleSystem",
                    "one process, one core, no communication (the scaling baseline)",
                    "single", BASELINE, ONE_WORKER, "#4d4d4d", "none (no communication)"),
    "ps": Entry("psbench.systems.ps.adapter:PSSystem",
                "parameter server: S shard processes, N workers over zmq; bsp / asp / ssp:S, staleness mitigations",
                "ps", SPECIALISED, BY_OPTION, "#1f77b4", "measured (wire payload, headers included)"),
    "ddp": Entry("psbench.systems.ddp.adapter:DDPSystem",
                 "torch DistributedDataParallel over gloo, N worker processes (ring allreduce)",
                 "allreduce", SPECIALISED, SYNC, "#ff7f0e", RING_BYTES),
    "horovod": Entry("psbench.systems.horovod.adapter:HorovodSystem",
                     "Horovod (horovod.torch DistributedOptimizer, gloo), launched by horovodrun",
                     "allreduce", SPECIALISED, SYNC, "#2ca02c", RING_BYTES, needs=("horovod",)),
    "spark-mllib": Entry("psbench.systems.spark.mllib:SparkMllibSystem",
                         "Spark MLlib-style: one Spark job per mini-batch (broadcast weights, treeAggregate gradients)",
                         "spark", GENERAL_PURPOSE, SYNC, "#d62728", "computed (model size: broadcast + treeAggregate)",
                         needs=("pyspark",), java=True),
    "spark-mllib-native": Entry("psbench.systems.spark.native:SparkNativeSystem",
                                "Spark MLlib's own JVM trainers: LogisticRegressionWithSGD's GradientDescent "
                                "(miniBatchFraction), MultilayerPerceptronClassifier (gd)",
                                "spark-jvm", GENERAL_PURPOSE, SYNC, "#7f0000",  # dark red: MLlib, its own trainer
                                "computed (float64 weights broadcast + gradient treeAggregate)",
                                needs=("pyspark",), java=True),
    "spark-barrier": Entry("psbench.systems.spark.barrier:SparkBarrierSystem",
                           "Spark barrier mode: N long-running tasks exchanging gradients with "
                           "BarrierTaskContext.allGather", "spark", GENERAL_PURPOSE, SYNC, "#9467bd",
                           "measured (allGather message lengths)", needs=("pyspark",), java=True),
    "spark-torch": Entry("psbench.systems.spark.torch_distributor:SparkTorchSystem",
                         "Spark TorchDistributor launching torch DDP (gloo allreduce): Spark as launcher",
                         "spark", GENERAL_PURPOSE, SYNC, "#8c564b", RING_BYTES, needs=("pyspark",), java=True),
    "switch": Entry("psbench.systems.switch.adapter:SwitchSystem",
                    "Strategy-Switch: sync (DDP allreduce or PS BSP) until a criterion fires, then async PS (ASP/SSP)",
                    "switch", SPECIALISED, SWITCHED, "#e377c2",
                    "computed in the sync phase, measured in the async phase",
                    aliases=("strategy-switch",)),
    "ray-ps": Entry("psbench.systems.ray_ps.adapter:RayPSSystem",
                    "peer PS: Ray actors as server shards and workers (Ray's parameter-server example); asp / bsp",
                    "ps", SPECIALISED, BY_OPTION, "#e7ba52", PEER_BYTES, needs=("ray",), peer_of="ps"),
    "rpc-ps": Entry("psbench.systems.rpc_ps.adapter:RpcPSSystem",
                    "peer PS: torch.distributed.rpc (TensorPipe) server and trainer processes (PyTorch's PS "
                    "tutorials); asp / bsp", "ps", SPECIALISED, BY_OPTION, "#6b6ecf", PEER_BYTES, peer_of="ps"),
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


def get_system(name: str) -> type[System]:
    module_name, class_name = entry(name).target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def names_where(**facts: Any) -> tuple[str, ...]:
    """The systems whose entries hold every given fact, in the registry's order, e.g.
    names_where(family="ps") or names_where(kind=SPECIALISED)."""
    unknown = sorted(set(facts) - {f.name for f in fields(Entry)})
    if unknown:
        raise TypeError(f"no registry fact(s) {', '.join(unknown)}")
    return tuple(n for n, e in REGISTRY.items() if all(getattr(e, k) == v for k, v in facts.items()))


def known_as(name: str) -> tuple[str, ...]:
    """Every name a system's records may carry: its own and its aliases."""
    return (name, *entry(name).aliases)


def by_name(fact: str) -> dict[str, Any]:
    """One fact of every system, under its name and each of its aliases (e.g. by_name("colour")),
    for code that looks up a record's system."""
    return {alias: getattr(e, fact) for n, e in REGISTRY.items() for alias in (n, *e.aliases)}
