"""A warm parent for worker processes: it imports the heavy modules once (torch, the shared worker
step), then forks each worker on request, so the N workers of a run cost one import, not N. (On 2
cores, twelve PS workers spent ~10 s importing torch before their first step; a fork takes ms.)

    zygote = Zygote(supervisor, ["torch", "psbench.systems.common"], log_path, env)
    proc = zygote.fork("psbench.systems.ps.worker", argv, env, log_path)   # Popen's interface
    child = supervisor.adopt("ps worker 0", proc, log_path)

A forked worker runs as `python -m MODULE ARGV...` would, with the given environment, its output
in its log and a session of its own (as the supervisor gives its children, so a stop reaches its
whole tree). The zygote reaps it and reports its exit status, which `ForkedProcess` returns like
Popen does (negative: the signal that killed it). The zygote forks before any torch operation ran,
so no thread pool exists yet to be lost in the fork.

`python -m psbench.core.zygote MODULE...` is the zygote itself: requests and replies are JSON
lines on its stdin and stdout.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

from psbench.core.supervisor import pid_alive

FORK_TIMEOUT_S = 60.0


class ForkedProcess:
    """A process the zygote forked, with the part of Popen's interface the supervisor uses."""

    def __init__(self, zygote: "Zygote", pid: int, args: list[str]):
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._zygote.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                self._zygote.changed.wait(0.1 if left is None else min(0.1, left))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """Starts the zygote as a supervised child; `fork` asks it for a worker."""

    def __init__(self, supervisor: Any, preload: Sequence[str], log_path: Path, env: Mapping[str, str],
                 name: str = "zygote", pass_fds: Sequence[int] = ()):
        # The zygote gets the workers' environment too: thread settings are read when torch's
        # libraries load, which is in the zygote. `pass_fds` (inheritable, e.g. a listening socket
        # bound here) reach the zygote; a fork keeps those its request names and closes the rest.
        with open(log_path, "wb") as log:
            self.child = supervisor.spawn(name, [sys.executable, "-m", "psbench.core.zygote", *preload], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          role="zygote", pass_fds=tuple(pass_fds))
        self.passed_fds = tuple(pass_fds)
        self.child.log_path = Path(log_path)
        self.changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._forked: dict[int, int] = {}  # request id -> pid
        self._ready = False
        self._gone = False
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.child.proc.stdout:
            msg = json.loads(line)
            with self.changed:
                if "ready" in msg:
                    self._ready = True
                elif "pid" in msg:
                    self._forked[msg["id"]] = msg["pid"]
                elif "exit" in msg:
                    self._exits[msg["exit"]] = msg["rc"]
                self.changed.notify_all()
        with self.changed:
            self._gone = True
            self.changed.notify_all()

    def fork(self, module: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
             keep_fds: Sequence[int] = ()) -> ForkedProcess:
        with self.changed:
            request = self._next_id
            self._next_id += 1
        close = [fd for fd in self.passed_fds if fd not in keep_fds]
        line = json.dumps({"id": request, "module": module, "argv": list(argv), "env": dict(env),
                           "log": str(log_path), "close_fds": close}) + "\n"
        self.child.proc.stdin.write(line.encode())
        self.child.proc.stdin.flush()
        deadline = time.monotonic() + FORK_TIMEOUT_S
        with self.changed:
            while request not in self._forked:
                if self._gone or time.monotonic() > deadline:
                    raise RuntimeError(f"the worker zygote did not fork {module} "
                                       f"({self.child.describe()}):\n{self.child.log_tail()}")
                self.changed.wait(0.1)
            return ForkedProcess(self, self._forked[request], [module, *argv])

    def status(self, pid: int) -> int | None:
        """The exit status of a forked process, None while it runs. Should the zygote die first, a
        process that is gone reads as killed (its status is lost with the zygote)."""
        with self.changed:
            if pid in self._exits:
                return self._exits[pid]
            if self._gone and not pid_alive(pid):
                return -signal.SIGKILL
        return None

    def close_requests(self) -> None:
        """No more forks: the zygote exits once its workers have."""
        try:
            self.child.proc.stdin.close()
        except OSError:
            pass


# ---- the zygote process ----------------------------------------------------------------------------

def _run_child(request: dict[str, Any], reply_fd: int) -> int:
    """In the forked child: become `python -m MODULE ARGV` with the request's environment and log;
    returns its exit code (the caller leaves through `_exit_child`)."""
    code = 1
    try:
        os.setsid()
        os.close(reply_fd)
        for fd in request.get("close_fds", ()):
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
    except BaseException:  # noqa: BLE001 - the child's traceback goes to its log, as python's would
        traceback.print_exc()
    return code


def _exit_child(code: int) -> None:
    """Leave a forked child as the interpreter's shutdown would, less its module teardown: wait for
    the threads it started, terminate the zmq context (its queued frames sent, within each socket's
    linger), run the atexit hooks, flush the output, then os._exit. The teardown is what costs: it
    touches every page the child shares with the zygote (torch's modules), so each copy-on-write
    child copied them back; twelve PS workers on 2 cores took ~3.8 s to exit after their last
    message (atexit -> reaped, measured), a third of a sharding run; with this exit a run took 5.7 s, not 9.2."""
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        zmq = sys.modules.get("zmq")
        context = getattr(getattr(zmq, "Context", None), "_instance", None)
        if context is not None and not context.closed:
            context.destroy()
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001 - a failing hook is reported in the log, as python would
        traceback.print_exc()
        code = code or 1
    finally:
        os._exit(code)


def serve(preload: Sequence[str]) -> int:
    for module in preload:
        importlib.import_module(module)
    reply_fd = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # what the zygote itself might print never mixes with its replies
    os.close(null)

    def reply(msg: dict[str, Any]) -> None:
        os.write(reply_fd, (json.dumps(msg) + "\n").encode())

    children: set[int] = set()

    def reap(block: bool = False) -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                children.clear()
                return
            if pid == 0:
                return
            children.discard(pid)
            reply({"exit": pid, "rc": os.waitstatus_to_exitcode(status)})

    reply({"ready": True})
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    pending = b""
    while True:
        if selector.select(timeout=0.05):
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _exit_child(_run_child(request, reply_fd))
                children.add(pid)
                reply({"pid": pid, "id": request["id"]})
        reap()
    while children:  # no more requests: report the workers' exits, then go
        reap(block=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
