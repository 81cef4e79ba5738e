"""Rank, world size and rendezvous address of this process, read from the environment an engine
sets: torchrun's, then Slurm's, then Open MPI's (or the one named), and the role a rank plays.
Pure: no torch, no sockets; a missing or inconsistent environment is a ConfigError naming the
variables."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from psbench.core.errors import ConfigError

ENGINES = ("torchrun", "slurm", "mpi")
# The variable whose presence says an engine started us, per engine (auto-detection, in this order).
MARKER = {"torchrun": "RANK", "slurm": "SLURM_PROCID", "mpi": "OMPI_COMM_WORLD_RANK"}
REQUIRED = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"),
    "slurm": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),          # + a node list or MASTER_ADDR
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "MASTER_ADDR",
            "MASTER_PORT"),
}
# Slurm without MASTER_PORT: a port from the job id, so two jobs sharing a node do not collide.
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000


@dataclass(frozen=True)
class LaunchEnv:
    engine: str
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    # torchrun's agent already serves a TCPStore at master_addr:master_port (every rank a client);
    # otherwise rank 0 serves it.
    agent_store: bool = False


def detect(environ: Mapping[str, str]) -> str:
    """The first engine whose marker variable is set."""
    for engine in ENGINES:
        if MARKER[engine] in environ:
            return engine
    raise ConfigError("no launcher environment: set " + "; or ".join(
        f"{', '.join(REQUIRED[e])} ({e})" for e in ENGINES) + " (or name one: --env torchrun|slurm|mpi)")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list ('node[03-05,9],gpu1' -> 'node03'), as `scontrol show
    hostnames` would print it first: each bracket group gives its first entry, padding kept."""
    first = re.match(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist.strip())
    text = first.group(0) if first else ""
    host = re.sub(r"\[([^\]\-,]*)[^\]]*\]", lambda m: m.group(1), text)
    if not host or "[" in host or "]" in host:
        raise ConfigError(f"SLURM_NODELIST '{nodelist}' is no Slurm node list (e.g. node[01-04],gpu1)")
    return host


def _ints(environ: Mapping[str, str], engine: str, names: tuple[str, ...]) -> list[int]:
    try:
        return [int(environ[n]) for n in names]
    except ValueError:
        bad = [f"{n}={environ[n]!r}" for n in names if not environ[n].strip().lstrip("-").isdigit()]
        raise ConfigError(f"{engine} environment: {', '.join(bad)} must be integers") from None


def read_env(environ: Mapping[str, str], engine: str | None = None) -> LaunchEnv:
    """This process's LaunchEnv from `environ`; `engine` None: the first one detected."""
    engine = engine or detect(environ)
    if engine not in ENGINES:
        raise ConfigError(f"--env {engine!r} is not one of {', '.join(ENGINES)}")
    missing = [n for n in REQUIRED[engine] if not environ.get(n, "").strip()]
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if engine == "slurm" and not environ.get("MASTER_ADDR") and not nodelist:
        missing.append("SLURM_NODELIST (or MASTER_ADDR)")
    if engine == "slurm" and not environ.get("MASTER_PORT") and not environ.get("SLURM_JOB_ID", "").isdigit():
        missing.append("SLURM_JOB_ID (or MASTER_PORT)")
    if missing:
        raise ConfigError(f"{engine} environment incomplete: {', '.join(missing)} unset")
    rank, world, local_rank = _ints(environ, engine, REQUIRED[engine][:3])
    if engine == "slurm":
        addr = environ.get("MASTER_ADDR") or first_host(str(nodelist))
        port_text = environ.get("MASTER_PORT") or str(SLURM_PORT_BASE + int(environ["SLURM_JOB_ID"]) % SLURM_PORT_SPAN)
    else:
        addr, port_text = environ["MASTER_ADDR"], environ["MASTER_PORT"]
    port_name = "MASTER_PORT" if environ.get("MASTER_PORT") else "SLURM_JOB_ID"
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{engine} environment: {port_name}={port_text!r} must be a port in 1..65535")
    names = REQUIRED[engine]
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"{engine} environment inconsistent: {names[0]}={rank} must be in 0..{names[1]}-1 "
                          f"({names[1]}={world})")
    if local_rank < 0 or local_rank > rank:
        raise ConfigError(f"{engine} environment inconsistent: {names[2]}={local_rank} must be in 0..{names[0]} "
                          f"({names[0]}={rank})")
    agent = engine == "torchrun" and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return LaunchEnv(engine, rank, world, local_rank, addr.strip(), int(port_text), agent)


# Systems whose every rank is a training worker (ps: its first ranks are the shards).
EVERY_RANK_A_WORKER = ("ddp", "horovod")
LAUNCHED_SYSTEMS = ("ddp", "ps", "horovod")   # what psbench launch runs
# the CPU plan a job was submitted with (`psbench run --launcher slurm`), for rank 0's manifest:
# sbatch passes the environment on to the job's ranks
PLAN_ENV = "PSBENCH_SLURM_PLAN"


@dataclass(frozen=True)
class Role:
    kind: str    # "worker" or "shard"
    index: int   # worker id (0..workers-1) or shard id (0..servers-1)


def workers_of(system: str, world: int, servers: int) -> int:
    """How many training workers a job of `world` ranks has: ddp and horovod every rank; ps all but
    the shards."""
    if system in EVERY_RANK_A_WORKER:
        return world
    if servers < 1:
        raise ConfigError(f"--servers must be >= 1, got {servers}")
    if world <= servers:
        raise ConfigError(f"ps with --servers {servers} needs at least {servers + 1} ranks (a worker), "
                          f"the engine started {world}")
    return world - servers


def role_of(system: str, rank: int, world: int, servers: int = 1) -> Role:
    """ddp, horovod: every rank a worker; ps: ranks 0..servers-1 the shards, the rest workers 0, 1, ..."""
    workers_of(system, world, servers)
    if system in EVERY_RANK_A_WORKER:
        return Role("worker", rank)
    if rank >= servers:
        return Role("worker", rank - servers)
    return Role("shard", rank)
