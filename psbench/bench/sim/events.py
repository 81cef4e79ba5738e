"""Discrete-event simulation of one run: every worker's steps under the run's device profile and
seeded stragglers (the same `Pacer` a measured run uses), and each system's communication from
costs measured from the records (bench/sim/costs.py). A simulated run takes the measured run's spec and
yields step rows in the records' schema (worker, step, t_wall, n_samples, staleness), so the
validation (bench/sim/check.py) measures both with the same warm-up rule.

Resources, each first come first served in event-time order (a heap of events; a resource's
`free_at` is when it takes its next job, so no queue object is needed):
- the cores (`CorePool`, C of them; C = 0: unlimited, a machine per worker): every real CPU burst
  (a worker's real compute, its message work, its update, a shard's update) takes one;
- a PS shard (one process: one update at a time) and its link (pushes in, replies out);
- a worker's link (its share of the model out, the parameters in).

Systems (what they pay per step beyond the device; symbols in `SystemCosts`):
- single: compute, update.
- ps family (ps, ray-ps, rpc-ps; BSP, ASP, SSP(s)): compute; the push (worker CPU, wire, shard
  CPU per update, one per shard with the shard's slice of the model); the reply (wire, worker
  CPU); the update. BSP: a shard answers a step's pushes once it has all N; SSP(s): a worker does
  not start step k + 1 until every worker has pushed step k - s; ASP never waits.
- allreduce family (ddp, horovod): a round starts the ring allreduce when the last worker's
  gradients are ready (the pacing contract: a single bucket, after the whole backward), lasting
  the measured alpha x 2(N - 1) + beta x 2(N - 1)/N x M, plus, where N ranks share C < N cores
  (validation here only), a measured wait per ring step for a descheduled neighbour; then every
  worker's update.
- Spark's round systems (spark-mllib: a job per mini-batch; spark-barrier: one barrier job, an
  allGather a step; spark-torch: DDP inside Spark tasks): a round as for allreduce whose cost is
  job_s + per_worker_s x (N - 1), measured here, plus the wire of a projection's links: a
  treeAggregate of depth 2 (2 ceil(sqrt N) M / B), an allGather (N M / B) or a ring (2 (N - 1)/N M / B).
- switch: the sync phase (ddp or ps-bsp), a hand-over, then the async phase on the PS, at the
  measured run's switch time (a loss criterion cannot be simulated; a fixed fraction can).
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from psbench.core.emulation import Pacer, parse_device, parse_stragglers
from psbench.core.errors import ConfigError
from psbench.systems import names_where

PS_FAMILY = names_where(family="ps")
ALLREDUCE_FAMILY = names_where(family="allreduce")
SPARK_ROUNDS = names_where(family="spark")  # Spark's Python paths; its JVM trainer ("spark-jvm") is not modelled
SIMULATED = (*names_where(family="single"), *PS_FAMILY, *ALLREDUCE_FAMILY, *SPARK_ROUNDS, *names_where(family="switch"))
INF = math.inf


@dataclass(frozen=True)
class SystemCosts:
    """One system's costs on one workload (seconds, bytes); each from a measurement
    (bench/sim/costs.py says which)."""
    compute_cpu_s: float                # real compute of one step (forward + backward), one core
    update_cpu_s: float = 0.0           # the optimizer step, or loading the parameters a PS answers with
    comm_fixed_s: float = 0.0           # PS: a 1-worker push + reply on loopback, all of it; allreduce: per step at N = 1
    worker_cpu_s: float = 0.0           # PS: the worker's CPU in that round trip (encode + decode)
    server_cpu_s: float = 0.0           # PS: a shard's CPU per update (its part of the round trip)
    allreduce_alpha_s: float = 0.0      # ring allreduce: per ring step (2 (N - 1) of them)
    allreduce_beta_s_per_byte: float = 0.0  # ring allreduce: per byte of the 2 (N - 1)/N x M each rank moves
    allreduce_crowded_s: float = 0.0    # ring allreduce, this machine only: more per ring step with more ranks than cores
    job_s: float = 0.0                  # spark: a step's cost beyond the device at 1 worker (job, tasks, gather)
    per_worker_s: float = 0.0           # spark: its growth per further worker (the driver's serial part)
    handover_s: float = 0.0             # switch: sync phase to async phase
    model_bytes: int = 0                # M (float32 parameters)


@dataclass(frozen=True)
class Network:
    """Links beyond what `comm_fixed_s` already holds: the loopback of this machine is inside the
    measured round trip (bandwidth inf, latency 0); a projection adds a cluster's links.
    A link is one first-come-first-served queue for both directions, and a message is stored and
    forwarded at each link it crosses (the sender's, then the receiver's). Checked against tc-capped
    namespace runs (psbench netlab bench, 4 workers, 100 and 1000 Mbit/s), samples/s: ring allreduce
    +3 to +11%, PS BSP -6 to -10%, PS ASP -32 to -37% (its steps 47-57% too long). Real links are
    full duplex and TCP shares them fairly among flows: tried as full-duplex FIFO queues with
    cut-through messages, PS BSP came out 38-50% and ASP 28-37% too fast (a round's replies then
    leave one after another and the first workers' next pushes overlap the rest, where TCP ends the
    replies together), so the sharing discipline, not the duplex alone, is the missing piece."""
    bandwidth_Bps: float = INF          # per link
    latency_s: float = 0.0              # one way


@dataclass(frozen=True)
class SimSpec:
    """A run to simulate: what a RunSpec says, in the simulation's terms."""
    system: str
    workload: str
    workers: int
    batch_size: int
    seed: int = 0
    consistency: str = "bsp"            # ps family: bsp | asp | ssp; switch: its async phase
    staleness: int = 0                  # SSP bound
    servers: int = 1
    emulate_device: str | None = None
    stragglers: str | None = None
    max_steps: int | None = None        # per worker
    budget_s: float | None = None       # on the training clock, all workers
    sync: str = "ddp"                   # switch: ddp | ps-bsp
    switch_at_s: float | None = None    # switch: when the sync phase ends (training clock)
    cores: float = 0                    # shared cores (0: a machine per worker)
    samples_per_step: float | None = None  # a measured run's mean (an epoch's last batch is short); None: batch_size

    def __post_init__(self) -> None:
        if self.system not in SIMULATED:
            raise ConfigError(f"simulate: no model of system '{self.system}'; simulated: {', '.join(SIMULATED)}")
        if self.consistency not in ("bsp", "asp", "ssp"):
            raise ConfigError(f"simulate: consistency must be bsp, asp or ssp, got '{self.consistency}'")
        if self.workers < 1 or self.batch_size < 1 or self.servers < 1 or self.staleness < 0:
            raise ConfigError("simulate: workers, batch_size and servers must be >= 1, staleness >= 0")
        if self.max_steps is None and self.budget_s is None:
            raise ConfigError("simulate: give max_steps or budget_s (a run must end)")
        if self.system == "switch" and self.switch_at_s is None:
            raise ConfigError("simulate: a switch run needs switch_at_s (the sync phase's end)")


@dataclass
class SimRun:
    spec: SimSpec
    steps: list[dict] = field(default_factory=list)   # worker, step, t_wall (step end), n_samples, staleness, phase
    events: int = 0


class CorePool:
    """C cores, each job on the one free first (C = 0: as many as asked, nothing waits)."""

    def __init__(self, cores: float):
        self.free = [0.0] * max(0, int(round(cores)))

    def run(self, t: float, cpu_s: float) -> float:
        """When a burst of cpu_s asked for at t ends."""
        if not self.free or cpu_s <= 0:
            return t + max(cpu_s, 0.0)
        start = max(t, heapq.heappop(self.free))
        heapq.heappush(self.free, start + cpu_s)
        return start + cpu_s


class Fifo:
    """One server (a shard's process, a link): jobs in arrival order."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def run(self, t: float, s: float) -> float:
        start = max(t, self.free_at)
        self.free_at = start + s
        return self.free_at


class Loop:
    """The event loop: callbacks at times, in time order (ties in scheduling order)."""

    def __init__(self, horizon: float):
        self.queue: list[tuple[float, int, Callable[[float], None]]] = []
        self.count = itertools.count()
        self.horizon = horizon
        self.handled = 0

    def at(self, t: float, fn: Callable[[float], None]) -> None:
        heapq.heappush(self.queue, (t, next(self.count), fn))

    def run(self) -> None:
        while self.queue:
            t, _, fn = heapq.heappop(self.queue)
            if t > self.horizon:
                break
            self.handled += 1
            fn(t)


class _Sim:
    """State shared by a run's workers; the system-specific parts are methods below."""

    def __init__(self, spec: SimSpec, costs: SystemCosts, net: Network, sync_costs: SystemCosts | None):
        self.spec, self.costs, self.net = spec, costs, net
        self.sync_costs = sync_costs or costs
        self.device = parse_device(spec.emulate_device)
        self.stragglers = parse_stragglers(spec.stragglers)
        n = spec.workers
        self.pacers = [Pacer(self.device, self.stragglers, spec.workload, w, n, spec.seed) for w in range(n)]
        self.loop = Loop(spec.budget_s if spec.budget_s is not None else INF)
        self.cores = CorePool(spec.cores)
        self.shards = [Fifo() for _ in range(spec.servers)]
        self.shard_links = [Fifo() for _ in range(spec.servers)]
        self.worker_links = [Fifo() for _ in range(n)]
        self.run = SimRun(spec)
        self.done = [0] * n                       # steps each worker finished
        self.pushed = [0] * n                     # pushes each worker's shards applied (PS clock)
        self.applied = 0                          # updates the (first) shard applied
        self.pulled_at = [0] * n                  # `applied` when the worker last got parameters
        self.bsp_arrived: dict[int, list[tuple[int, float]]] = {}
        self.ssp_waiting: list[tuple[int, float]] = []
        self.phase = "sync" if spec.system == "switch" else ""
        self.stopped = [False] * n
        self.samples = spec.samples_per_step or spec.batch_size
        self.started = [0.0] * n                  # the current step's start, and its gradients' ready time
        self.ready = [0.0] * n
        self.last_end = [0.0] * n                 # the previous step's end (an SSP wait lies between)
        self._replies: dict[tuple, int] = {}      # a step's replies in, of the S shards'
        self._at_switch: list[float] = []         # ps-bsp sync phase: when each worker reached the switch

    # -- shared pieces ---------------------------------------------------------------------
    def finished(self, w: int) -> bool:
        return self.spec.max_steps is not None and self.done[w] >= self.spec.max_steps

    def compute(self, w: int, t: float, costs: SystemCosts) -> float:
        """When worker w's gradients for its next step are ready, starting at t."""
        real_end = self.cores.run(t, costs.compute_cpu_s)
        ready = t + self.pacers[w].due_s(self.done[w], self.spec.batch_size, 1.0, real_end - t)
        self.started[w], self.ready[w] = t, ready
        return ready

    def record(self, w: int, t: float, staleness: int | None = None) -> None:
        """A step ends: its row, with the device part (start to gradients ready) and the rest."""
        self.run.steps.append({"worker": w, "step": self.done[w], "t_wall": t, "n_samples": self.samples,
                               "staleness": staleness, "phase": self.phase,
                               "device_s": self.ready[w] - self.started[w],
                               "system_s": t - self.last_end[w] - (self.ready[w] - self.started[w])})
        self.done[w] += 1
        self.last_end[w] = t

    def wire(self, link: Fifo, t: float, nbytes: float) -> float:
        """A message through a link: serialised on it, then the latency."""
        if self.net.bandwidth_Bps == INF:
            return t + self.net.latency_s
        return link.run(t, nbytes / self.net.bandwidth_Bps) + self.net.latency_s

    # -- ps family ---------------------------------------------------------------------------
    def ps_mode(self) -> str:
        if self.spec.system == "switch":
            return "bsp" if self.phase == "sync" else self.spec.consistency
        return self.spec.consistency if not (self.spec.consistency == "ssp" and self.spec.staleness == 0) else "bsp"

    def ps_costs(self) -> SystemCosts:
        return self.sync_costs if self.spec.system == "switch" and self.phase == "sync" else self.costs

    def ps_start(self, w: int, t: float) -> None:
        if self.finished(w) or self.stopped[w]:
            return
        if self.spec.system == "switch" and self.phase == "sync" and t >= self.spec.switch_at_s:
            return self.switch_arrive(w, t)
        if self.ps_mode() == "ssp" and self.done[w] - min(self.pushed) > self.spec.staleness:
            self.ssp_waiting.append((w, t))   # resumed when the slowest pushes
            return
        c = self.ps_costs()
        ready = self.compute(w, t, c)
        self.loop.at(ready, lambda now, w=w: self.ps_push(w, now))

    def ps_push(self, w: int, t: float) -> None:
        c, s = self.ps_costs(), self.spec.servers
        staleness = self.applied - self.pulled_at[w]
        encoded = self.cores.run(t, c.worker_cpu_s / 2)
        sent = self.wire(self.worker_links[w], encoded, c.model_bytes)  # the whole gradient leaves its link
        # the rest of the 1-worker round trip (kernel, loopback, queues): half each way
        rest = max(0.0, c.comm_fixed_s - c.worker_cpu_s - c.server_cpu_s)
        for j in range(s):
            arrive = self.wire(self.shard_links[j], sent, c.model_bytes / s) + rest / 2
            self.loop.at(arrive, lambda now, w=w, j=j, st=staleness: self.ps_apply(w, j, now, st))

    def ps_apply(self, w: int, j: int, t: float, staleness: int) -> None:
        n = self.spec.workers
        end = self.shards[j].run(t, 0.0)  # the shard's process: its turn ...
        end = self.cores.run(end, self.ps_costs().server_cpu_s)  # ... on a core
        self.shards[j].free_at = end
        if self.ps_mode() != "bsp":
            self.applied += j == 0
            self.loop.at(end, lambda now, w=w, j=j, st=staleness: self.ps_reply(w, j, now, st))
            return
        step = self.done[w]
        arrived = self.bsp_arrived.setdefault(step * self.spec.servers + j, [])
        arrived.append((w, staleness))
        active = n - sum(self.stopped)  # every worker has the same steps to do under BSP
        if len(arrived) >= active:
            self.applied += j == 0  # BSP: one update a round (the pushes summed)
            for v, st in arrived:
                self.loop.at(end, lambda now, v=v, j=j, st=st: self.ps_reply(v, j, now, st))
            del self.bsp_arrived[step * self.spec.servers + j]

    def ps_reply(self, w: int, j: int, t: float, staleness: int) -> None:
        c, s = self.ps_costs(), self.spec.servers
        rest = max(0.0, c.comm_fixed_s - c.worker_cpu_s - c.server_cpu_s)
        back = self.wire(self.shard_links[j], t, c.model_bytes / s) + rest / 2
        arrive = self.wire(self.worker_links[w], back, c.model_bytes / s)
        self.loop.at(arrive, lambda now, w=w, st=staleness: self.ps_got(w, now, st))

    def ps_got(self, w: int, t: float, staleness: int) -> None:
        key = ("got", w, self.done[w])
        self._replies[key] = self._replies.get(key, 0) + 1
        if self._replies[key] < self.spec.servers:
            return
        del self._replies[key]
        c = self.ps_costs()
        end = self.cores.run(t, c.worker_cpu_s / 2 + c.update_cpu_s)
        self.pulled_at[w] = self.applied
        self.record(w, end, staleness)
        self.pushed[w] += 1
        if self.ssp_waiting:
            waiting, self.ssp_waiting = self.ssp_waiting, []
            for v, _ in waiting:
                self.loop.at(end, lambda now, v=v: self.ps_start(v, now))
        self.loop.at(end, lambda now, w=w: self.ps_start(w, now))

    # -- allreduce family and spark ------------------------------------------------------
    def round_start(self, t: float) -> None:
        n = self.spec.workers
        if any(self.finished(w) for w in range(n)):
            return
        if self.spec.system == "switch" and t >= self.spec.switch_at_s:
            return self.handover(t)
        c = self.sync_costs
        ready = max(self.compute(w, t, c) for w in range(n))
        comm = 0.0 if self.spec.system == "single" else c.comm_fixed_s + self.round_wire(c)
        end = max(self.cores.run(ready + comm, c.update_cpu_s) for _ in range(n))
        for w in range(n):
            self.record(w, end)
        self.loop.at(end, self.round_start)

    def round_wire(self, c: SystemCosts) -> float:
        """A round's communication beyond comm_fixed_s: measured terms plus the links' (bandwidth, latency)."""
        n, m, system = self.spec.workers, c.model_bytes, self.spec.system
        per_byte = 1 / self.net.bandwidth_Bps if self.net.bandwidth_Bps < INF else 0.0
        if system in SPARK_ROUNDS:
            spread = {"spark-mllib": 2 * math.ceil(math.sqrt(n)) * m, "spark-barrier": n * m,
                      "spark-torch": 2 * (n - 1) / n * m}[system] if n > 1 else 0.0
            return c.job_s + c.per_worker_s * (n - 1) + spread * per_byte + 2 * self.net.latency_s
        if n == 1:
            return 0.0
        moved = 2 * (n - 1) / n * m
        per_step = c.allreduce_alpha_s + (c.allreduce_crowded_s if self.crowded(n) else 0.0)
        return 2 * (n - 1) * (per_step + self.net.latency_s) + moved * (c.allreduce_beta_s_per_byte + per_byte)

    def crowded(self, ranks: int) -> bool:
        """More ranks than cores: a ring step waits for a descheduled neighbour to be woken."""
        return bool(self.spec.cores) and ranks > self.spec.cores

    # -- switch ---------------------------------------------------------------------------
    def switch_arrive(self, w: int, t: float) -> None:
        """ps-bsp sync phase: a worker at the switch point waits for the others, then the hand-over."""
        self.stopped[w] = True
        self._at_switch.append(t)
        if len(self._at_switch) == sum(1 for v in range(self.spec.workers) if not self.finished(v)):
            self.handover(max(self._at_switch))

    def handover(self, t: float) -> None:
        self.phase = "async"
        self.stopped = [False] * self.spec.workers
        self.pulled_at = [self.applied] * self.spec.workers
        self.pushed = list(self.done)
        go = t + self.costs.handover_s
        for w in range(self.spec.workers):
            self.loop.at(go, lambda now, w=w: self.ps_start(w, now))

    # -- run ---------------------------------------------------------------------------------
    def simulate(self) -> SimRun:
        system = self.spec.system
        sync_is_round = system in ALLREDUCE_FAMILY or system in ("single", *SPARK_ROUNDS) or (
            system == "switch" and self.spec.sync == "ddp")
        if system == "single" and self.spec.workers != 1:
            raise ConfigError("simulate: single runs one worker")
        if sync_is_round:
            self.loop.at(0.0, self.round_start)
        else:
            for w in range(self.spec.workers):
                self.loop.at(0.0, lambda now, w=w: self.ps_start(w, now))
        self.loop.run()
        self.run.events = self.loop.handled
        if self.spec.budget_s is not None:
            self.run.steps = [r for r in self.run.steps if r["t_wall"] <= self.spec.budget_s]
        return self.run


def simulate_run(spec: SimSpec, costs: SystemCosts, net: Network = Network(),
                 sync_costs: SystemCosts | None = None) -> SimRun:
    """One simulated run. `costs`: the system's (a switch: its async PS phase's); `sync_costs`: a
    switch's sync phase (ddp's or the PS's), else unused."""
    if spec.system == "switch" and sync_costs is None:
        raise ConfigError("simulate: a switch run needs its sync phase's costs")
    return _Sim(spec, costs, net, sync_costs).simulate()
