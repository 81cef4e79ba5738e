"""A secret must never be in a command line: any local user reads every process's with `ps` or
/proc/*/cmdline. Its environment (/proc/<pid>/environ, readable by the owner and root only) may
hold it. These helpers watch every process on the machine while a job runs (tests run as root,
so they see the other namespaces' processes and can read environments)."""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable


def cmdlines() -> dict[int, str]:
    """Every process's command line, its arguments joined by spaces."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
    return out


def environ_values(name: str, pids: Iterable[int]) -> dict[int, str]:
    """pid -> the value of environment variable `name`, for those of `pids` that have it."""
    prefix = f"{name}=".encode()
    out = {}
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        for item in env:
            if item.startswith(prefix):
                out[pid] = item[len(prefix):].decode(errors="replace")
    return out


@dataclass
class Watch:
    """What the watch saw: the secrets it looked for, the processes whose environment held one,
    every command line that held one (must stay empty), and which of the `expect`ed command-line
    words it met (the job's processes it did scan)."""
    secrets: set[str] = field(default_factory=set)
    expect: tuple[str, ...] = ()
    holders: set[int] = field(default_factory=set)
    leaks: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    scans: int = 0

    def scan(self, env_name: str | None, pids: Callable[[], Iterable[int]]) -> None:
        if env_name is not None:  # a job that makes its own secret: learn it from its processes
            found = environ_values(env_name, pids())
            self.holders |= set(found)
            self.secrets |= {v for v in found.values() if v}
        if self.secrets:
            self.scans += 1
            lines = cmdlines()
            self.leaks += [f"{pid}: {cmd}" for pid, cmd in lines.items() if any(s in cmd for s in self.secrets)]
            self.seen |= {word for word in self.expect if any(word in cmd for cmd in lines.values())}


def watch_cmdlines(proc: subprocess.Popen, secrets: set[str] = frozenset(), env_name: str | None = None,
                   pids: Callable[[], Iterable[int]] = lambda: (), expect: tuple[str, ...] = (),
                   timeout: float = 300.0, every_s: float = 0.2, until: Callable[[], bool] = lambda: False) -> Watch:
    """Scan every command line on the machine for the secrets, and for the values of `env_name` in
    the job's processes (`pids`: not other jobs on a shared machine), until `proc` ends or
    `until()` says so."""
    watch = Watch(set(secrets), expect)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not until() and time.monotonic() < deadline:
        watch.scan(env_name, pids)
        time.sleep(every_s)
    return watch
