"""`ray-ps`: a parameter server the way Ray's own example builds one. Server shards are Ray actors
holding their keys' tensors under torch.optim.SGD; workers are Ray actors that compute gradients
on the weights they are handed; the driver (this process) wires them together with object refs,
so gradients and weights go through Ray's object store with Ray's own serialization (numpy
arrays, its zero-copy path), never through the driver's hands.

  bsp: each round every active worker computes on the same weights; each shard averages the
       round's gradients and returns its new weights, which become the next round's input.
  asp: as Ray's async example: the driver waits for whichever worker's gradient is ready first,
       has the shards apply it, and gives that worker the resulting weights at once.

The driver knows every shard's version (a shard applies calls in the order one caller submits
them), so a gradient's staleness is counted here: shard version at apply minus the version the
worker computed on. Ray is a private instance on loopback, or a cluster the user runs, joined with
--ray-address (cluster.py); one logical CPU per actor and one torch thread each.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import time
from typing import Any

from psbench.core.cpu import WORKERS, Proc
from psbench.core.records import Recorder
from psbench.core.spec import RunSpec
from psbench.systems.base import System, option
from psbench.systems.common import Prepared, prepare
from psbench.systems.peer_common import (PeerFailed, PeerOptions, PeerWorker, ShardCore, ShardPlan, WorkerReport,
                                 deadline_left, join_shards, record_run, shard_plans, timed_out)
from psbench.core.errors import ConfigError
from psbench.systems.ray_ps.cluster import actor_node, check_address, kill_actors, ray_session

NOT_INSTALLED = "ray is not installed: run `make setup` (installs the `ray` extra) or pip install -e '.[ray]'"
IN_FLIGHT_ROUNDS = 2  # bsp: rounds submitted ahead of the one finishing (Ray chains them by refs)


class ShardActor:
    """A server shard (Ray's example's ParameterServer, on a subset of the keys)."""

    def __init__(self, plan: ShardPlan):
        self.core = ShardCore(plan)

    def weights(self) -> list:
        return [t.numpy() for t in self.core.weights()]  # copied into the object store on return

    def apply(self, *grads: list) -> list:
        self.core.apply(grads)
        return self.weights()

    def node(self) -> dict[str, str]:
        return actor_node()


class WorkerActor:
    """A worker (Ray's example's DataWorker) on its data shard; returns one gradient list per shard."""

    def __init__(self, spec: dict[str, Any], worker: int, n_shards: int):
        self.w = PeerWorker(RunSpec.from_dict(spec), worker, n_shards)

    def ready(self) -> int:
        return self.w.last

    def node(self) -> dict[str, str]:
        return actor_node()

    def step(self, staleness: int | None, *weights: list) -> Any:
        self.w.receive(weights, staleness)
        grads = self.w.compute()
        if grads is None:
            raise RuntimeError(f"worker {self.w.worker} was asked for a step past its budget")
        parts = [[g.numpy() for g in part] for part in grads]
        return parts[0] if len(parts) == 1 else tuple(parts)

    def finish(self, staleness: int | None, *weights: list) -> WorkerReport:
        self.w.receive(weights, staleness)
        return self.w.finish()


@dataclasses.dataclass(frozen=True)
class RayPSOptions(PeerOptions):
    ray_address: str = option("", "ray-ps: join a running Ray cluster, auto | HOST:PORT (as `ray start --head` "
                                  "prints; run psbench on one of its nodes); empty: a private Ray on loopback")
    insecure: bool = option(False, "ray-ps: a ray_address beyond loopback without Ray's token authentication "
                                   "(RAY_AUTH_MODE=token): allow it; recorded")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_address(self.ray_address, self.insecure)


class RayPSSystem(System):
    name = "ray-ps"
    no_cuda_reason = "its actors hold host tensors; Ray's GPU placement (num_gpus) is not set up"
    Options = RayPSOptions

    @staticmethod
    def local_workers(options: RayPSOptions, workers: int) -> int:
        """None on a joined cluster: its actors and daemons run on its nodes, under its raylets."""
        return 0 if options.ray_address else workers

    @staticmethod
    def cpu_processes(options: RayPSOptions, workers: int) -> list[Proc]:
        """Actors are processes named after their class; the rest of Ray (gcs_server, raylet, its
        log monitor, idle workers) are its daemons, together up to a core each of its slots. The
        driver, which chains every call, is this process: all a joined cluster's run starts here."""
        if options.ray_address:
            return []
        return [Proc("ray shard", options.servers, r"ray::ShardActor"), Proc(WORKERS, workers, r"ray::WorkerActor"),
                Proc("ray daemons", 1, r"ray::|/ray/", max_cores=float(workers + options.servers))]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None if importlib.util.find_spec("ray") is not None else NOT_INSTALLED

    def run(self, spec: RunSpec, options: RayPSOptions, recorder: Recorder) -> None:
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        train(prep, options, recorder)


def train(prep: Prepared, options: PeerOptions, recorder: Recorder):
    """Run one ray-ps training; returns the servers' final flat parameters."""
    if RayPSSystem.unavailable_reason():
        raise ConfigError(NOT_INSTALLED)
    plans = shard_plans(prep, options)  # a ConfigError (more shards than tensors) before Ray starts
    n, s = prep.spec.workers, options.servers
    address, insecure = getattr(options, "ray_address", ""), getattr(options, "insecure", False)
    deadline = time.monotonic() + options.timeout_s
    with ray_session(address, n + s, insecure) as session:
        ray = session.ray
        actors: list = []
        try:
            shard_cls = ray.remote(num_cpus=1)(ShardActor).options(**session.actor_options)
            worker_cls = ray.remote(num_cpus=1)(WorkerActor).options(**session.actor_options)
            shards = [shard_cls.remote(plan) for plan in plans]
            workers = [worker_cls.remote(prep.spec.to_dict(), i, s) for i in range(n)]
            actors = shards + workers
            budgets = ray.get([w.ready.remote() for w in workers], timeout=deadline_left(deadline, "ray-ps set-up"))
            weights = [sh.weights.remote() for sh in shards]
            ray.wait(weights, num_returns=s, timeout=deadline_left(deadline, "ray-ps set-up"))
            nodes = ray.get([a.node.remote() for a in actors], timeout=deadline_left(deadline, "ray-ps set-up"))
            t0 = time.time()
            loop = _bsp if options.consistency == "bsp" else _asp
            weights, finishes = loop(ray, shards, workers, weights, budgets, deadline)
            reports = ray.get(finishes, timeout=deadline_left(deadline, "ray-ps run"))
            final = join_shards(ray.get(weights, timeout=deadline_left(deadline, "ray-ps run")))
            t_end = time.time()
            cluster = session.describe()
        except ray.exceptions.GetTimeoutError:
            raise timed_out("ray-ps run") from None
        except ray.exceptions.RayError as exc:
            raise PeerFailed(f"ray-ps failed: {_cause(exc)}") from exc
        finally:
            kill_actors(ray, actors)
    record_run(prep, recorder, reports, t0, t_end, final, options.consistency)
    recorder.extra["ray"] = {"version": ray.__version__, "consistency": options.consistency, "servers": s,
                             "cluster": cluster, "shard_nodes": nodes[:s], "worker_nodes": nodes[s:]}
    return final


def _parts(refs: Any, n_shards: int) -> list:
    return [refs] if n_shards == 1 else list(refs)


def _asp(ray, shards: list, workers: list, weights: list, budgets: list[int], deadline: float) -> tuple[list, list]:
    """Ray's async loop: apply whichever gradient is ready first, hand that worker the new weights."""
    s = len(shards)
    version = 0
    pending: dict[Any, tuple[int, int, list]] = {}  # first gradient ref -> (worker, version it saw, refs)
    steps = [0] * len(workers)
    finishes: list = [None] * len(workers)

    def next_call(i: int, staleness: int | None, current: list) -> None:
        if steps[i] >= budgets[i]:
            finishes[i] = workers[i].finish.remote(staleness, *current)
            return
        parts = _parts(workers[i].step.options(num_returns=s).remote(staleness, *current), s)
        pending[parts[0]] = (i, version, parts)
        steps[i] += 1

    for i in range(len(workers)):
        next_call(i, None, weights)
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=deadline_left(deadline, "ray-ps run"))
        if not ready:
            raise timed_out("ray-ps run")
        i, based_on, parts = pending.pop(ready[0])
        weights = [shard.apply.remote(part) for shard, part in zip(shards, parts)]
        staleness, version = version - based_on, version + 1
        next_call(i, staleness, weights)
    return weights, finishes


def _bsp(ray, shards: list, workers: list, weights: list, budgets: list[int], deadline: float) -> tuple[list, list]:
    """Ray's sync loop: every active worker computes on the same weights, each shard averages the
    round's gradients. Rounds are chained by refs, at most IN_FLIGHT_ROUNDS ahead of the driver."""
    s = len(shards)
    finishes: list = [workers[i].finish.remote(None, *weights) if budgets[i] == 0 else None
                      for i in range(len(workers))]
    ahead: list = []
    staleness = None
    for r in range(max(budgets)):
        active = [i for i in range(len(workers)) if budgets[i] > r]
        parts = {i: _parts(workers[i].step.options(num_returns=s).remote(staleness, *weights), s) for i in active}
        weights = [shard.apply.remote(*[parts[i][j] for i in active]) for j, shard in enumerate(shards)]
        staleness = 0
        for i in active:
            if budgets[i] == r + 1:
                finishes[i] = workers[i].finish.remote(0, *weights)
        ahead.append(weights[0])
        if len(ahead) > IN_FLIGHT_ROUNDS:
            ready, _ = ray.wait([ahead.pop(0)], timeout=deadline_left(deadline, "ray-ps run"))
            if not ready:
                raise timed_out("ray-ps run")
    return weights, finishes


def _cause(exc: Exception) -> str:
    """The first line of the error a Ray task raised (a RayTaskError wraps it with its traceback)."""
    cause = getattr(exc, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}"
    return str(exc).strip().splitlines()[0]
