"""A lab of separate network hosts on one machine: Linux network namespaces joined by veth pairs to
a bridge, with optional per-host bandwidth caps (tc tbf), for real cross-host runs without hosts.

Layout for lab L with K hosts (everything is named from L, so no state file is needed):

    namespace psb-L-br   bridge br0 (no address), veth ends psbL-hI-b
    namespace psb-L-hI   veth0 = 198.18.L.(I+1)/24, lo up, no default route

Nothing is created in, or routed through, the root namespace: deleting the lab's namespaces
deletes every veth and the bridge with them. Addresses are only ever in 198.18.0.0/15.

Caps: `caps_mbit={1: 50}` puts a token bucket (tbf) on both directions of host 1's link:
egress on veth0 inside the host (its uploads) and egress on the bridge-side end (its downloads).
netem is not in this kernel; latency, if needed, must be added in user space.

    with NetLab(hosts=3, caps_mbit={0: 100}) as lab:
        proc = lab.exec(1, [sys.executable, "-m", "psbench", "run", ...])
        results = lab.run_cluster([Role("server", 0, [...], daemon=True, ready_port=5555),
                                   Role("worker0", 1, [..., "--servers", "{h0}:5555"])])

Needs root and iproute2. CLI: `psbench netlab up|down|status|exec|bench` (bench/lab/command.py).
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from psbench.core.errors import ConfigError
from psbench.core.supervisor import Supervisor, stop_tree

PREFIX = "psb"
BRIDGE = "br0"
HOST_IF = "veth0"
LAB_NET = ipaddress.ip_network("198.18.0.0/15")
MAX_HOSTS = 200
STOP_GRACE_S = 2.0  # SIGTERM, then this long, then SIGKILL


def ns_name(lab: int, host: int) -> str:
    return f"{PREFIX}-{lab}-h{host}"


def bridge_ns(lab: int) -> str:
    return f"{PREFIX}-{lab}-br"


def bridge_port(lab: int, host: int) -> str:
    name = f"{PREFIX}{lab}-h{host}-b"  # at most 15 characters: psb255-h199-b
    assert len(name) <= 15, name
    return name


def host_addr(lab: int, host: int) -> str:
    addr = ipaddress.ip_address(f"198.18.{lab}.{host + 1}")
    assert addr in LAB_NET  # the only network this module ever configures
    return str(addr)


def unavailable_reason() -> str | None:
    """None if labs can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed"
    return None


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def labs_present() -> dict[int, list[str]]:
    """Lab id -> its namespaces, for every lab whose namespaces exist."""
    labs: dict[int, list[str]] = {}
    for ns in list_namespaces():
        m = re.fullmatch(rf"{PREFIX}-(\d+)-(h\d+|br)", ns)
        if m:
            labs.setdefault(int(m.group(1)), []).append(ns)
    return labs


def free_lab_id() -> int:
    used = labs_present()
    for lab in range(256):
        if lab not in used:
            return lab
    raise ConfigError("all 256 lab ids are in use; run `psbench netlab down --all`")


def _tbf(ns: str, dev: str, mbit: float) -> None:
    rate_Bps = mbit * 1e6 / 8
    burst = max(int(rate_Bps / 250), 16 * 1024)    # >= one 4 ms tick of tokens, >= a few MTUs
    limit = max(int(rate_Bps * 0.05), 2 * burst)    # ~50 ms of queue before tail drop
    _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
          "rate", f"{int(mbit * 1000)}kbit", "burst", str(burst), "limit", str(limit)])


def namespace_pids(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def write_netns_hosts(lab: "NetLab", host: int, names: Mapping[str, str]) -> Path:
    """/etc/netns/<namespace>/hosts: localhost and `names` (name -> address), which `ip netns exec`
    mounts over /etc/hosts for what it starts in that host; the folder, for its owner to remove."""
    folder = Path("/etc/netns") / lab.ns(host)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in names.items()))
    return folder


def down(lab: int | None = None) -> list[str]:
    """Remove every namespace of lab `lab` (all psbench labs if None), after killing processes still
    inside them (a namespace with live processes would outlive its name, veths and all). Also
    removes any root-namespace link with the lab's prefix left by an interrupted set-up."""
    removed = []
    targets = [ns for lab_id, names in labs_present().items() if lab is None or lab_id == lab for ns in names]
    for ns in targets:
        for pid in namespace_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for ns in targets:
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    link_prefix = f"{PREFIX}{lab}-" if lab is not None else PREFIX
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(link_prefix):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


@dataclass
class Role:
    """One process of a cluster run. `argv` may name host addresses as {h0}, {h1}, ...; a daemon
    (a server) runs until the non-daemon roles finish; `ready_port` makes the launcher wait until
    the role listens on that TCP port at its host's address before starting the next roles."""
    name: str
    host: int
    argv: list[str]
    daemon: bool = False
    ready_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class RoleResult:
    name: str
    host: int
    returncode: int | None  # None: a daemon that was stopped
    stdout: str
    stderr: str
    seconds: float


class NetLab:
    """Context manager: `up()` on enter, `down()` on exit (also after an exception)."""

    def __init__(self, hosts: int = 3, caps_mbit: Mapping[int, float] | None = None, lab: int | None = None):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ConfigError(f"hosts must be 1..{MAX_HOSTS}, got {hosts}")
        self.caps_mbit = dict(caps_mbit or {})
        for h, mbit in self.caps_mbit.items():
            if not 0 <= h < hosts:
                raise ConfigError(f"cap for host {h}: hosts are 0..{hosts - 1}")
            if not mbit > 0:
                raise ConfigError(f"cap for host {h} must be > 0 Mbit/s, got {mbit}")
        if lab is not None and not 0 <= lab <= 255:
            raise ConfigError(f"lab id must be 0..255, got {lab}")
        self.hosts = hosts
        self.lab = lab
        self.supervisor = Supervisor(grace_s=STOP_GRACE_S)

    # ---- life cycle -----------------------------------------------------------------------
    def up(self) -> "NetLab":
        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"cannot make a network lab: {reason}")
        if self.lab is None:
            self.lab = free_lab_id()
        elif self.lab in labs_present():
            raise ConfigError(f"lab {self.lab} already exists; `psbench netlab down --lab {self.lab}` first")
        try:
            self._create()
        except BaseException:
            down(self.lab)
            raise
        return self

    def _create(self) -> None:
        lab, br = self.lab, bridge_ns(self.lab)
        _run(["ip", "netns", "add", br])
        _run(["ip", "-n", br, "link", "set", "lo", "up"])
        _run(["ip", "-n", br, "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", BRIDGE, "up"])
        for h in range(self.hosts):
            ns, port = ns_name(lab, h), bridge_port(lab, h)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # Both ends are made inside lab namespaces: the root namespace never sees them.
            _run(["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", HOST_IF, "netns", ns])
            _run(["ip", "-n", br, "link", "set", port, "master", BRIDGE])
            _run(["ip", "-n", br, "link", "set", port, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{host_addr(lab, h)}/24", "dev", HOST_IF])
            _run(["ip", "-n", ns, "link", "set", HOST_IF, "up"])
            if h in self.caps_mbit:
                _tbf(ns, HOST_IF, self.caps_mbit[h])   # the host's uploads
                _tbf(br, port, self.caps_mbit[h])      # the host's downloads

    def down(self) -> None:
        self.stop_all()
        if self.lab is not None:
            down(self.lab)

    def __enter__(self) -> "NetLab":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- hosts ----------------------------------------------------------------------------
    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.hosts:
            raise ConfigError(f"host {host} is not in this lab (hosts 0..{self.hosts - 1})")

    def addr(self, host: int) -> str:
        self._check_host(host)
        return host_addr(self.lab, host)

    def ns(self, host: int) -> str:
        self._check_host(host)
        return ns_name(self.lab, host)

    def expand(self, text: str) -> str:
        """Replace {h0}, {h1}, ... with host addresses."""
        return re.sub(r"\{h(\d+)\}", lambda m: self.addr(int(m.group(1))), text)

    def exec(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
             **popen_kwargs) -> subprocess.Popen:
        """Start argv inside host's namespace ({hN} expanded); env defaults to systems.common.child_env().
        The process gets its own session so it (and its children) can be stopped as a group."""
        from psbench.systems.common import child_env

        full_env = dict(env) if env is not None else child_env()
        argv = ["ip", "netns", "exec", self.ns(host)] + [self.expand(a) for a in argv]
        new_session = popen_kwargs.pop("start_new_session", True)
        popen_kwargs.setdefault("stdin", None)  # `netlab exec` keeps the terminal's stdin
        child = self.supervisor.spawn(f"h{host}:{os.path.basename(argv[4])}", argv, env=full_env,
                                      new_session=new_session, **popen_kwargs)
        return child.proc

    def run(self, host: int, argv: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """exec and wait; output captured as text."""
        proc = self.exec(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_tree([proc], STOP_GRACE_S)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def wait_listening(self, host: int, port: int, timeout: float = 30) -> None:
        """Until something listens on addr(host):port (checked with `ss` inside the namespace)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = _run(["ip", "netns", "exec", self.ns(host), "ss", "-Hltn", f"sport = :{port}"], check=False).stdout
            if out.strip():
                return
            time.sleep(0.05)
        raise TimeoutError(f"nothing listens on {self.addr(host)}:{port} after {timeout}s")

    def run_cluster(self, roles: Sequence[Role], timeout: float = 300) -> dict[str, RoleResult]:
        """Start roles in order (waiting for each ready_port), wait for every non-daemon role, then
        stop the daemons. On timeout or error every role is stopped and TimeoutError is raised."""
        names = [r.name for r in roles]
        if len(set(names)) != len(names):
            raise ConfigError(f"role names must be unique, got {names}")
        from psbench.systems.common import child_env

        started: list[tuple[Role, subprocess.Popen, float]] = []
        results: dict[str, RoleResult] = {}
        deadline = time.monotonic() + timeout
        try:
            for role in roles:
                proc = self.exec(role.host, role.argv, env=child_env(role.env), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                started.append((role, proc, time.monotonic()))
                if role.ready_port is not None:
                    self.wait_listening(role.host, role.ready_port, timeout=max(1.0, deadline - time.monotonic()))
            for role, proc, t0 in started:
                if role.daemon:
                    continue
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                results[role.name] = RoleResult(role.name, role.host, proc.returncode, out, err, time.monotonic() - t0)
            for role, proc, t0 in started:
                if role.daemon:
                    returncode = proc.poll()
                    if returncode is None:
                        stop_tree([proc], grace_s=5.0)
                    out, err = proc.communicate()
                    results[role.name] = RoleResult(role.name, role.host, returncode, out, err, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"cluster run did not finish within {timeout}s; roles: {names}") from None
        finally:
            stop_tree([proc for _, proc, _ in started], STOP_GRACE_S)
        return results

    # ---- processes ------------------------------------------------------------------------
    def stop_all(self) -> None:
        self.supervisor.stop()
        self.supervisor.children.clear()

    # ---- inspection -----------------------------------------------------------------------
    def describe(self) -> str:
        return describe(self.lab)


def describe(lab: int | None = None) -> str:
    """Human-readable status: per lab, each host's namespace, address and qdisc."""
    labs = labs_present()
    if not labs:
        return "no psbench network labs"
    lines = []
    for lab_id, names in sorted(labs.items()):
        if lab is not None and lab_id != lab:
            continue
        hosts = sorted((n for n in names if not n.endswith("-br")), key=lambda n: int(n.rsplit("h", 1)[1]))
        lines.append(f"lab {lab_id}: bridge namespace {'present' if bridge_ns(lab_id) in names else 'MISSING'}, "
                     f"{len(hosts)} host(s)")
        for ns in hosts:
            h = int(ns.rsplit("h", 1)[1])
            addrs = _run(["ip", "-n", ns, "-o", "-4", "addr", "show", "dev", HOST_IF], check=False).stdout.split()
            addr = next((a for a in addrs if a.startswith("198.18.")), "?")
            qdisc = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", HOST_IF], check=False).stdout
            rate = re.search(r"rate (\S+)", qdisc)
            lines.append(f"  h{h}  {ns:<14} {addr:<18} cap {rate.group(1) if rate else 'none'}")
    return "\n".join(lines)
