"""Start S server shards and N workers as OS processes on this machine, coordinate them over a small
control socket, and always stop them: on success, on a worker's failure and on Ctrl-C.

Every child is started by the one process supervisor (psbench.core.supervisor) in its own session
with env=child_env(); stopping is SIGTERM to its tree, a grace period, then SIGKILL. Children also exit by themselves when the
launcher disappears (they watch the pid it sets in PSBENCH_LAUNCHER_PID), so even a SIGKILLed launcher leaves no orphans
for long.

Control messages (same wire format as the shards, msgpack + raw frames, no pickle):
    server -> launcher  server_ready {shard, port}
    worker -> launcher  worker_ready;   launcher -> worker  go {t0}
    worker -> launcher  worker_done {columns of step rows, snapshot steps/times} + snapshot frames
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from psbench.core.exposure import TOKEN_ENV
from psbench.core.zygote import Zygote
from psbench.core.supervisor import LAUNCHER_PID_ENV, Child, Supervisor, describe_exit, stop_tree
from psbench.systems.common import child_env
from psbench.systems.ps import protocol

class LaunchError(RuntimeError):
    """A server or worker process failed; the message names it and quotes its last log lines."""


@dataclass
class WorkerReport:
    worker: int
    rows: dict[str, list]
    snapshot_steps: list[int] = field(default_factory=list)
    snapshot_t: list[float] = field(default_factory=list)
    snapshots: list[np.ndarray] = field(default_factory=list)
    final_buffers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    lost: bool = False  # the worker died: rows are those it sent before (progress reports)
    stopped_at: int | None = None  # the steps done when its shared step stop fired (a switch's criterion)


ROW_COLUMNS = ("step", "t_wall", "n_samples", "loss", "staleness", "bytes", "compute_s", "emulated_s", "comm_s",
               "wait_s", "update_s", "data_s")
WORKER_ROW_COLUMNS = (*ROW_COLUMNS, "h2d_d2h_s")  # our PS worker's: its host-GPU copies too (the peers' have none)


@dataclass
class Faults:
    """What the launcher does when a child dies, and what it injects (real SIGKILLs, for tests and
    experiments). kill_worker = (worker, step): kill it when it reports reaching that step.
    kill_server = (shard, version, seconds): kill it at that version, or that many seconds after go."""
    tolerate_worker_loss: bool = False   # asp/ssp: go on without a dead worker; otherwise stop the run
    checkpoint_dir: str | None = None    # restart a dead shard from here (None: a dead shard stops the run)
    kill_worker: tuple[int, int] | None = None
    kill_server: tuple[int, int | None, float | None] | None = None


# What the worker zygote imports before it forks: torch and the worker step (not the worker module
# itself, which each child runs as __main__).
WORKER_PRELOAD = ["torch", "numpy", "zmq", "psbench.systems.common", "psbench.systems.ps.protocol"]


class Cluster:
    """`with Cluster(...) as c:` start_servers -> (init) -> start_workers -> go -> collect -> shutdown."""

    def __init__(self, n_servers: int, n_workers: int, token: str | None = None, host: str = "127.0.0.1",
                 ready_timeout_s: float = 120.0, faults: Faults | None = None, consistency: str = "asp"):
        self.n_servers, self.n_workers = n_servers, n_workers
        self.token, self.host = token, host
        self.ready_timeout_s = ready_timeout_s
        self.faults = faults or Faults()
        self.consistency = consistency
        # What the launcher learns while training runs (for fault handling and the run's record).
        self.events: list[dict[str, Any]] = []         # kind, t (epoch s), step, worker, detail
        self.partial_rows: dict[int, dict[str, list]] = {}  # rows a worker sent before it finished
        self.worker_step: dict[int, int] = {}
        self.server_version: dict[int, int] = {}
        self.lost_workers: dict[int, str] = {}          # worker -> how it died
        self.server_args: list[str] = []
        self.ports: dict[int, int] = {}
        self.restarting: dict[int, tuple[float, int | None]] = {}  # shard -> (death time, version before)
        self.restarts: list[dict[str, Any]] = []
        self.go_time: float | None = None
        self.stopping = False
        self._killed_server = False
        self._killed_worker = False
        self.log_dir = Path(tempfile.mkdtemp(prefix="psbench-ps-"))
        self.supervisor = Supervisor(self.log_dir)
        self.ctx = zmq.Context.instance()
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        protocol.limit_frames(self.control, protocol.DEFAULT_MAX_BYTES)
        port = self.control.bind_to_random_port("tcp://127.0.0.1")
        self.control_address = f"tcp://127.0.0.1:{port}"
        self.worker_idents: dict[int, bytes] = {}

    @property
    def children(self) -> list[Child]:
        return self.supervisor.children

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.supervisor.stop()
        self.control.close()
        for path in self.log_dir.glob("*.log"):
            path.unlink(missing_ok=True)
        try:
            self.log_dir.rmdir()
        except OSError:
            pass

    def _env(self) -> dict[str, str]:
        # the launcher's pid, which every shard and worker watches (a worker's parent is the zygote)
        return child_env({LAUNCHER_PID_ENV: str(os.getpid()), **({TOKEN_ENV: self.token} if self.token else {})})

    def _spawn(self, role: str, index: int, argv: list[str]) -> Child:
        return self.supervisor.spawn(f"ps {role} {index}", [sys.executable, *argv], env=self._env(), role=role, index=index,
                                     log_path=self.log_dir / f"{role}-{index}.log")

    def _event(self, kind: str, step: int | None = None, worker: int | None = None, **detail: Any) -> None:
        self.events.append({"kind": kind, "t": time.time(), "step": step, "worker": worker, "detail": detail})

    def _check_children(self) -> None:
        """Deal with children that exited: a lost worker (asp/ssp) or a restartable shard is
        handled; anything else is one LaunchError naming the process and how it died."""
        for c in list(self.children):
            rc = c.proc.poll()
            if rc is None or rc == 0 or c.handled:
                continue
            how = describe_exit(rc)
            # a worker lost before go has not trained: there is no run to go on with
            if c.role == "worker" and self.faults.tolerate_worker_loss and not self.stopping \
                    and self.go_time is not None:
                c.handled = True
                self.lost_workers[c.index] = how
                self._event("worker_lost", step=self.worker_step.get(c.index), worker=c.index, exit=how,
                            rows_received=len(self.partial_rows.get(c.index, {}).get("step", [])))
                print(f"psbench ps: worker {c.index} lost ({how}) near step {self.worker_step.get(c.index)}; "
                      f"{self.consistency} goes on without it", file=sys.stderr)
                continue
            if c.role == "server" and self.faults.checkpoint_dir and not self.stopping:
                c.handled = True
                self._restart_server(c, how)
                continue
            if c.role == "worker":
                if self.consistency == "bsp":
                    why = f"under {self.consistency} every step needs every worker, so the run stops"
                elif self.go_time is None:
                    why = "before training began, so the run stops"
                else:
                    why = "the run stops (option tolerate_worker_loss=true goes on without it)"
                where = f" near step {self.worker_step[c.index]}" if c.index in self.worker_step else ""
                raise LaunchError(f"ps worker {c.index} failed ({how}){where}; {why}. "
                                  f"Its last log lines:\n{c.log_tail()}")
            raise LaunchError(f"{c.name} failed ({how}):\n{c.log_tail()}")

    def _restart_server(self, dead: Child, how: str) -> None:
        j = dead.index
        before = self.server_version.get(j)
        self._event("server_lost", shard=j, exit=how, version_before=before)
        print(f"psbench ps: server shard {j} lost ({how}) at version {before}; restarting it from its "
              f"checkpoint on port {self.ports[j]}", file=sys.stderr)
        self.restarting[j] = (time.monotonic(), before)
        self._spawn_server(j, self.ports[j], restore=True)

    def _inject(self) -> None:
        """Time-based server kill (version- and step-based ones happen on progress reports)."""
        ks = self.faults.kill_server
        if ks is not None and ks[2] is not None and not self._killed_server and self.go_time is not None \
                and time.time() - self.go_time >= ks[2]:
            self._kill_child("server", ks[0])

    def _kill_child(self, role: str, index: int) -> None:
        child = next(c for c in reversed(self.children) if c.role == role and c.index == index)
        if role == "server":
            self._killed_server = True
        else:
            self._killed_worker = True
        if role == "worker":
            self._event("worker_killed", step=self.worker_step.get(index), worker=index, injected=True)
        else:
            self._event("server_killed", shard=index, version=self.server_version.get(index), injected=True)
        stop_tree([child.proc], grace_s=0)  # a real SIGKILL, no warning

    def _bookkeep(self, msg: protocol.Message) -> bool:
        """Progress reports and restarted shards; True if the message was consumed here."""
        if msg.op == "worker_progress":
            w, step = msg.worker, msg.step
            if 0 <= w < self.n_workers:
                self.worker_step[w] = step
                rows = self.partial_rows.setdefault(w, {})
                for name, values in msg.extra.get("rows", {}).items():
                    rows.setdefault(name, []).extend(values)
                kw = self.faults.kill_worker
                if kw is not None and kw[0] == w and step >= kw[1] and not self._killed_worker:
                    self._kill_child("worker", w)
            return True
        if msg.op == "server_progress":
            j, version = int(msg.extra["shard"]), int(msg.version)
            self.server_version[j] = version
            ks = self.faults.kill_server
            if ks is not None and ks[0] == j and ks[1] is not None and version >= ks[1] and not self._killed_server:
                self._kill_child("server", j)
            return True
        if msg.op == "server_ready" and int(msg.extra["shard"]) in self.restarting:
            j = int(msg.extra["shard"])
            t_dead, before = self.restarting.pop(j)
            restored = int(msg.extra.get("version", msg.version))
            record = {"shard": j, "version_before": before, "restored_version": restored,
                      "lost_updates": None if before is None else before - restored,
                      "recovery_s": time.monotonic() - t_dead}
            self.restarts.append(record)
            self.server_version[j] = restored
            self._event("server_restarted", **record)
            return True
        return False

    def _receive(self, deadline: float, what: str) -> tuple[bytes, protocol.Message]:
        while True:
            self._check_children()
            self._inject()
            if self.control.poll(100):
                frames = self.control.recv_multipart(copy=False)
                try:
                    msg = protocol.decode(frames[1:], token=self.token, ops=protocol.CONTROL_OPS,
                                          max_header_bytes=protocol.CONTROL_HEADER_BYTES)
                except protocol.ProtocolError as exc:  # not from our children: ignore it, keep going
                    print(f"psbench ps: ignored a bad control message: {exc}", file=sys.stderr)
                    continue
                if self._bookkeep(msg):
                    continue
                return frames[0].bytes, msg
            if time.monotonic() > deadline:
                raise LaunchError(f"timed out waiting for {what}")

    # ---- the phases ---------------------------------------------------------------------------
    def _spawn_server(self, j: int, port: int, restore: bool = False) -> Child:
        argv = ["-m", "psbench.systems.ps.server", "--bind", f"{self.host}:{port}", "--shard-id", str(j),
                "--servers", str(self.n_servers), "--workers", str(self.n_workers),
                "--control", self.control_address, *self.server_args]
        if self.faults.checkpoint_dir:
            argv += ["--checkpoint-dir", self.faults.checkpoint_dir]
        ks = self.faults.kill_server
        if restore:
            argv.append("--restore")
        elif ks is not None and ks[0] == j and ks[1] is not None:
            argv += ["--halt-at-version", str(ks[1])]  # it stops answering there; we SIGKILL it
        return self._spawn("server", j, argv)

    def start_servers(self, server_args: list[str]) -> list[str]:
        """Start the shards (each binds a free port on `host`); returns their host:port, in order."""
        self.server_args = list(server_args)
        for j in range(self.n_servers):
            self._spawn_server(j, 0)
        ports: dict[int, int] = {}
        deadline = time.monotonic() + self.ready_timeout_s
        while len(ports) < self.n_servers:
            _, msg = self._receive(deadline, f"{self.n_servers - len(ports)} server shard(s) to start")
            if msg.op == "server_ready":
                ports[int(msg.extra["shard"])] = int(msg.extra["port"])
        self.ports = ports
        return [f"{self.host}:{ports[j]}" for j in range(self.n_servers)]

    def start_workers(self, worker_args: list[str], addresses: list[str], extra: dict[int, list[str]] | None = None) -> None:
        """Start the workers and wait until each has loaded its data and says it is ready."""
        # One warm parent imports torch once and forks the workers (each would spend ~1 s of CPU
        # importing it; twelve on 2 cores took ~10 s before the first step).
        env = self._env()
        zygote = Zygote(self.supervisor, WORKER_PRELOAD, self.log_dir / "zygote.log", env)
        for i in range(self.n_workers):
            log_path = self.log_dir / f"worker-{i}.log"
            proc = zygote.fork("psbench.systems.ps.worker",
                               ["--servers", ",".join(addresses), "--worker-id", str(i), "--control",
                                self.control_address, *worker_args,
                                *(extra or {}).get(i, [])], env, log_path)
            child = self.supervisor.adopt(f"ps worker {i}", proc, log_path)
            child.role, child.index = "worker", i
        zygote.close_requests()
        deadline = time.monotonic() + self.ready_timeout_s
        while len(self.worker_idents) < self.n_workers:
            ident, msg = self._receive(deadline, f"{self.n_workers - len(self.worker_idents)} worker(s) to load")
            if msg.op == "worker_ready":
                self.worker_idents[msg.worker] = ident

    def go(self, t0: float, start_step: int = 0, buffers: np.ndarray | None = None) -> None:
        """Release every worker at once; t0 is the epoch time their t_wall counts from. They start at
        `start_step` of their batch stream, with these BatchNorm running statistics if any (the
        state a phase before left: workers started ahead of it learn it only now)."""
        self.go_time = t0
        arrays = [np.asarray(buffers, np.float32)] if buffers is not None and len(buffers) else []
        for ident in self.worker_idents.values():
            self.control.send_multipart([ident, *protocol.encode("go", token=self.token, t0=t0, step=start_step,
                                                                 keys=list(range(len(arrays))), arrays=arrays)])

    def collect(self, timeout_s: float | None = None) -> dict[int, WorkerReport]:
        """Wait for every worker's report; a failed worker stops everything (LaunchError)."""
        reports: dict[int, WorkerReport] = {}
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 10 ** 9)
        while len(reports) + len(set(self.lost_workers) - set(reports)) < self.n_workers:
            _, msg = self._receive(deadline, f"{self.n_workers - len(reports)} worker(s) to finish")
            if msg.op == "worker_done":
                arrays = [a.copy() for a in msg.arrays]  # the last one: the worker's final buffers
                reports[msg.worker] = WorkerReport(msg.worker, msg.extra["rows"], list(msg.extra["snapshot_steps"]),
                                                   list(msg.extra["snapshot_t"]), arrays[:-1], arrays[-1],
                                                   stopped_at=msg.extra.get("stopped_at"))
        for w in sorted(set(self.lost_workers) - set(reports)):  # the rows it sent before it died
            rows = self.partial_rows.get(w, {})
            reports[w] = WorkerReport(w, {c: rows.get(c, []) for c in WORKER_ROW_COLUMNS}, lost=True)
        return reports

    def wait_workers(self, timeout_s: float = 30.0) -> None:
        """After collect: let the workers exit (off the training clock); a non-zero exit is an error
        (except a worker already recorded as lost)."""
        self._wait_role("worker", timeout_s)
        self._check_children()

    def wait_servers(self, timeout_s: float = 10.0) -> None:
        self.stopping = True
        self._wait_role("server", timeout_s)

    def _wait_role(self, role: str, timeout_s: float) -> None:
        """Give the children of `role` up to timeout_s in all to exit; those still running are left."""
        self.supervisor.wait([c for c in self.children if c.role == role], timeout_s)


class WorkerControl:
    """The worker's end of the control socket: say ready, wait for go, send the report."""

    def __init__(self, address: str, worker_id: int, token: str | None):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 10000)
        self.sock.connect(address)
        self.worker_id, self.token = worker_id, token

    def __enter__(self) -> "WorkerControl":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sock.close()

    def wait_go(self) -> tuple[float, int, np.ndarray | None]:
        """Say ready, wait for the go: (t0, the step to start at, BatchNorm statistics or None)."""
        self.sock.send_multipart(protocol.encode("worker_ready", worker=self.worker_id, token=self.token))
        self.sock.poll()  # a launcher that dies meanwhile ends us (watch_launcher)
        msg = protocol.decode(self.sock.recv_multipart(copy=False), ops=protocol.CONTROL_OPS)
        return float(msg.extra["t0"]), int(msg.step), (np.array(msg.arrays[0]) if msg.arrays else None)

    def progress(self, step: int, rows: dict[str, list], halted: bool = False) -> None:
        """New step rows and the step reached; halted (fault injection): wait here to be killed."""
        self.sock.send_multipart(protocol.encode("worker_progress", worker=self.worker_id, token=self.token,
                                                 step=step, rows=rows, halted=halted))
        if halted:
            time.sleep(120)  # killed by the launcher long before (or by watch_launcher, if it died)

    def done(self, result: Any) -> None:
        arrays = [np.ascontiguousarray(a, dtype=np.float32) for a in [*result.snapshots, result.final_buffers]]
        self.sock.send_multipart(protocol.encode(
            "worker_done", worker=self.worker_id, token=self.token, keys=list(range(len(arrays))), arrays=arrays,
            rows=result.rows, snapshot_steps=result.snapshot_steps, snapshot_t=result.snapshot_t,
            stopped_at=result.stopped_at), copy=False)
