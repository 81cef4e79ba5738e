"""Start S server shards and N workers as OS processes on this machine, coordinate them over a small
control socket, and always stop them: on success, on a worker's failure and on Ctrl-C.

Every child runs in its own process group (start_new_session) and gets env=child_env(). Stopping
is SIGTERM to the group, a grace period, then SIGKILL. Children also exit by themselves when the
launcher disappears (they watch their parent pid), so even a SIGKILLed launcher leaves no orphans
for long.

Control messages (same wire format as the shards, msgpack + raw frames, no pickle):
    server -> launcher  server_ready {shard, port}
    worker -> launcher  worker_ready;   launcher -> worker  go {t0}
    worker -> launcher  worker_done {columns of step rows, snapshot steps/times} + snapshot frames
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from systems.common import child_env
from systems.ps import protocol

STOP_GRACE_S = 3.0


class LaunchError(RuntimeError):
    """A server or worker process failed; the message names it and quotes its last log lines."""


@dataclass
class Child:
    role: str  # "server" or "worker"
    index: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def name(self) -> str:
        return f"ps {self.role} {self.index}"

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def stop(children: list[Child], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every live child's process group, wait up to grace_s, then SIGKILL what is left."""
    live = [c for c in children if c.proc.poll() is None]
    for c in live:
        try:
            os.killpg(c.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for c in live:
        try:
            c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(c.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            c.proc.wait()


@dataclass
class WorkerReport:
    worker: int
    rows: dict[str, list]
    snapshot_steps: list[int] = field(default_factory=list)
    snapshot_t: list[float] = field(default_factory=list)
    snapshots: list[np.ndarray] = field(default_factory=list)
    final_buffers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))


class Cluster:
    """`with Cluster(...) as c:` start_servers -> (init) -> start_workers -> go -> collect -> shutdown."""

    def __init__(self, n_servers: int, n_workers: int, token: str | None = None, host: str = "127.0.0.1",
                 ready_timeout_s: float = 120.0):
        self.n_servers, self.n_workers = n_servers, n_workers
        self.token, self.host = token, host
        self.ready_timeout_s = ready_timeout_s
        self.children: list[Child] = []
        self.log_dir = Path(tempfile.mkdtemp(prefix="psbench-ps-"))
        self.ctx = zmq.Context.instance()
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        port = self.control.bind_to_random_port("tcp://127.0.0.1")
        self.control_address = f"tcp://127.0.0.1:{port}"
        self.worker_idents: dict[int, bytes] = {}

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        stop(self.children)
        self.control.close()
        for path in self.log_dir.glob("*.log"):
            path.unlink(missing_ok=True)
        try:
            self.log_dir.rmdir()
        except OSError:
            pass

    def _spawn(self, role: str, index: int, argv: list[str]) -> Child:
        log_path = self.log_dir / f"{role}-{index}.log"
        env = child_env({"PSBENCH_PS_TOKEN": self.token} if self.token else None)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, *argv], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        child = Child(role, index, proc, log_path)
        self.children.append(child)
        return child

    def _check_children(self) -> None:
        for c in self.children:
            rc = c.proc.poll()
            if rc is not None and rc != 0:
                raise LaunchError(f"{c.name} failed (exit code {rc}):\n{c.log_tail()}")

    def _receive(self, deadline: float, what: str) -> tuple[bytes, protocol.Message]:
        while True:
            self._check_children()
            if self.control.poll(100):
                frames = self.control.recv_multipart(copy=False)
                try:
                    msg = protocol.decode(frames[1:], token=self.token, ops=protocol.CONTROL_OPS)
                except protocol.ProtocolError as exc:  # not from our children: ignore it, keep going
                    print(f"psbench ps: ignored a bad control message: {exc}", file=sys.stderr)
                    continue
                return frames[0].bytes, msg
            if time.monotonic() > deadline:
                raise LaunchError(f"timed out waiting for {what}")

    # ---- the phases ---------------------------------------------------------------------------
    def start_servers(self, server_args: list[str]) -> list[str]:
        """Start the shards (each binds a free port on `host`); returns their host:port, in order."""
        for j in range(self.n_servers):
            self._spawn("server", j, ["-m", "systems.ps.server", "--bind", f"{self.host}:0", "--shard-id", str(j),
                                      "--servers", str(self.n_servers), "--workers", str(self.n_workers),
                                      "--control", self.control_address, "--parent-pid", str(os.getpid()),
                                      *server_args])
        ports: dict[int, int] = {}
        deadline = time.monotonic() + self.ready_timeout_s
        while len(ports) < self.n_servers:
            _, msg = self._receive(deadline, f"{self.n_servers - len(ports)} server shard(s) to start")
            if msg.op == "server_ready":
                ports[int(msg.extra["shard"])] = int(msg.extra["port"])
        return [f"{self.host}:{ports[j]}" for j in range(self.n_servers)]

    def start_workers(self, worker_args: list[str], addresses: list[str], extra: dict[int, list[str]] | None = None) -> None:
        """Start the workers and wait until each has loaded its data and says it is ready."""
        for i in range(self.n_workers):
            self._spawn("worker", i, ["-m", "systems.ps.worker", "--servers", ",".join(addresses),
                                      "--worker-id", str(i), "--control", self.control_address,
                                      "--parent-pid", str(os.getpid()), *worker_args, *(extra or {}).get(i, [])])
        deadline = time.monotonic() + self.ready_timeout_s
        while len(self.worker_idents) < self.n_workers:
            ident, msg = self._receive(deadline, f"{self.n_workers - len(self.worker_idents)} worker(s) to load")
            if msg.op == "worker_ready":
                self.worker_idents[msg.worker] = ident

    def go(self, t0: float) -> None:
        """Release every worker at once; t0 is the epoch time their t_wall counts from."""
        for ident in self.worker_idents.values():
            self.control.send_multipart([ident, *protocol.encode("go", token=self.token, t0=t0)])

    def collect(self, timeout_s: float | None = None) -> dict[int, WorkerReport]:
        """Wait for every worker's report; a failed worker stops everything (LaunchError)."""
        reports: dict[int, WorkerReport] = {}
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 10 ** 9)
        while len(reports) < self.n_workers:
            _, msg = self._receive(deadline, f"{self.n_workers - len(reports)} worker(s) to finish")
            if msg.op == "worker_done":
                arrays = [a.copy() for a in msg.arrays]  # the last one: the worker's final buffers
                reports[msg.worker] = WorkerReport(msg.worker, msg.extra["rows"], list(msg.extra["snapshot_steps"]),
                                                   list(msg.extra["snapshot_t"]), arrays[:-1], arrays[-1])
        return reports

    def wait_workers(self, timeout_s: float = 30.0) -> None:
        """After collect: let the workers exit (off the training clock); a non-zero exit is an error."""
        deadline = time.monotonic() + timeout_s
        for c in self.children:
            if c.role == "worker":
                try:
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self._check_children()

    def wait_servers(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for c in self.children:
            if c.role == "server":
                try:
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass


class WorkerControl:
    """The worker's end of the control socket: say ready, wait for go, send the report."""

    def __init__(self, address: str, worker_id: int, token: str | None, parent_pid: int | None):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 10000)
        self.sock.connect(address)
        self.worker_id, self.token, self.parent_pid = worker_id, token, parent_pid

    def __enter__(self) -> "WorkerControl":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sock.close()

    def wait_go(self) -> float:
        self.sock.send_multipart(protocol.encode("worker_ready", worker=self.worker_id, token=self.token))
        while not self.sock.poll(500):
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                raise SystemExit(f"ps worker {self.worker_id}: launcher is gone")
        msg = protocol.decode(self.sock.recv_multipart(copy=False), ops=protocol.CONTROL_OPS)
        return float(msg.extra["t0"])

    def done(self, result: Any) -> None:
        arrays = [np.ascontiguousarray(a, dtype=np.float32) for a in [*result.snapshots, result.final_buffers]]
        self.sock.send_multipart(protocol.encode(
            "worker_done", worker=self.worker_id, token=self.token, keys=list(range(len(arrays))), arrays=arrays,
            rows=result.rows, snapshot_steps=result.snapshot_steps, snapshot_t=result.snapshot_t), copy=False)
