"""Where a cluster run's processes run: `Hosts`, the one interface the runner uses, and its three
backends. `LocalHosts`: every host is this machine at 127.0.0.1 (tests the file and the role
commands). `NetnsHosts`: every host a network namespace of a NetLab. `SshHosts`: each role over ssh
at its host's address (passwordless ssh; the same checkout + venv at [ssh] workdir on every host;
the job's token travels on the session's stdin, never in a command line), writing into its own
host's folder WORKDIR/.psbench-cluster/<job>/<host name>/, whose files are copied back with scp
before merging, as if no file system were shared; the remote folders are removed afterwards. A
role's remote process is stopped when its ssh connection closes (a guard on the session's stdin),
so stopping the launcher stops every host's processes."""
from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, Any

from psbench.bench.lab.cluster.file import ClusterFile
from psbench.bench.lab.cluster.roles import PlannedRole, RoleFailed
from psbench.core.errors import ConfigError
from psbench.core.supervisor import Supervisor, describe_exit, failure_cause


class Hosts(ABC):
    """The hosts of a cluster, numbered as the file lists them. A context manager: entering makes
    them ready, leaving stops every process started on them and removes what entering made."""

    def __enter__(self) -> "Hosts":
        return self

    @abstractmethod
    def __exit__(self, *exc: Any) -> None: ...

    @abstractmethod
    def addr(self, host: int) -> str:
        """The address other hosts reach `host` at."""

    @abstractmethod
    def start(self, host: int, argv: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
        """Start `argv` on `host` with `env` added to its environment, its output into `log`."""

    @abstractmethod
    def wait_listening(self, host: int, port: int, timeout: float) -> None:
        """Until something listens on `host`'s `port`; TimeoutError after `timeout` seconds."""

    @property
    def python(self) -> str:
        """The interpreter a role runs with on the hosts."""
        return sys.executable

    def scratch(self, local: Path) -> str:
        """The folder the roles write their files into, as the roles name it. The hosts share this
        machine's file system unless a backend says otherwise: `local`."""
        return str(local)

    def fetch(self, role: PlannedRole, local: Path) -> str:
        """`role.out` as a path on this machine (`local` is where a backend may copy it to)."""
        assert role.out is not None
        return role.out


class LocalHosts(Hosts):
    """Every host is this machine at 127.0.0.1."""

    def __init__(self, n: int):
        self.n = n
        self.supervisor = Supervisor()

    def __exit__(self, *exc: Any) -> None:
        self.supervisor.stop()

    def addr(self, host: int) -> str:
        return "127.0.0.1"

    def start(self, host: int, argv: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
        from psbench.systems.common import child_env

        return self.supervisor.spawn(argv[0], argv, env=child_env(env), stdout=log, stderr=subprocess.STDOUT).proc

    def wait_listening(self, host: int, port: int, timeout: float) -> None:
        wait_tcp("127.0.0.1", port, timeout)


def wait_tcp(address: str, port: int, timeout: float) -> None:
    """Until a TCP connection to address:port from here succeeds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {address}:{port} after {timeout:.0f}s")


def ssh_argv(cf: ClusterFile, role: PlannedRole, guard: bool = False) -> list[str]:
    """The ssh command that runs `role` on its host. Its environment (the job's token) never goes
    into the command, which `ps` shows on both ends: the remote shell reads each variable's value,
    one line each in sorted order (`ssh_stdin`), from the session's stdin and exports it. With
    `guard` the remote process is stopped when the connection closes: the remote shell keeps the
    rest of that stdin (which the launcher holds open and never writes again) and sends SIGTERM to
    the role once it reads end-of-file."""
    host = cf.hosts[role.host]
    names = sorted(role.env)
    take_env = "".join(f"IFS= read -r {k} && export {k} && " for k in names)
    prologue = f"cd {shlex.quote(cf.ssh.workdir)} && {take_env}" + ("exec 3<&0 || exit 1; " if guard else ": || exit 1; ")
    run = shlex.join(role.argv)
    if guard:
        remote = (prologue + f"{run} </dev/null & pid=$!; "
                  "(cat <&3 >/dev/null 2>&1; kill -TERM $pid 2>/dev/null) >/dev/null 2>&1 & "
                  "wait $pid")
    else:
        remote = prologue + "exec " + run
    return cf.ssh.command(str(host.address), remote)


def ssh_stdin(env: dict[str, str]) -> bytes:
    """What ssh_argv's remote shell reads first from its stdin: each value on a line, names sorted."""
    if any("\n" in v for v in env.values()):
        raise ConfigError("a role's environment value holds a newline; it travels to the host as one line")
    return "".join(f"{env[k]}\n" for k in sorted(env)).encode()


class SshHosts(Hosts):
    """launcher = "ssh": every host is reached by ssh at its address. Each role runs guarded (it
    stops when its ssh connection does) inside its host's own folder under [ssh] workdir; fetch()
    copies a role's files back by scp, cleanup() removes the hosts' folders."""

    def __init__(self, cf: ClusterFile, job: str):
        self.cf = cf
        self.remote_root = f".psbench-cluster/{job}"
        self.supervisor = Supervisor()

    @property
    def python(self) -> str:
        return self.cf.ssh.python

    def scratch(self, local: Path) -> str:
        """Each host's own folder under [ssh] workdir ("{host}": the role's host name)."""
        return self.remote_root + "/{host}"

    def __enter__(self) -> "SshHosts":
        for i, host in enumerate(self.cf.hosts):   # every host reachable, its folder made
            self._ssh(i, f"mkdir -p {shlex.quote(self.remote_root + '/' + host.name)}")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.supervisor.stop()
        for i in range(len(self.cf.hosts)):
            try:
                self._ssh(i, f"rm -rf {shlex.quote(self.remote_root)}")
            except RoleFailed:
                pass  # the run's own error (if any) is the one to report

    def _ssh(self, host: int, command: str, timeout: float = 60) -> None:
        argv = self.cf.ssh.command(self.addr(host), f"cd {shlex.quote(self.cf.ssh.workdir)} && {command}")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RoleFailed(f"{self.cf.hosts[host].name}: ssh to {self.addr(host)} failed: "
                             f"{failure_cause(proc.stderr) or describe_exit(proc.returncode)}\n{proc.stderr}")

    def addr(self, host: int) -> str:
        return str(self.cf.hosts[host].address)

    def start(self, host: int, argv: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
        cmd = ssh_argv(self.cf, PlannedRole("", host, argv, "", env), guard=True)
        # stdin: the environment's values first (the token: never on a command line), then held
        # open and never written again; its end stops the remote role (the guard)
        proc = self.supervisor.spawn(f"ssh:{self.cf.hosts[host].name}", cmd, stdin=subprocess.PIPE,
                                     stdout=log, stderr=subprocess.STDOUT).proc
        assert proc.stdin is not None
        proc.stdin.write(ssh_stdin(env))
        proc.stdin.flush()
        return proc

    def wait_listening(self, host: int, port: int, timeout: float) -> None:
        wait_tcp(self.addr(host), port, timeout)

    def fetch(self, role: PlannedRole, local: Path) -> str:
        """scp role.out (a file or a folder) from the role's host into local/<host>/; the local path."""
        assert role.out is not None
        s = self.cf.ssh
        dest = local / self.cf.hosts[role.host].name
        dest.mkdir(parents=True, exist_ok=True)
        remote = role.out if os.path.isabs(role.out) else f"{s.workdir.rstrip('/')}/{role.out}"
        scp = s.copy_back(self.addr(role.host), remote, str(dest))
        proc = subprocess.run(scp, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RoleFailed(f"{self.cf.hosts[role.host].name} {role.name}: copying {remote} back failed: "
                             f"{failure_cause(proc.stderr) or describe_exit(proc.returncode)}\n{proc.stderr}")
        return str(dest / os.path.basename(role.out.rstrip("/")))


class NetnsHosts(Hosts):
    """Every host is a namespace of a NetLab: one made from the file (caps included, removed on
    exit), or, with `lab`, a lab that is already up and stays up (its owner removes it)."""

    def __init__(self, cf: ClusterFile | None = None, lab=None):
        from psbench.bench.lab.netlab import NetLab

        self.owned = lab is None
        self.lab = NetLab(hosts=len(cf.hosts), caps_mbit=cf.caps()) if lab is None else lab

    def __enter__(self) -> "NetnsHosts":
        if self.owned:
            self.lab.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.owned:
            self.lab.down()

    def addr(self, host: int) -> str:
        return self.lab.addr(host)

    def start(self, host: int, argv: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen:
        from psbench.systems.common import child_env

        return self.lab.exec(host, argv, env=child_env(env), stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)

    def wait_listening(self, host: int, port: int, timeout: float) -> None:
        self.lab.wait_listening(host, port, timeout)


def hosts_for(cf: ClusterFile, job: str) -> Hosts:
    """The backend the file's launcher names (`job`: the run's own folder name on ssh hosts)."""
    if cf.launcher == "netns":
        return NetnsHosts(cf)
    if cf.launcher == "ssh":
        return SshHosts(cf, job)
    return LocalHosts(len(cf.hosts))
