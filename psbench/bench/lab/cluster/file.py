"""The cluster file of `psbench run --cluster cluster.toml` (TOML or YAML): read and checked, every
problem one ConfigError naming the file and what is allowed.

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
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from psbench.bench.harness.schema import check_spec, check_suite_name
from psbench.core.errors import ConfigError
from psbench.core.hosts import HOST_RULE, is_host_address, is_ip
from psbench.core.spec import RunSpec
from psbench.workloads.user import canonical_name

LAUNCHERS = ("local", "netns", "ssh")
SYSTEM_ROLES = {"ps": ("ps-server", "worker"), "ddp": ("worker",)}
TOP_KEYS = {"launcher", "suite", "port", "timeout_s", "run", "hosts", "ssh", "description"}
HOST_KEYS = {"name", "address", "roles", "cap_mbit"}
DDP_RESERVED = {"master_addr", "master_port", "nnodes", "node_rank"}
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
    if isinstance(run.get("workload"), str):  # a workload file: relative to this file, absolute for every role
        run["workload"] = canonical_name(run["workload"], Path(source).parent)
    try:
        spec = RunSpec(**{**run, "options": options})
    except TypeError as exc:
        raise ConfigError(f"{source}: [run] {exc}") from None
    if spec.device != "cpu":  # the hosts' GPUs cannot be seen from here to resolve or refuse it
        raise ConfigError(f"{source}: [run] device '{spec.device}': a cluster file's roles run on cpu; allowed: cpu "
                          "(on GPU hosts: psbench launch --device cuda under torchrun, docs/devices.md)")
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
    from psbench.core.configfile import load_config

    return parse(load_config(path), str(path))
