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
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from psbench.core.cpu import FORKED, WORKERS, Proc
from psbench.core.records import Recorder, split_sync_wait
from psbench.core.spec import RunSpec
from psbench.systems.base import option
from psbench.systems.common import (Prepared, configure_threads, evaluate_splits, flat_buffers, flat_params, prepare,
                                    record_evals, set_flat_buffers, set_flat_params, split_flat)
from psbench.systems.ps.launch import Cluster, Faults
from psbench.systems.ps.partition import partition_keys
from psbench.systems.ps.policies import parse_consistency, parse_mitigation, resolve_lr, resolve_momentum
from psbench.systems.ps.server import NONFINITE_MODES
from psbench.systems.ps.worker import ADMIN, KVWorker
from psbench.core.errors import ConfigError


@dataclass(frozen=True)
class PSOptions:
    consistency: str = option("asp", "bsp | asp | ssp:S (a worker at most S steps ahead of the slowest)")
    servers: int = option(1, "number of server shards (keys split by size across them)")
    mitigation: str = option("none", "none | staleness-lr | dc-asgd:LAMBDA | gap-aware")
    lr_scaling: str = option("auto", "auto (1: every update is one batch of the workload's size, as in single) | "
                                     "none | 1/n (the thesis' lr / N, which went with batch / N) | a factor")
    momentum_scaling: str = option("auto", "auto (asp/ssp: 1 - (1 - m) * N, at least 0, for the workload's momentum "
                                           "m: asynchrony adds momentum of its own; bsp: m) | none (m as is)")
    pipeline: bool = option(False, "asp only: each worker overlaps its push's round trip with the next "
                                   "step's compute (ps-lite's async push; staleness >= 1)")
    nonfinite: str = option("reject", "a push whose gradient holds NaN or inf: reject (an error reply naming "
                                      "the key; the worker fails) | skip (answered, not applied; counted)")
    host: str = option("127.0.0.1", "address the server shards bind")
    token: str | None = option(None, "shared token checked on every message (default: env PSBENCH_PS_TOKEN, "
                                        "else a random one per run; an option value is saved in the manifest)")
    step_timeout_s: float = option(60.0, "how long BSP/SSP waits for slow workers before failing the step")
    worker_timeout_s: float = option(30.0, "ssp: a worker silent this long is taken as dead and not waited for")
    retry_s: float = option(5.0, "a worker resends a request unanswered this long (a restarted shard lost it)")
    checkpoint_dir: str | None = option(None, "write shard checkpoints here; a killed shard is restarted from them")
    checkpoint_every: str = option("100", "checkpoint interval: shard updates (e.g. 100) or seconds (e.g. 5s)")
    kill_worker_at: str | None = option(None, "fault injection: WORKER:STEP, SIGKILL that worker at that step")
    kill_server_at: str | None = option(None, "fault injection: SHARD:VERSION or SHARD:SECONDSs, SIGKILL that "
                                              "shard then (checkpoints on, in a temp dir if none given)")

    def __post_init__(self) -> None:
        parse_consistency(self.consistency)
        parse_mitigation(self.mitigation)
        resolve_lr(self.lr_scaling, self.consistency, 1)
        resolve_momentum(self.momentum_scaling, self.consistency, 1, 0.9)
        if self.servers < 1:
            raise ConfigError(f"servers must be >= 1, got {self.servers}")
        if self.nonfinite not in NONFINITE_MODES:
            raise ConfigError(f"nonfinite '{self.nonfinite}' unknown; allowed: {' | '.join(NONFINITE_MODES)}")
        if self.pipeline and parse_consistency(self.consistency)[0] != "asp":
            raise ConfigError(f"pipeline needs consistency asp, got {self.consistency!r}: under bsp/ssp a worker "
                              f"must wait for its reply")
        if not self.step_timeout_s > 0:
            raise ConfigError(f"step_timeout_s must be > 0, got {self.step_timeout_s}")
        if not _loopback(self.host):
            raise ConfigError(f"host '{self.host}' is not allowed: bind a 127.0.0.0/8 address (e.g. 127.0.0.1) "
                              f"or, inside a test network namespace, a 198.18.0.0/15 one")
        if self.token is not None and not self.token:
            raise ConfigError("token must not be empty")
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
        kind, _ = parse_consistency(self.consistency)
        return Faults(tolerate_worker_loss=kind != "bsp", checkpoint_dir=self.checkpoint_dir,
                      kill_worker=kill_worker, kill_server=kill_server)


def _loopback(host: str) -> bool:
    """Loopback, or the benchmark range used inside network namespaces we create."""
    import ipaddress

    from psbench.systems.ps.server import is_loopback

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


def run_ps_phase(prep: Prepared, options: PSOptions, recorder: Recorder, init_params: np.ndarray | None = None,
                 init_momentum: np.ndarray | None = None, start_step: int = 0,
                 fail_worker_at: tuple[int, int] | None = None, init_buffers: np.ndarray | None = None,
                 before_go: Callable[[KVWorker], None] | None = None,
                 start_t_wall: float | None = None) -> PhaseResult:
    """Train prep.spec's workload on the PS from `init_params` (default: the seeded model) and
    optimizer state `init_momentum`, workers continuing at `start_step` with BatchNorm running
    statistics `init_buffers` (default: the seeded model's). Records step rows and evaluations
    into `recorder`; starts its clock if not running, leaves it running. `before_go(admin)` runs once
    every process is ready and the shards hold their initial state, just before the workers are
    released (a switch settles its clock there and checks the hand-off)."""
    spec = prep.spec
    n = spec.workers
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    shapes = [tuple(p.shape) for p in model.parameters()]
    partition_keys([math.prod(s) for s in shapes], options.servers)  # ConfigError before any process starts
    flat0 = flat_params(model) if init_params is None else np.asarray(init_params, dtype=np.float32)
    opt = prep.workload.optimizer
    lr = prep.lr * resolve_lr(options.lr_scaling, options.consistency, n)
    server_momentum = resolve_momentum(options.momentum_scaling, options.consistency, n, opt.momentum)
    # A token given as an option is recorded in the manifest with the spec; the env var is not.
    token = options.token or os.environ.get("PSBENCH_PS_TOKEN") or secrets.token_hex(16)
    server_args = ["--consistency", options.consistency, "--mitigation", options.mitigation, "--lr", repr(lr),
                   "--momentum", repr(server_momentum), "--weight-decay", repr(opt.weight_decay),
                   "--step-timeout-s", repr(options.step_timeout_s), "--nonfinite", options.nonfinite,
                   "--checkpoint-every", options.checkpoint_every]
    if parse_consistency(options.consistency)[0] == "ssp":
        server_args += ["--worker-timeout-s", repr(options.worker_timeout_s)]
    worker_args = ["--spec-json", json.dumps(spec.to_dict()), "--start-step", str(start_step),
                   "--timeout-s", repr(options.step_timeout_s + 60), "--retry-s", repr(options.retry_s)]
    if options.pipeline:
        worker_args.append("--pipeline")
    extra = {0: ["--snapshots"]}
    buffers_dir = tempfile.TemporaryDirectory(prefix="psbench-ps-buffers-")
    if init_buffers is not None and len(init_buffers):
        path = Path(buffers_dir.name) / "buffers.npy"
        np.save(path, np.asarray(init_buffers, np.float32), allow_pickle=False)
        worker_args += ["--init-buffers", str(path)]
    if fail_worker_at is not None:
        extra.setdefault(fail_worker_at[0], []).extend(["--fail-at-step", str(fail_worker_at[1])])
    faults = options.faults(n)
    if faults.kill_worker is not None:
        extra.setdefault(faults.kill_worker[0], []).extend(["--halt-at-step", str(faults.kill_worker[1])])
    scratch = None
    if faults.kill_server is not None and faults.checkpoint_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="psbench-ckpt-")
        faults = dataclasses.replace(faults, checkpoint_dir=scratch.name)
    with buffers_dir, Cluster(options.servers, n, token, options.host, faults=faults,
                              consistency=options.consistency) as cluster:
        addresses = cluster.start_servers(server_args)
        with KVWorker(addresses, ADMIN, shapes, token) as admin:
            admin.init(split_flat(flat0, shapes), step=start_step)
            if init_momentum is not None and server_momentum:
                admin.init(split_flat(np.asarray(init_momentum, np.float32), shapes), slot="momentum")
            cluster.start_workers(worker_args, addresses, extra)
            if before_go is not None:
                before_go(admin)
            if recorder.t0 is None:
                recorder.start_clock()
            t_start = recorder.now()
            go_t0 = time.time() - t_start
            cluster.go(go_t0)
            reports = cluster.collect()
            t_end = recorder.now()
            with recorder.paused():
                final = np.concatenate([a.reshape(-1) for a in admin.state("params")])
                momentum = (np.concatenate([a.reshape(-1) for a in admin.state("momentum")])
                            if server_momentum else None)
                stats = admin.stats()
                admin.shutdown()
                cluster.wait_workers()
                cluster.wait_servers()
    if scratch is not None:
        scratch.cleanup()
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
        if init_buffers is not None and len(init_buffers):
            set_flat_buffers(model, init_buffers)
        buffers0 = flat_buffers(model)
        # The starting weights are evaluated as of when they existed (a switch: its sync phase's end).
        evals = [(start_step, t_start if start_t_wall is None else start_t_wall, np.concatenate([flat0, buffers0]))]
        rep0 = reports.get(0)
        if rep0 is not None:
            evals += list(zip(rep0.snapshot_steps, rep0.snapshot_t, rep0.snapshots))
        final_buffers = rep0.final_buffers if rep0 is not None and not rep0.lost else buffers0
        evals.append((steps.get(0, start_step), t_end, np.concatenate([final, final_buffers])))
        for step, t_wall, flat in evals:
            set_flat_params(model, flat[:len(flat0)])
            set_flat_buffers(model, flat[len(flat0):])
            record_evals(recorder, step, evaluate_splits(model, loss_fn, prep.data), t_wall=t_wall)
    ps_extra = recorder.extra.setdefault("ps", {"phases": []})
    ps_extra["phases"].append({"consistency": options.consistency, "servers": options.servers,
                               "mitigation": options.mitigation, "lr_applied": lr, "momentum_applied": server_momentum,
                               "start_step": start_step,
                               "shards": stats,
                               "faults": {"lost_workers": {str(w): how for w, how in cluster.lost_workers.items()},
                                          "server_restarts": cluster.restarts,
                                          "lost_updates": sum(r["lost_updates"] or 0 for r in cluster.restarts)}})
    return PhaseResult(final, momentum, steps, stats, final_buffers)


def ps_processes(servers: int, workers: int) -> list[Proc]:
    """What a PS run starts here: workers forked from the zygote (or started by hand) and S shards;
    the harness measures what each costs (bench/harness/calibration.py)."""
    return [Proc(WORKERS, workers, rf"{FORKED}|psbench\.systems\.ps\.worker"),
            Proc("ps shard", servers, r"psbench\.systems\.ps\.server")]


class PSSystem:
    name = "ps"
    Options = PSOptions

    global_budget = True  # --budget updates=N / samples=N: the shards' global step stops every worker

    @staticmethod
    def cpu_processes(options: PSOptions, workers: int) -> list[Proc]:
        return ps_processes(options.servers, workers)

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
        run_ps_phase(prep, options, recorder)
        recorder.stop_clock()
