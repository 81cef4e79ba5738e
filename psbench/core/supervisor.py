"""One process supervisor for every launcher (PS, allreduce, host lab, cluster files).

It spawns children with their output captured (a log file, or pipes), watches them, stops a whole
process tree with a grace period (SIGTERM, then SIGKILL), and describes how a child exited. Children
get their own session by default, so a stop reaches everything they started, and Ctrl-C at the
terminal reaches only the launcher, which then stops them.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import psutil

STOP_GRACE_S = 3.0
POLL_S = 0.1


def describe_exit(rc: int) -> str:
    """'exit code 3' or 'killed by SIGKILL'."""
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def tail(path: Path | None, n: int = 15) -> str:
    """The last n lines of a log file ('' if it cannot be read)."""
    if path is None:
        return ""
    try:
        return "\n".join(Path(path).read_text(errors="replace").rstrip().splitlines()[-n:])
    except OSError:
        return ""


_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]: ?")
_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$")
# a psbench command's one-line error; a "(log: ...)" it ends with is on the child's side
_PSBENCH_ERROR = re.compile(r"^psbench(?: [\w-]+)?: (?:run failed|error): (.+?)(?: \(log: [^()]*\))?$")


def python_error(text: str) -> str | None:
    """'Type: message' of the first Python traceback in text (torchrun's '[rankN]:' prefixes dropped)."""
    lines = [_RANK_PREFIX.sub("", line).rstrip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            for later in lines[i + 1:]:
                m = _PY_ERROR.match(later)
                if m and not later.startswith(("org.apache", "java.", "py4j.", "scala.")):
                    return f"{m.group(1)}: {m.group(2)}".strip()
    return None


def failure_cause(log_text: str) -> str | None:
    """Why a child process failed, in one line, from its log: a psbench command's own one-line
    error (the last one), else the first Python traceback's 'Type: message', else the last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    psbench = [m.group(1) for m in map(_PSBENCH_ERROR.match, lines) if m]
    return (psbench[-1] if psbench else python_error(log_text) or (lines[-1] if lines else None))


@dataclass
class Child:
    """A started process: its name (for messages), role and index (for launchers), and its log."""
    name: str
    proc: subprocess.Popen
    log_path: Path | None = None
    role: str = ""
    index: int = 0
    started: float = field(default_factory=time.monotonic)
    handled: bool = False  # the launcher dealt with its death (a lost worker, a restarted shard)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def failed(self) -> bool:
        """Exited non-zero and not handled by the launcher."""
        rc = self.proc.poll()
        return rc not in (None, 0) and not self.handled

    def describe(self) -> str:
        rc = self.proc.poll()
        return "running" if rc is None else describe_exit(rc)

    def log_tail(self, n: int = 15) -> str:
        return tail(self.log_path, n)


def stop_tree(procs: Iterable[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """Stop each process and everything it started: SIGTERM to its process group (when it leads
    one), to itself and to every descendant, up to grace_s to exit, then SIGKILL to what is left.
    grace_s=0 is a plain SIGKILL (fault injection: no chance to clean up). Our own children are
    reaped through their Popen, so their exit codes stay readable (psutil would reap them first,
    and Popen would then report 0 for a killed child)."""
    procs = [p for p in procs if p.poll() is None]
    descendants: list[psutil.Process] = []
    groups: list[int] = []
    for proc in procs:
        try:
            descendants += psutil.Process(proc.pid).children(recursive=True)
            if os.getpgid(proc.pid) == proc.pid:
                groups.append(proc.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    first = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    _signal(procs, descendants, groups, first)
    deadline = time.monotonic() + max(0.0, grace_s)
    _wait(procs, descendants, deadline)
    if first != signal.SIGKILL and (any(p.poll() is None for p in procs) or any(map(_running, descendants))):
        _signal([p for p in procs if p.poll() is None], [d for d in descendants if _running(d)], groups,
                signal.SIGKILL)
    _wait(procs, descendants, time.monotonic() + 5.0)


def _running(proc: psutil.Process) -> bool:
    """Whether a descendant still runs. A zombie has exited: it waits only to be reaped, by a parent
    that is not ours to hurry (an orphan's is PID 1, which in some containers reaps every ~2 s)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(procs: Sequence[subprocess.Popen], descendants: Sequence[psutil.Process], groups: Sequence[int],
            sig: signal.Signals) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        if proc.pid not in groups and proc.poll() is None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
    for d in descendants:  # those outside the groups (a child that made its own session)
        try:
            if os.getpgid(d.pid) not in groups:
                d.send_signal(sig)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass


def _wait(procs: Sequence[subprocess.Popen], descendants: Sequence[psutil.Process], deadline: float) -> None:
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while any(map(_running, descendants)) and time.monotonic() < deadline:
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Set by a launcher for the workers it starts (directly or through a zygote): its pid, watched.
LAUNCHER_PID_ENV = "PSBENCH_LAUNCHER_PID"


def launcher_pid() -> int | None:
    """The pid our launcher set in LAUNCHER_PID_ENV (None: started by hand, nothing to watch)."""
    text = os.environ.get(LAUNCHER_PID_ENV, "")
    return int(text) if text.isdigit() else None


def watch_launcher(or_parent: bool = True, every_s: float = 1.0) -> None:
    """A started process must not outlive its launcher (it would hold a port and a core, and train
    on): a daemon thread exits the process (status 3) once the launcher is gone, whatever the main
    thread is doing. The launcher is the pid in LAUNCHER_PID_ENV; without one, our parent
    (`or_parent`), or nobody: a process started by hand has no launcher to leave with."""
    import threading

    watched = launcher_pid() or (os.getppid() if or_parent else None)
    if watched is None:
        return

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if launcher_gone(watched):
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="launcher-watch").start()


def launcher_gone(parent_pid: int | None) -> bool:
    """Whether the launcher that started us has died. A worker forked by the zygote has the zygote
    as its parent, so beyond our parent, the launcher's pid is asked directly."""
    if parent_pid is None or os.getppid() == parent_pid:
        return False
    return not pid_alive(parent_pid)


class Supervisor:
    """Starts children and always stops them: `with Supervisor(log_dir) as sup: sup.spawn(...)`."""

    def __init__(self, log_dir: Path | None = None, grace_s: float = STOP_GRACE_S):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.grace_s = grace_s
        self.children: list[Child] = []

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log_path: Path | None = None, capture: bool = False, role: str = "", index: int = 0,
              new_session: bool = True, **popen_kwargs: Any) -> Child:
        """Start argv. Output goes to log_path (default log_dir/<name>.log), or to text pipes with
        capture=True, or where popen_kwargs' stdout/stderr say."""
        if capture:
            popen_kwargs.setdefault("stdout", subprocess.PIPE)
            popen_kwargs.setdefault("stderr", subprocess.PIPE)
            popen_kwargs.setdefault("text", True)
        elif "stdout" not in popen_kwargs:
            if log_path is None and self.log_dir is not None:
                log_path = self.log_dir / f"{name.replace(' ', '-')}.log"
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        if log_path is not None and "stdout" not in popen_kwargs:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(list(argv), env=None if env is None else dict(env), stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=new_session, **popen_kwargs)
        else:
            proc = subprocess.Popen(list(argv), env=None if env is None else dict(env),
                                    start_new_session=new_session, **popen_kwargs)
        child = Child(name, proc, Path(log_path) if log_path is not None else None, role, index)
        self.children.append(child)
        return child

    def adopt(self, name: str, proc: subprocess.Popen, log_path: Path | None = None) -> Child:
        """Supervise a process started elsewhere (it is stopped with the others)."""
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def failed(self) -> list[Child]:
        """Children that exited non-zero and were not handled, in start order."""
        return [c for c in self.children if c.failed()]

    def running(self, children: Iterable[Child] | None = None) -> list[Child]:
        return [c for c in (self.children if children is None else children) if c.poll() is None]

    def wait(self, children: Iterable[Child] | None = None, timeout_s: float | None = None) -> bool:
        """Up to timeout_s in all for the children to exit; True if they all did."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for c in list(self.children if children is None else children):
            try:
                c.proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stop(self, children: Iterable[Child] | None = None, grace_s: float | None = None) -> None:
        """Stop the given children (default: all) and their process trees."""
        targets = list(self.children if children is None else children)
        stop_tree([c.proc for c in targets], self.grace_s if grace_s is None else grace_s)
