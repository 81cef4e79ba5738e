"""The `ps` system: our parameter server (S shards, N workers, BSP/ASP/SSP, staleness mitigations).

Evaluation placement: worker 0 keeps a copy of the parameters it received every eval_every of its
steps (a memcpy, no pause); after training the launcher evaluates those snapshots off the clock,
each stamped with the t_wall at which worker 0 received it, plus the servers' final parameters.
So evaluation never slows the workers, and under ASP it measures the model the PS really served.

Row transport: each worker keeps its step rows as columns in memory and sends them once, at the
end, in its `worker_done` control message (msgpack; no pickle, nothing per step).
"""
from __future__ import annotations

import dataclasses
import json
import math
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from psbench.core.accelerator import CPU, CUDA
from psbench.core.cpu import FORKED, WORKERS, Proc
from psbench.core.exposure import read_token
from psbench.core.records import Recorder, split_sync_wait
from psbench.core.spec import RunSpec
from psbench.systems.base import System, option
from psbench.systems.common import (Prepared, configure_threads, evaluate_snapshots, evaluate_splits, flat_buffers,
                                    flat_params, prepare, record_evals, set_flat_buffers, set_flat_params, split_flat)
from psbench.systems.ps.alone import time_push_pull_alone
from psbench.systems.ps.curve import wanted as curve_wanted
from psbench.systems.ps.launch import Cluster, Faults
from psbench.systems.ps.partition import partition_keys
from psbench.systems.ps.policies import parse_consistency, parse_mitigation, parse_warmup, resolve_step
from psbench.systems.ps.server import NONFINITE_MODES
from psbench.systems.ps.worker import ADMIN, KVWorker
from psbench.core.errors import ConfigError


@dataclass(frozen=True)
class PSOptions:
    consistency: str = option("asp", "bsp | asp | ssp:S (a worker at most S steps ahead of the slowest)")
    servers: int = option(1, "number of server shards (keys split by size across them)")
    mitigation: str = option("none", "none | staleness-lr | dc-asgd:LAMBDA | gap-aware")
    lr_scaling: str = option("auto", "the async step takes ONE reduction so its step per sample matches the sync "
                                     "one: auto (with momentum auto: lr kept, momentum 1 - (1 - m) N where >= 0, "
                                     "else lr / N) | 1/n (lr / N, momentum kept) | none | a factor (momentum auto "
                                     "then matches it)")
    momentum_scaling: str = option("auto", "auto (completes the one reduction the lr leaves; bsp: m) | scaled "
                                           "(1 - (1 - m) N, lr kept) | none (m) | a momentum; lr and momentum both "
                                           "set are taken as asked, the step ratio recorded")
    warmup: str = option("none", "the async step's ramp from the first update (a switch's hand-over): none | "
                                 "lr:from=F,updates=U (lr from F x its matched value) | momentum:from=M,updates=U")
    pipeline: bool = option(False, "asp only: each worker overlaps its push's round trip with the next "
                                   "step's compute (ps-lite's async push; staleness >= 1)")
    nonfinite: str = option("reject", "a push whose gradient holds NaN or inf: reject (an error reply naming "
                                      "the key; the worker fails) | skip (answered, not applied; counted)")
    host: str = option("127.0.0.1", "address the server shards bind")
    token_file: str | None = option(None, "a file (readable by its owner only) whose first line is the shared token "
                                          "checked on every message (default: env PSBENCH_PS_TOKEN, else a random "
                                          "one per run)")
    step_timeout_s: float = option(60.0, "how long BSP/SSP waits for slow workers before failing the step")
    worker_timeout_s: float = option(30.0, "ssp: a worker silent this long is taken as dead and not waited for")
    retry_s: float = option(5.0, "a worker resends a request unanswered this long (a restarted shard lost it)")
    checkpoint_dir: str | None = option(None, "write shard checkpoints here; a killed shard is restarted from them")
    checkpoint_every: str = option("100", "checkpoint interval: shard updates (e.g. 100) or seconds (e.g. 5s)")
    tolerate_worker_loss: bool = option(False, "asp/ssp, for fault experiments: a worker that dies is recorded "
                                               "(summary lost_workers) and the run goes on without it; off, a "
                                               "lost worker fails the run")
    kill_worker_at: str | None = option(None, "fault injection: WORKER:STEP, SIGKILL that worker at that step")
    kill_server_at: str | None = option(None, "fault injection: SHARD:VERSION or SHARD:SECONDSs, SIGKILL that "
                                              "shard then (checkpoints on, in a temp dir if none given)")

    def __post_init__(self) -> None:
        parse_consistency(self.consistency)
        parse_mitigation(self.mitigation)
        resolve_step(self.lr_scaling, self.momentum_scaling, self.consistency, 1, 0.9)  # the words, early
        parse_warmup(self.warmup)
        if self.servers < 1:
            raise ConfigError(f"servers must be >= 1, got {self.servers}")
        if self.nonfinite not in NONFINITE_MODES:
            raise ConfigError(f"nonfinite '{self.nonfinite}' unknown; allowed: {' | '.join(NONFINITE_MODES)}")
        if self.pipeline and parse_consistency(self.consistency)[0] != "asp":
            raise ConfigError(f"pipeline needs consistency asp, got {self.consistency!r}: under bsp/ssp a worker "
                              f"must wait for its reply")
        if self.tolerate_worker_loss and parse_consistency(self.consistency)[0] == "bsp":
            raise ConfigError("tolerate_worker_loss needs consistency asp or ssp:S: under bsp every step needs "
                              "every worker")
        if not self.step_timeout_s > 0:
            raise ConfigError(f"step_timeout_s must be > 0, got {self.step_timeout_s}")
        if not _loopback(self.host):
            raise ConfigError(f"host '{self.host}' is not allowed: bind a 127.0.0.0/8 address (e.g. 127.0.0.1) "
                              f"or, inside a test network namespace, a 198.18.0.0/15 one")
        read_token(self.token_file)  # a missing, empty or shared file is a ConfigError before any run
        if not (self.worker_timeout_s > 0 and self.retry_s > 0):
            raise ConfigError(f"worker_timeout_s and retry_s must be > 0, got {self.worker_timeout_s}, {self.retry_s}")
        from psbench.systems.ps.checkpoint import parse_interval

        parse_interval(self.checkpoint_every)
        self.faults(None)  # the syntax now; the worker index once the worker count is known

    def faults(self, n_workers: int | None) -> Faults:
        """The launcher's fault handling and injections for a phase with n_workers."""
        kill_worker = kill_server = None
        if self.kill_worker_at is not None:
            parts = str(self.kill_worker_at).split(":")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise ConfigError(f"kill_worker_at '{self.kill_worker_at}' must be WORKER:STEP, e.g. 1:20")
            kill_worker = (int(parts[0]), int(parts[1]))
            if n_workers is not None and kill_worker[0] >= n_workers:
                raise ConfigError(f"kill_worker_at: worker {kill_worker[0]} does not exist ({n_workers} workers)")
        if self.kill_server_at is not None:
            shard, sep, when = str(self.kill_server_at).partition(":")
            try:
                if not (sep and shard.strip().isdigit()):
                    raise ValueError
                seconds = float(when[:-1]) if when.endswith("s") else None
                version = None if seconds is not None else int(when)
                if (seconds is not None and not seconds > 0) or (version is not None and version < 1):
                    raise ValueError
            except ValueError:
                raise ConfigError(f"kill_server_at '{self.kill_server_at}' must be SHARD:VERSION (e.g. 0:150) "
                                  f"or SHARD:SECONDSs (e.g. 0:2.5s)") from None
            kill_server = (int(shard), version, seconds)
            if kill_server[0] >= self.servers:
                raise ConfigError(f"kill_server_at: shard {kill_server[0]} does not exist ({self.servers} servers)")
        return Faults(tolerate_worker_loss=self.tolerate_worker_loss, checkpoint_dir=self.checkpoint_dir,
                      kill_worker=kill_worker, kill_server=kill_server)


def _loopback(host: str) -> bool:
    """Loopback, or the benchmark range used inside network namespaces we create."""
    import ipaddress

    from psbench.core.exposure import is_loopback

    try:
        return is_loopback(host) or ipaddress.ip_address(host) in ipaddress.ip_network("198.18.0.0/15")
    except ValueError:
        return False


@dataclass
class PhaseResult:
    """What a PS phase leaves behind, enough for a later phase to continue from it."""
    params: np.ndarray                 # final flat weights (the servers' state)
    momentum: np.ndarray | None        # final flat momentum buffers (None without momentum)
    steps: dict[int, int]              # worker -> last step index + 1
    server_stats: list[dict[str, Any]] = field(default_factory=list)
    buffers: np.ndarray | None = None  # worker 0's final BatchNorm statistics (for a later phase)
    stopped: bool = False              # every worker stopped on the shared step stop (stop_criterion fired)


def check_timer_model(spec: RunSpec, workload: Any) -> None:
    """The timer evaluator reads the servers' parameters; they hold no BatchNorm running statistics
    (each worker keeps its own), so a model with them cannot be evaluated from the servers alone."""
    if spec.eval_every_s is not None:
        from psbench.systems.common import float_buffers

        if float_buffers(workload.build_model(workload.load_data(data_dir=spec.data_dir), spec.seed)):
            raise ConfigError(f"--eval-every-s on the PS: {spec.workload}'s model has BatchNorm statistics the "
                              f"servers do not hold; use --evals-per-epoch (worker 0's snapshots) for it")


class ServerSnapshots:
    """The timer evaluator of a PS run: a thread of the launcher reads the servers' parameters (an
    admin client's `state`) every `every_s` seconds of the training clock, on the grid k x every_s
    the run's other phases use too; they are evaluated after the run, off the clock. The step a
    snapshot carries: the servers' updates since the phase began, per worker (asp/ssp: / N)."""

    def __init__(self, addresses: list[str], shapes: list[tuple[int, ...]], token: str | None, every_s: float,
                 recorder: Recorder, t_start: float, start_step: int, updates_per_step: int):
        import threading

        self.client = KVWorker(addresses, ADMIN, shapes, token)
        self.every_s, self.recorder, self.start_step, self.per_step = every_s, recorder, start_step, updates_per_step
        self.next_t = (math.floor(t_start / every_s) + 1) * every_s
        self.base_version: int | None = None
        self.snapshots: list[tuple[int, float, np.ndarray]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="psbench-timer-evaluator", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self.next_t - self.recorder.now())):
            try:
                tensors, version = self.client.state_at("params")
            except Exception:  # noqa: BLE001 - a shard gone mid-run: the run's own handling reports it
                return
            t_wall = self.recorder.now()
            if self.base_version is None:
                self.base_version = version
            step = self.start_step + (version - self.base_version) // self.per_step
            self.snapshots.append((step, t_wall, np.concatenate([a.reshape(-1) for a in tensors])))
            self.next_t = (math.floor(t_wall / self.every_s) + 1) * self.every_s

    def stop(self) -> list[tuple[int, float, np.ndarray]]:
        self._stop.set()
        self._thread.join(timeout=30)
        self.client.close()
        return self.snapshots


class PSPhase:
    """The processes of one PS phase, started (`with PSPhase(...) as phase:`: servers listening,
    workers loaded, waiting), then trained from a given state (`phase.run(...)`). A switch starts
    its async phase this way before its sync phase trains (a warm standby, as a hybrid system keeps
    both runtimes up): the hand-over then moves only the state, the start step and the BatchNorm
    statistics (with the workers' go), and the processes' start-up is launch cost."""

    def __init__(self, prep: Prepared, options: PSOptions, fail_worker_at: tuple[int, int] | None = None,
                 stop_criterion: str | None = None):
        """`stop_criterion` (bsp): a switch criterion (systems/switch/criteria.py) every worker
        evaluates on the step's shared report (mean training loss, clock), all stopping at one step."""
        self.prep, self.options = prep, options
        spec, n = prep.spec, prep.spec.workers
        self.shapes = [tuple(p.shape) for p in prep.build_model().parameters()]
        partition_keys([math.prod(s) for s in self.shapes], options.servers)  # ConfigError before any process
        opt = prep.workload.optimizer
        self.step_rule = resolve_step(options.lr_scaling, options.momentum_scaling, options.consistency, n,
                                      opt.momentum)
        self.lr, self.server_momentum = prep.lr * self.step_rule.lr_factor, self.step_rule.momentum
        # Neither is recorded: the manifest has the token file's name at most.
        self.token = read_token(options.token_file) or secrets.token_hex(16)
        self.server_args = ["--consistency", options.consistency, "--mitigation", options.mitigation,
                            "--lr", repr(self.lr), "--momentum", repr(self.server_momentum),
                            "--weight-decay", repr(opt.weight_decay), "--step-timeout-s", repr(options.step_timeout_s),
                            "--nonfinite", options.nonfinite, "--checkpoint-every", options.checkpoint_every,
                            "--warmup", options.warmup]
        if parse_consistency(options.consistency)[0] == "ssp":
            self.server_args += ["--worker-timeout-s", repr(options.worker_timeout_s)]
        # the start step and the BatchNorm statistics come with the go (run's arguments)
        self.worker_args = ["--spec-json", json.dumps(spec.to_dict()), "--timeout-s",
                            repr(options.step_timeout_s + 60), "--retry-s", repr(options.retry_s)]
        if options.pipeline:
            self.worker_args.append("--pipeline")
        if stop_criterion is not None:
            if parse_consistency(options.consistency)[0] != "bsp":
                raise ConfigError(f"a shared stop criterion needs consistency bsp (a step every worker passes), "
                                  f"got {options.consistency!r}")
            self.worker_args += ["--stop-criterion", stop_criterion]
        self.extra = {0: ["--snapshots"]} if not spec.eval_every_s else {}  # worker 0's, or ServerSnapshots
        if fail_worker_at is not None:
            self.extra.setdefault(fail_worker_at[0], []).extend(["--fail-at-step", str(fail_worker_at[1])])
        self.faults = options.faults(n)
        if self.faults.kill_worker is not None:
            self.extra.setdefault(self.faults.kill_worker[0], []).extend(
                ["--halt-at-step", str(self.faults.kill_worker[1])])
        self.scratch = None
        if self.faults.kill_server is not None and self.faults.checkpoint_dir is None:
            self.scratch = tempfile.TemporaryDirectory(prefix="psbench-ckpt-")
            self.faults = dataclasses.replace(self.faults, checkpoint_dir=self.scratch.name)
        self.cluster = Cluster(options.servers, n, self.token, options.host, faults=self.faults,
                               consistency=options.consistency)
        self.admin: KVWorker | None = None
        self.addresses: list[str] = []

    def __enter__(self) -> "PSPhase":
        try:
            self.cluster.__enter__()
            self.addresses = self.cluster.start_servers(self.server_args)
            self.admin = KVWorker(self.addresses, ADMIN, self.shapes, self.token).__enter__()
            self.cluster.start_workers(self.worker_args, self.addresses, self.extra)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.admin is not None:
            self.admin.close()
        self.cluster.__exit__(*exc)
        if self.scratch is not None:
            self.scratch.cleanup()

    def run(self, recorder: Recorder, init_params: np.ndarray | None = None,
            init_momentum: np.ndarray | None = None, start_step: int = 0, init_buffers: np.ndarray | None = None,
            before_go: Callable[[KVWorker], None] | None = None, start_t_wall: float | None = None,
            evaluate_start: bool = True) -> PhaseResult:
        """Train from `init_params` (default: the seeded model) and optimizer state `init_momentum`,
        workers continuing at `start_step` with BatchNorm running statistics `init_buffers`
        (default: the seeded model's). Records step rows and evaluations into `recorder`; starts
        its clock if not running, leaves it running. `before_go(admin)` runs once the shards hold
        their initial state, just before the workers are released (a switch checks the hand-off)."""
        prep, options, cluster, admin, shapes = self.prep, self.options, self.cluster, self.admin, self.shapes
        spec, n = prep.spec, prep.spec.workers
        assert admin is not None, "PSPhase.run outside its `with`"
        model = prep.build_model()
        loss_fn = prep.workload.loss_fn()
        flat0 = flat_params(model) if init_params is None else np.asarray(init_params, dtype=np.float32)
        admin.init(split_flat(flat0, shapes), step=start_step)
        if init_momentum is not None and self.server_momentum:
            admin.init(split_flat(np.asarray(init_momentum, np.float32), shapes), slot="momentum")
        if before_go is not None:
            before_go(admin)
        if recorder.t0 is None:
            recorder.start_clock()
        t_start = recorder.now()
        go_t0 = time.time() - t_start
        timer = (ServerSnapshots(self.addresses, shapes, self.token, spec.eval_every_s, recorder, t_start, start_step,
                                 1 if parse_consistency(options.consistency)[0] == "bsp" else n)
                 if spec.eval_every_s else None)
        buffers = np.asarray(init_buffers if init_buffers is not None else np.zeros(0), np.float32)
        cluster.go(go_t0, start_step, buffers)
        try:
            reports = cluster.collect()
        finally:
            snapshots = timer.stop() if timer is not None else []
        t_end = recorder.now()
        with recorder.paused():
            final = np.concatenate([a.reshape(-1) for a in admin.state("params")])
            momentum = (np.concatenate([a.reshape(-1) for a in admin.state("momentum")])
                        if self.server_momentum else None)
            stats = admin.stats()
            admin.shutdown()
            cluster.wait_workers()
            cluster.wait_servers()
        for e in cluster.events:  # worker_lost, server_lost, server_restarted, *_killed (injected)
            recorder.event(e["kind"], step=e["step"], worker=e["worker"], t_wall=e["t"] - go_t0, **e["detail"])
        with recorder.paused():
            steps: dict[int, int] = {}
            rows = []
            for w, rep in sorted(reports.items()):
                cols = rep.rows
                rows += [{"worker": w, **dict(zip(cols, values))} for values in zip(*(cols[c] for c in cols))]
                steps[w] = (cols["step"][-1] + 1) if cols["step"] else start_step
            if parse_consistency(options.consistency)[0] != "asp":
                split_sync_wait(rows)  # bsp/ssp: a blocked push+pull is mostly waiting for the others
            recorder.add_steps(rows)
            if len(buffers):
                set_flat_buffers(model, buffers)
            buffers0 = flat_buffers(model)
            # The starting weights are evaluated as of when they existed (a switch: its sync phase's end),
            # unless the phase before has evaluated these very weights (a switch's timer).
            evals = ([(start_step, t_start if start_t_wall is None else start_t_wall,
                       np.concatenate([flat0, buffers0]))] if evaluate_start else [])
            rep0 = reports.get(0)
            if timer is not None:  # the servers' parameters on the timer's schedule (no BatchNorm: check_spec)
                evals += [(step, t_wall, np.concatenate([flat, buffers0])) for step, t_wall, flat in snapshots]
            elif rep0 is not None:
                evals += list(zip(rep0.snapshot_steps, rep0.snapshot_t, rep0.snapshots))
            final_buffers = rep0.final_buffers if rep0 is not None and not rep0.lost else buffers0
            evals.append((steps.get(0, start_step), t_end, np.concatenate([final, final_buffers])))
            evaluate_snapshots(recorder, model, loss_fn, prep.data, evals)
        ps_extra = recorder.extra.setdefault("ps", {"phases": []})
        ps_extra["phases"].append({"consistency": options.consistency, "servers": options.servers,
                                   "mitigation": options.mitigation, "lr_applied": self.lr,
                                   "momentum_applied": self.server_momentum, "async_step": self.step_rule.describe(),
                                   "warmup": parse_warmup(options.warmup).describe(), "start_step": start_step,
                                   # CURVE costs time beyond loopback (x3-4 a 1-10 MiB round trip here):
                                   # a run across hosts says whether its wire was encrypted
                                   "wire": "curve" if curve_wanted(options.host, self.token) else "plain",
                                   "shards": stats,
                                   "faults": {"lost_workers": {str(w): how for w, how in cluster.lost_workers.items()},
                                              "server_restarts": cluster.restarts,
                                              "lost_updates": sum(r["lost_updates"] or 0 for r in cluster.restarts)}})
        stopped = bool(reports) and all(rep.stopped_at is not None for rep in reports.values())
        return PhaseResult(final, momentum, steps, stats, final_buffers, stopped)


def run_ps_phase(prep: Prepared, options: PSOptions, recorder: Recorder, init_params: np.ndarray | None = None,
                 init_momentum: np.ndarray | None = None, start_step: int = 0,
                 fail_worker_at: tuple[int, int] | None = None, init_buffers: np.ndarray | None = None,
                 before_go: Callable[[KVWorker], None] | None = None,
                 start_t_wall: float | None = None, evaluate_start: bool = True,
                 stop_criterion: str | None = None) -> PhaseResult:
    """Start a PS phase's processes and train it (PSPhase's and PSPhase.run's arguments)."""
    with PSPhase(prep, options, fail_worker_at, stop_criterion) as phase:
        return phase.run(recorder, init_params, init_momentum, start_step, init_buffers, before_go, start_t_wall,
                         evaluate_start)


def ps_processes(servers: int, workers: int) -> list[Proc]:
    """What a PS run starts here: workers forked from the zygote (or started by hand) and S shards;
    the harness measures what each costs (bench/harness/calibration.py)."""
    return [Proc(WORKERS, workers, rf"{FORKED}|psbench\.systems\.ps\.worker"),
            Proc("ps shard", servers, r"psbench\.systems\.ps\.server")]


class PSSystem(System):
    name = "ps"
    devices = (CPU, CUDA)  # workers compute on the GPU; shards apply on the host (gradients copied out, h2d_d2h_s)
    Options = PSOptions

    # --budget updates=N / samples=N: the shards' global step stops every worker; seconds=T: the clock
    budgets = ("updates", "samples", "seconds")
    timer_evaluator = True  # --eval-every-s: the launcher reads the servers' parameters (ServerSnapshots)

    @staticmethod
    def cpu_processes(options: PSOptions, workers: int) -> list[Proc]:
        return ps_processes(options.servers, workers)

    @staticmethod
    def check_spec(spec: RunSpec, options: PSOptions, workload: Any, device: Any, stragglers: Any) -> None:
        check_timer_model(spec, workload)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import msgpack  # noqa: F401
            import zmq  # noqa: F401
        except ImportError as exc:
            return f"needs pyzmq and msgpack ({exc})"
        return None

    def run(self, spec: RunSpec, options: PSOptions, recorder: Recorder) -> None:
        configure_threads(1)
        prep = prepare(spec)
        recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
        with PSPhase(prep, options) as phase:
            phase.run(recorder)
            shapes, token = phase.shapes, phase.token
        recorder.stop_clock()
        # the exchange alone, off the clock: what a step's comm_s is compared with (the same tensors)
        recorder.extra["ps_roundtrip_alone_s"] = time_push_pull_alone(shapes, token)
