"""`psbench run --cluster cluster.toml`: one run whose roles (PS servers, workers, DDP nodes) are
placed on the hosts a cluster file names. Results land in results/<suite>/<run-id>/ like any run.

    launcher = "netns"        # netns: hosts are network namespaces (a NetLab made from this file)
                              # local: every host is 127.0.0.1 (tests the file and the role commands)
                              # ssh:   each role over ssh on the host's address, records back by scp
    suite = "cluster"         # results/<suite>/
    port = 29500              # PS shard j listens on port + j; the DDP store on port
    timeout_s = 600
    [run]                     # the RunSpec: system (ps | ddp), workload, max_steps, seed, ...
    system = "ps"
    workload = "mlp-digits"
    max_steps = 40
    [run.options]             # system options (ps: consistency, mitigation, ...; servers is derived;
    consistency = "asp"       #   ddp beyond "local": insecure = true, its store has no authentication)
    [ssh]                     # launcher = "ssh" only
    user = "me"
    workdir = "/opt/psbench"  # the same checkout and venv on every host
    python = ".venv/bin/python"
    config = "~/lab/ssh_config" # optional: `ssh -F` file (keys, known_hosts, port)
    [[hosts]]
    name = "ps0"
    address = "10.0.0.1"      # ssh only; netns/local assign addresses
    roles = ["ps-server"]     # ps: "ps-server" and/or "worker"; ddp: "worker" (one per rank)
    cap_mbit = 100            # netns only: tc tbf on this host's link, both directions
    [[hosts]]
    name = "w0"
    roles = ["worker", "worker"]

Every role is a plain psbench command: `ps-server --bind ADDR:PORT`, `ps-worker --servers ...`,
and for DDP `run --system ddp --nnodes H --node-rank i --master-addr <first worker host>` per host.
The workers' step rows come back through files (ps-worker --out, each node's results folder).
netns and local share this machine's file system. With launcher = "ssh" each role runs as
`ssh HOST 'cd WORKDIR && ...'` (passwordless ssh; the same checkout + venv at [ssh] workdir on
every host; the job's token travels on the session's stdin, never in a command line), writes into
its own host's folder WORKDIR/.psbench-cluster/<job>/<host name>/, and the files are copied back
with scp before merging, as if no file system were shared; the remote
folders are removed afterwards. A role's remote process is stopped when its ssh connection
closes (a guard on the session's stdin), so stopping the launcher stops every host's processes.
`--dry-run` prints the commands instead. A role that fails stops the run with one line,
`<host> <role>: <first cause>`, and its whole log under results/<suite>/failed/, as a local run's
failure (runner.failure_kept).

Clock of a PS run: each worker's rows are timed from its own start; the start is placed on the
common clock as (--out file's mtime) - (its last t_wall), which is exact to a round trip on one
kernel. The run's clock spans the first worker's start to the last worker's end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Sequence

from psbench.bench.harness.schema import check_spec, check_suite_name
from psbench.core.spec import RunSpec
from psbench.core.errors import ConfigError
from psbench.core.hosts import HOST_RULE, is_host_address, is_ip
from psbench.core.supervisor import Supervisor, describe_exit, failure_cause, stop_tree

LAUNCHERS = ("local", "netns", "ssh")
SYSTEM_ROLES = {"ps": ("ps-server", "worker"), "ddp": ("worker",)}
TOP_KEYS = {"launcher", "suite", "port", "timeout_s", "run", "hosts", "ssh", "description"}
HOST_KEYS = {"name", "address", "roles", "cap_mbit"}
DDP_RESERVED = {"master_addr", "master_port", "nnodes", "node_rank"}
# a role's failure that reads as a peer gone (gloo's words) waits up to PEERS_FAIL_S for the peer's own
PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|pair closure", re.IGNORECASE)
PEERS_FAIL_S = 5.0
# a host's name (its folders, here and on the host) and the ssh user: never '-' first (an option of
# ssh) nor '.' (a folder of its own: '..'), no '/'
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
PLAIN_RULE = "letters, digits, '_', '.' and '-', not '.' or '-' first"


@dataclass(frozen=True)
class Host:
    name: str
    roles: tuple[str, ...]
    address: str | None = None
    cap_mbit: float | None = None


@dataclass(frozen=True)
class SshSettings:
    user: str | None = None
    workdir: str = "."
    python: str = "python3"
    config: str | None = None   # ssh -F FILE (identity, known_hosts, port); default: the user's own

    def ssh(self) -> list[str]:
        """ssh and its options; scp takes the same options."""
        opts = ["-F", os.path.expanduser(self.config)] if self.config else []
        return ["ssh", *opts, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]

    def target(self, address: str) -> str:
        return f"{self.user}@{address}" if self.user else address

    def command(self, address: str, remote: str) -> list[str]:
        """ssh running `remote` (one shell command line) at `address`. "--" ends ssh's options, so
        no destination is ever read as one (the file's addresses are checked as well)."""
        return [*self.ssh(), "--", self.target(address), remote]

    def copy_back(self, address: str, path: str, into: str) -> list[str]:
        """scp of `path` (a file or a folder) at `address` into the local folder `into`."""
        host = f"[{address}]" if is_ip(address) and ":" in address else address   # IPv6: [addr]:path
        return ["scp", *self.ssh()[1:], "-q", "-r", "--", f"{self.target(host)}:{path}", into]


@dataclass(frozen=True)
class ClusterFile:
    launcher: str
    spec: RunSpec
    hosts: tuple[Host, ...]
    suite: str = "cluster"
    port: int = 29500
    timeout_s: float = 600.0
    ssh: SshSettings = field(default_factory=SshSettings)
    source: str = ""

    def role_hosts(self, role: str) -> list[int]:
        """Host index of every instance of `role`, in file order (a host listed twice counts twice)."""
        return [i for i, h in enumerate(self.hosts) for r in h.roles if r == role]

    def caps(self) -> dict[int, float]:
        return {i: h.cap_mbit for i, h in enumerate(self.hosts) if h.cap_mbit}

    def caps_label(self) -> str:
        caps = [f"{h.name}={h.cap_mbit:g}" for h in self.hosts if h.cap_mbit]
        return ",".join(caps) or "none"


# ---- the file -------------------------------------------------------------------------------

def parse(raw: dict[str, Any], source: str = "cluster file") -> ClusterFile:
    """Validate a loaded cluster file; every problem is one ConfigError naming it."""
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_KEYS))}")
    launcher = raw.get("launcher", "local")
    if launcher not in LAUNCHERS:
        raise ConfigError(f"{source}: launcher must be one of {', '.join(LAUNCHERS)}, got '{launcher}'")
    run = dict(raw.get("run") or {})
    system = run.get("system")
    if system not in SYSTEM_ROLES:
        raise ConfigError(f"{source}: [run] system must be one of {', '.join(SYSTEM_ROLES)}, got '{system}'")
    hosts = []
    for k, h in enumerate(raw.get("hosts") or []):
        bad = sorted(set(h) - HOST_KEYS)
        if bad:
            raise ConfigError(f"{source}: hosts[{k}] has unknown key(s) {', '.join(bad)}; allowed: {', '.join(sorted(HOST_KEYS))}")
        roles = h.get("roles") or []
        if isinstance(roles, str) or not all(r in SYSTEM_ROLES[system] for r in roles):
            raise ConfigError(f"{source}: hosts[{k}] roles {roles!r}: a {system} cluster allows a list of "
                              f"{', '.join(SYSTEM_ROLES[system])}")
        cap = h.get("cap_mbit")
        if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
            raise ConfigError(f"{source}: hosts[{k}] cap_mbit must be a number > 0, got {cap!r}")
        if cap is not None and launcher != "netns":
            raise ConfigError(f"{source}: hosts[{k}] cap_mbit needs launcher = \"netns\" (it sets tc on the lab's links)")
        name = h.get("name") or f"h{k}"
        if not (isinstance(name, str) and PLAIN_NAME.match(name)):
            raise ConfigError(f"{source}: hosts[{k}] name {name!r}; allowed: {PLAIN_RULE}")
        address = h.get("address")
        if address is not None and not is_host_address(address):
            raise ConfigError(f"{source}: hosts[{k}] ({name}) address {address!r} is not a host address; "
                              f"allowed: {HOST_RULE}")
        hosts.append(Host(name, tuple(roles), address, float(cap) if cap is not None else None))
    if not hosts:
        raise ConfigError(f"{source}: give at least one [[hosts]] entry")
    if len({h.name for h in hosts}) != len(hosts):
        raise ConfigError(f"{source}: host names must be unique")
    if launcher == "ssh" and any(not h.address for h in hosts):
        raise ConfigError(f"{source}: launcher \"ssh\" needs an address for every host")
    workers = sum(r == "worker" for h in hosts for r in h.roles)
    if workers == 0:
        raise ConfigError(f"{source}: no host has the role \"worker\"")
    if run.get("workers") not in (None, workers):
        raise ConfigError(f"{source}: [run] workers = {run['workers']} but the hosts have {workers} worker role(s)")
    options = dict(run.pop("options", None) or {})
    if system == "ps":
        servers = sum(r == "ps-server" for h in hosts for r in h.roles)
        if servers == 0:
            raise ConfigError(f"{source}: a ps cluster needs at least one host with the role \"ps-server\"")
        if options.get("servers") not in (None, servers):
            raise ConfigError(f"{source}: option servers = {options['servers']} but the hosts have {servers} ps-server role(s)")
        options["servers"] = servers
        options.pop("host", None)  # each shard binds its own host's address
    else:
        reserved = sorted(DDP_RESERVED & set(options))
        if reserved:
            raise ConfigError(f"{source}: ddp option(s) {', '.join(reserved)} come from the hosts; remove them")
        nodes = [h for h in hosts if h.roles]
        if len({len(h.roles) for h in nodes}) != 1:
            raise ConfigError(f"{source}: every ddp host needs the same number of worker roles, got "
                              f"{[len(h.roles) for h in nodes]}")
    parsed = _check_system_options(system, options, source)
    if system == "ddp" and launcher != "local" and not parsed.insecure:
        raise ConfigError(f"{source}: ddp across hosts listens on the first node's address with torch's rendezvous "
                          "store and gloo, which have no authentication: set insecure = true in [run.options] "
                          "(recorded in the manifest)")
    run["workers"] = workers
    check_spec(run, source, "[run] ", complete=False)
    try:
        spec = RunSpec(**{**run, "options": options})
    except TypeError as exc:
        raise ConfigError(f"{source}: [run] {exc}") from None
    port = raw.get("port", 29500)
    if not (isinstance(port, int) and 1024 <= port <= 65535 - len(hosts)):
        raise ConfigError(f"{source}: port must be an integer in 1024..{65535 - len(hosts)}, got {port!r}")
    timeout = raw.get("timeout_s", 600.0)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ConfigError(f"{source}: timeout_s must be > 0, got {timeout!r}")
    ssh_raw = dict(raw.get("ssh") or {})
    bad_ssh = sorted(set(ssh_raw) - {f.name for f in fields(SshSettings)})
    if bad_ssh:
        raise ConfigError(f"{source}: [ssh] unknown key(s) {', '.join(bad_ssh)}; allowed: "
                          f"{', '.join(f.name for f in fields(SshSettings))}")
    user = ssh_raw.get("user")
    if user is not None and not (isinstance(user, str) and PLAIN_NAME.match(user)):
        raise ConfigError(f"{source}: [ssh] user {user!r}; allowed: {PLAIN_RULE}")
    ssh = SshSettings(**ssh_raw) if launcher == "ssh" else SshSettings()
    suite = check_suite_name(raw.get("suite", "cluster"), source)
    return ClusterFile(launcher, spec, tuple(hosts), suite, port, float(timeout), ssh, source)


def _check_system_options(system: str, options: dict[str, Any], source: str) -> Any:
    """The system's options parsed (ConfigError naming the file if they are bad)."""
    from psbench import systems
    from psbench.systems.base import parse_options

    cls = systems.get_system(system)
    try:
        return parse_options(cls.Options, options, system)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load(path: Path) -> ClusterFile:
    from psbench.bench.harness.matrix import load_config

    return parse(load_config(path), str(path))


# ---- role commands --------------------------------------------------------------------------

@dataclass
class PlannedRole:
    name: str
    host: int
    argv: list[str]
    stage: str                      # "server" (daemon, waited for on ready_port), "worker", "finish"
    env: dict[str, str] = field(default_factory=dict)
    ready_port: int | None = None
    out: str | None = None          # file the role writes its records to


def _spec_args(spec: RunSpec) -> list[str]:
    args = ["--workload", spec.workload, "--workers", str(spec.workers), "--seed", str(spec.seed),
            "--sharding", spec.sharding, "--evals-per-epoch", str(spec.evals_per_epoch)]
    for flag, value in (("--epochs", spec.epochs), ("--batch-size", spec.batch_size),
                        ("--max-steps", spec.max_steps), ("--data-dir", spec.data_dir)):
        if value is not None:
            args += [flag, str(value)]
    return args


def plan_roles(cf: ClusterFile, addrs: Sequence[str], python: str, scratch: str,
               token: str | None = None) -> list[PlannedRole]:
    """Every process of the run, in start order, with its argv (addresses resolved). A "{host}" in
    `scratch` becomes the role's host name (one folder per host: ssh)."""
    roles = _plan_roles(cf, addrs, python, scratch, token)
    for role in roles:
        here = scratch.replace("{host}", cf.hosts[role.host].name)
        role.argv = [a.replace(scratch, here) for a in role.argv]
        role.out = role.out.replace(scratch, here) if role.out else None
    return roles


def _plan_roles(cf: ClusterFile, addrs: Sequence[str], python: str, scratch: str,
                token: str | None = None) -> list[PlannedRole]:
    spec = cf.spec
    py = [python, "-m", "psbench"]
    if spec.system == "ps":
        from psbench.systems.base import parse_options
        from psbench.systems.ps.adapter import PSOptions
        from psbench.systems.ps.policies import resolve_step
        from psbench.workloads import get_workload

        opts = parse_options(PSOptions, spec.options, "ps")
        w = get_workload(spec.workload)
        step = resolve_step(opts.lr_scaling, opts.momentum_scaling, opts.consistency, spec.workers,
                            w.optimizer.momentum)
        lr, momentum = (spec.lr or w.optimizer.lr) * step.lr_factor, step.momentum
        token_env = {"PSBENCH_PS_TOKEN": token} if token else {}
        servers = [f"{addrs[h]}:{cf.port + j}" for j, h in enumerate(cf.role_hosts("ps-server"))]
        roles = [PlannedRole(f"ps-server{j}", h, py + [
            "ps-server", "--bind", servers[j], "--shard-id", str(j), "--servers", str(len(servers)),
            "--workers", str(spec.workers), "--consistency", opts.consistency, "--mitigation", opts.mitigation,
            "--lr", repr(lr), "--momentum", repr(momentum), "--weight-decay", repr(w.optimizer.weight_decay),
            "--step-timeout-s", repr(opts.step_timeout_s)], "server", token_env, ready_port=cf.port + j)
            for j, h in enumerate(cf.role_hosts("ps-server"))]
        for k, h in enumerate(cf.role_hosts("worker")):
            out = f"{scratch}/worker{k}.json"
            roles.append(PlannedRole(f"worker{k}", h, py + [
                "ps-worker", "--servers", ",".join(servers), "--worker-id", str(k), *_spec_args(spec),
                "--init", "--timeout-s", repr(opts.step_timeout_s + 60), "--out", out], "worker", token_env, out=out))
        first = cf.role_hosts("worker")[0]
        out = f"{scratch}/final.npz"
        roles.append(PlannedRole("ps-fetch", first, [python, "-m", "psbench.bench.lab.cluster", "ps-fetch", "--servers",
                                                     ",".join(servers), "--workload", spec.workload, "--seed",
                                                     str(spec.seed), "--out", out], "finish", token_env, out=out))
        return roles
    nodes = [i for i, h in enumerate(cf.hosts) if h.roles]
    master = addrs[nodes[0]]
    env = {"GLOO_SOCKET_IFNAME": "veth0"} if cf.launcher == "netns" else {}
    extra = [a for k, v in spec.options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    roles = []
    for rank, h in enumerate(nodes):
        out = f"{scratch}/node{rank}"
        argv = py + ["run", "--system", "ddp", *_spec_args(spec), *extra, "--master-addr", master,
                     "--master-port", str(cf.port), "--nnodes", str(len(nodes)), "--node-rank", str(rank),
                     "--results-dir", out, "--suite", "node", "--no-progress", "--no-resume"]
        if spec.lr is not None:
            argv += ["--lr", repr(spec.lr)]
        roles.append(PlannedRole(f"node{rank}", h, argv, "worker", env, out=out))
    return roles


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


# ---- hosts: where the processes run ---------------------------------------------------------

class LocalHosts:
    """Every host is this machine at 127.0.0.1."""

    def __init__(self, n: int):
        self.n = n
        self.supervisor = Supervisor()

    def __enter__(self) -> "LocalHosts":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.supervisor.stop()

    def addr(self, host: int) -> str:
        return "127.0.0.1"

    def start(self, host: int, argv: list[str], env: dict[str, str], log) -> subprocess.Popen:
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


class SshHosts:
    """launcher = "ssh": every host is reached by ssh at its address. Each role runs guarded (it
    stops when its ssh connection does) inside its host's own folder under [ssh] workdir; fetch()
    copies a role's files back by scp, cleanup() removes the hosts' folders."""

    def __init__(self, cf: ClusterFile, job: str):
        self.cf = cf
        self.remote_root = f".psbench-cluster/{job}"
        self.supervisor = Supervisor()

    @property
    def scratch(self) -> str:
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

    def start(self, host: int, argv: list[str], env: dict[str, str], log) -> subprocess.Popen:
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


class NetnsHosts:
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

    def start(self, host: int, argv: list[str], env: dict[str, str], log) -> subprocess.Popen:
        from psbench.systems.common import child_env

        return self.lab.exec(host, argv, env=child_env(env), stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)

    def wait_listening(self, host: int, port: int, timeout: float) -> None:
        self.lab.wait_listening(host, port, timeout)


# ---- running ----------------------------------------------------------------------------------

class RoleFailed(RuntimeError):
    """A role of a cluster run failed or the run timed out. The first line is `<host> <role>: <first
    cause>`; the role's whole log follows (kept under the suite's failed/ folder by run_file)."""


def role_failed(cf: ClusterFile, failures: Sequence[tuple[PlannedRole, Path, str]], cause: str | None = None) -> RoleFailed:
    """One error for roles that failed, each (role, its log, how it ended), the first one's first:
    its cause, unless given, is read from its log (on an ssh host: the remote role's output and
    ssh's own errors). Every role's whole log follows the first line."""
    texts = [_role_log(role, log) for role, log, _ in failures]
    role, _, how = failures[0]
    cause = cause or failure_cause(texts[0]) or how
    return RoleFailed(f"{cf.hosts[role.host].name} {role.name}: {cause}" + "".join(
        f"\n--- {r.name} on {cf.hosts[r.host].name} ({h}), its log:\n{text}" for (r, _, h), text in zip(failures, texts)))


def _role_log(role: PlannedRole, log: Path) -> str:
    try:
        text = log.read_text(errors="replace").rstrip()
    except OSError:
        text = ""
    if role.out and os.path.isdir(role.out):   # a psbench run's own failure log, on this machine (not ssh)
        text += "".join(f"\n--- {kept.name}:\n{kept.read_text(errors='replace')}"
                        for kept in sorted(Path(role.out).glob("*/failed/*.log")))
    return text


def _last_written(log: Path) -> float:
    try:
        return os.stat(log).st_mtime
    except OSError:
        return math.inf


def _wait(cf: ClusterFile, started: list[tuple[PlannedRole, subprocess.Popen, Path]],
          servers: list[tuple[PlannedRole, subprocess.Popen, Path]], deadline: float) -> None:
    """Until every process of `started` exits 0. Its first failure, a server that stops meanwhile
    (fail now, not at the workers' reply timeout) or the deadline raises RoleFailed."""
    first_failure = None
    while True:
        codes = [p.poll() for _, p, _ in started]
        failed = [(role, log, describe_exit(c)) for (role, _, log), c in zip(started, codes) if c not in (None, 0)]
        if failed:
            # A role that only lost a peer (a broken collective) is rarely the first cause: up to
            # PEERS_FAIL_S for the role that broke it, then the failure whose log ended first.
            first_failure = first_failure or time.monotonic()
            lost_peer = {r.name: bool(PEER_LOST.search(failure_cause(_role_log(r, log)) or "")) for r, log, _ in failed}
            if (not all(lost_peer.values()) or None not in codes
                    or time.monotonic() - first_failure > PEERS_FAIL_S):
                raise role_failed(cf, sorted(failed, key=lambda f: (lost_peer[f[0].name], _last_written(f[1]))))
        elif all(c == 0 for c in codes):
            return
        for role, proc, log in servers:
            if proc.poll() is not None:
                how = f"stopped early, {describe_exit(proc.returncode)}"
                raise role_failed(cf, [(role, log, how)], None if proc.returncode else how)
        if time.monotonic() > deadline:
            slow = [f"{cf.hosts[r.host].name} {r.name}" for (r, _, _), c in zip(started, codes) if c is None]
            raise RoleFailed(f"cluster run timed out after {cf.timeout_s:g}s; still running: {', '.join(slow)}")
        time.sleep(0.1)


def execute(cf: ClusterFile, hosts, scratch: Path, token: str | None = None) -> list[PlannedRole]:
    """Start the roles stage by stage on `hosts` (servers, then workers, then the finisher), wait for
    each stage, and stop whatever still runs at the end. Returns the planned roles, whose `out`
    names a local file (copied back from its host by an ssh launcher)."""
    remote = isinstance(hosts, SshHosts)
    roles = plan_roles(cf, [hosts.addr(i) for i in range(len(cf.hosts))],
                       cf.ssh.python if remote else sys.executable, hosts.scratch if remote else str(scratch), token)
    deadline = time.monotonic() + cf.timeout_s
    servers: list[tuple[PlannedRole, subprocess.Popen, Path]] = []
    try:
        for stage in ("server", "worker", "finish"):
            started = []
            for role in (r for r in roles if r.stage == stage):
                log = scratch / f"{role.name}.log"
                with open(log, "wb") as fh:
                    proc = hosts.start(role.host, role.argv, role.env, fh)
                started.append((role, proc, log))
                if role.ready_port is not None:
                    try:
                        hosts.wait_listening(role.host, role.ready_port, max(1.0, min(60.0, deadline - time.monotonic())))
                    except TimeoutError as exc:
                        raise role_failed(cf, [(role, log, "not listening")], str(exc)) from None
            if stage == "server":
                servers = started
                continue
            _wait(cf, started, servers if stage == "worker" else [], deadline)
        for _, proc, _ in servers:  # ps-fetch told them to shut down
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stop_tree([proc])
    finally:
        for _, proc, _ in servers:
            stop_tree([proc])
    if remote:   # the records travel back: every role's files, by scp, into this machine's scratch
        roles = [replace(r, out=hosts.fetch(r, scratch / "fetched")) if r.out else r for r in roles]
    return roles


def recorded_spec(cf: ClusterFile) -> RunSpec:
    """The run's spec as recorded: the cluster's launcher and caps are part of what was run."""
    return replace(cf.spec, options={**cf.spec.options, "launcher": cf.launcher, "caps": cf.caps_label()})


def collect_ps(cf: ClusterFile, roles: list[PlannedRole], recorder) -> None:
    collect_ps_files(cf.spec, [str(r.out) for r in roles if r.stage == "worker"],
                     next(str(r.out) for r in roles if r.stage == "finish"), recorder)


def collect_ps_files(spec: RunSpec, worker_outs: Sequence[str], fetched_npz: str, recorder) -> None:
    """Step rows from the workers' --out files, evals of the seeded model and of the final
    parameters ps-fetch saved, the shards' stats: one run's records from a PS job run elsewhere."""
    import numpy as np

    from psbench.core.records import STEP_TIME_COLUMNS, split_sync_wait
    from psbench.systems.common import evaluate_splits, prepare, record_evals, set_flat_params

    starts, ends, rows_by_worker = [], [], {}
    for out in worker_outs:
        data = json.loads(Path(out).read_text())
        rows = data["rows"]
        # The worker's clock start (epoch s; t_wall counts from it). Files from before it was written:
        # estimated from the file's time, which is late by however long the worker took to write it.
        end = os.stat(out).st_mtime
        start = data["t0"] if "t0" in data else end - (rows["t_wall"][-1] if rows["t_wall"] else 0.0)
        end = start + (rows["t_wall"][-1] if rows["t_wall"] else 0.0)
        starts.append(start)
        ends.append(end)
        rows_by_worker[data["worker"]] = (start, rows)
    t0 = min(starts)
    recorder.adopt_clock(t0, max(ends), 0.0)
    steps = []
    for w, (start, rows) in sorted(rows_by_worker.items()):
        kept = [c for c in ("step", "n_samples", "loss", "staleness", "bytes", *STEP_TIME_COLUMNS) if c in rows]
        steps += [{"worker": w, "t_wall": start - t0 + t, **dict(zip(kept, values))}
                  for t, *values in zip(rows["t_wall"], *(rows[c] for c in kept))]
    if str(spec.options.get("consistency", "asp")).split(":")[0] != "asp":
        split_sync_wait(steps)  # bsp/ssp: as the local launcher's records (systems/ps/adapter.py)
    recorder.add_steps(steps)
    fetched = np.load(fetched_npz)
    prep = prepare(spec)
    model = prep.build_model()
    loss_fn = prep.workload.loss_fn()
    record_evals(recorder, 0, evaluate_splits(model, loss_fn, prep.data), t_wall=0.0)
    set_flat_params(model, fetched["params"])
    last = max(len(rows["step"]) for _, rows in rows_by_worker.values())
    record_evals(recorder, last, evaluate_splits(model, loss_fn, prep.data), t_wall=max(ends) - t0)
    recorder.extra["ps"] = {"shards": json.loads(str(fetched["stats"]))}


def collect_ddp(roles: list[PlannedRole], recorder) -> None:
    from psbench.core.tables import read_table

    for rank, role in enumerate(roles):
        run_dirs = sorted(Path(role.out, "node").glob("*/manifest.json"))
        if len(run_dirs) != 1:
            raise RoleFailed(f"{role.name}: expected one run folder in {role.out}, found {len(run_dirs)}")
        run_dir = run_dirs[0].parent
        manifest = json.loads(run_dirs[0].read_text())
        if rank == 0:
            eval_s = manifest["extra"].get("eval_s", 0.0)
            recorder.adopt_clock(manifest["start"], manifest["end"], eval_s)
            recorder.extra["eval_s"] = eval_s
            for row in read_table(run_dir, "evals").to_dict("records"):
                recorder.eval(int(row["step"]), row["split"], row["loss"], row["accuracy"], t_wall=row["t_wall"])
        steps = read_table(run_dir, "steps")
        recorder.add_steps([{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
                            for row in steps.to_dict("records")])


def run_file(cf: ClusterFile, results_dir: Path, resume: bool = True, record_format: str = "parquet"):
    """Run the cluster file once; returns the RunResult (None if already complete and resume).
    Record tables are written as `record_format` (psbench.core.records.RECORD_FORMATS)."""
    from psbench.core.records import Recorder
    from psbench.bench.harness.runner import failure_kept, is_complete
    from psbench.workloads import get_workload

    spec = recorded_spec(cf)
    if resume and is_complete(results_dir, cf.suite, spec):
        print(f"psbench: {spec.run_id} already complete in suite '{cf.suite}' (resume)", file=sys.stderr)
        return None
    if cf.launcher == "netns":
        from psbench.bench.lab.netlab import unavailable_reason

        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"launcher \"netns\" is not available here: {reason}")
    recorder = Recorder(spec, target_accuracy=get_workload(spec.workload).target_accuracy)
    from psbench.systems.common import prepare

    prep = prepare(cf.spec)  # validates the workload before any process starts
    recorder.shard_report = prep.plan.report(prep.data.y_train, prep.data.n_classes)
    token = secrets.token_hex(16) if cf.spec.system == "ps" else None
    job = secrets.token_hex(6)
    hosts = (NetnsHosts(cf) if cf.launcher == "netns" else SshHosts(cf, job) if cf.launcher == "ssh"
             else LocalHosts(len(cf.hosts)))
    try:
        with tempfile.TemporaryDirectory(prefix="psbench-cluster-") as tmp, hosts:
            os.chmod(tmp, 0o755)
            roles = execute(cf, hosts, Path(tmp), token)
            if cf.spec.system == "ps":
                collect_ps(cf, roles, recorder)
            else:
                collect_ddp(roles, recorder)
            recorder.extra["cluster"] = {"launcher": cf.launcher, "source": cf.source,
                                         "hosts": [{"name": h.name, "address": hosts.addr(i), "roles": list(h.roles),
                                                    "cap_mbit": h.cap_mbit} for i, h in enumerate(cf.hosts)]}
    except RuntimeError as exc:   # as a local run's failure: one line, the whole story under failed/
        raise failure_kept(exc, results_dir, cf.suite, spec.run_id) from exc
    return recorder.finish(results_dir, cf.suite, record_format)


def dry_run(cf: ClusterFile) -> list[str]:
    """The command line of every role, per host, without running anything."""
    if cf.launcher == "ssh":
        addrs = [str(h.address) for h in cf.hosts]
        python, scratch = cf.ssh.python, ".psbench-cluster"
    else:
        addrs = [("198.18.L." + str(i + 1)) if cf.launcher == "netns" else "127.0.0.1" for i in range(len(cf.hosts))]
        python, scratch = sys.executable, "$SCRATCH"
    token = "$PSBENCH_PS_TOKEN" if cf.spec.system == "ps" else None
    lines = []
    for role in plan_roles(cf, addrs, python, scratch, token):
        argv = ssh_argv(cf, role) if cf.launcher == "ssh" else role.argv
        given = f"; stdin: {', '.join(sorted(role.env))}, a line each" if cf.launcher == "ssh" and role.env else ""
        lines.append(f"# {role.name} on {cf.hosts[role.host].name} ({role.stage}{given})\n{shlex.join(argv)}")
    return lines


# ---- the finisher role: final parameters from the shards, then shut them down ----------------

def ps_fetch(argv: list[str] | None = None) -> int:
    """`python -m psbench.bench.lab.cluster ps-fetch --servers A,B --workload W --seed S --out final.npz`: runs on a
    cluster host (it must reach the shards), saves params + shard stats, shuts the shards down."""
    import numpy as np

    from psbench.core.spec import RunSpec
    from psbench.systems.common import prepare
    from psbench.core.exposure import read_token
    from psbench.systems.ps.worker import ADMIN, KVWorker

    p = argparse.ArgumentParser(prog="python -m psbench.bench.lab.cluster ps-fetch")
    p.add_argument("--servers", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    model = prepare(RunSpec("ps", args.workload, seed=args.seed)).build_model()
    shapes = [tuple(t.shape) for t in model.parameters()]
    with KVWorker(args.servers.split(","), ADMIN, shapes, read_token(None), 60.0) as kv:
        params = np.concatenate([a.reshape(-1) for a in kv.state("params")])
        stats = kv.stats()
        kv.shutdown()
    tmp = Path(args.out).with_suffix(".tmp.npz")
    np.savez(tmp, params=params, stats=np.array(json.dumps(stats)))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["ps-fetch"]:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        sys.exit(ps_fetch(sys.argv[2:]))
    sys.exit("usage: python -m psbench.bench.lab.cluster ps-fetch ...")
