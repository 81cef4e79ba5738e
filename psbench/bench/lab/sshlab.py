"""sshd on namespace hosts: a key pair made for the lab, one OpenSSH server per host bound only to
that host's 198.18 address, and an ssh client configuration that trusts exactly those servers.

Nothing outside the kit's folder is read or written: no ~/.ssh, no /etc/ssh (the client gets
`-F <kit>/ssh_config`, which names the kit's key and known_hosts; wrappers named `ssh` and `scp` in
<kit>/bin add it for tools that call plain `ssh`, such as horovodrun).

    with NetLab(hosts=3) as lab, SshLab(lab, hosts=[1, 2]) as ssh:
        lab.run(0, ssh.ssh_argv(1, "hostname -I"))

Each host's /etc/hosts (`ip netns exec` bind-mounts /etc/netns/<namespace>/hosts over /etc/hosts
for the processes it starts: sshd and every session) maps this machine's hostname to that host's
lab address, as on a real cluster. Horovod 0.28's gloo makes its device from the hostname
(HOROVOD_GLOO_IFACE notwithstanding), and the shared /etc/hosts says 127.0.0.1: every rank would
advertise loopback to its peers. The files are removed on exit.

Needs Debian's openssh-server (/usr/sbin/sshd) and openssh-client, and root (namespaces).
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from psbench.bench.lab.netlab import write_netns_hosts
from psbench.core.errors import ConfigError

SSHD = "/usr/sbin/sshd"
PORT = 22


def unavailable_reason() -> str | None:
    """None if namespace sshd can run here, else why not."""
    if not Path(SSHD).is_file():
        return "sshd is not installed (Debian: apt-get install -y openssh-server)"
    for tool in ("ssh", "scp", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (Debian: openssh-client)"
    return None


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "psbench-lab", "-f", str(path)],
                   check=True, capture_output=True)
    return Path(f"{path}.pub").read_text().strip()


class SshKit:
    """Keys and configuration in one private folder: a client key, a host key shared by the lab's
    servers, authorized_keys, known_hosts for the given addresses, and the client config."""

    def __init__(self, addresses: Sequence[str], folder: Path | None = None):
        self.dir = Path(folder or tempfile.mkdtemp(prefix="psbench-ssh-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.identity = self.dir / "id_ed25519"
        self.host_key = self.dir / "host_ed25519"
        client_pub = _keygen(self.identity)
        host_pub = _keygen(self.host_key)
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text(client_pub + "\n")
        self.known_hosts = self.dir / "known_hosts"
        host_type, host_blob = host_pub.split()[:2]
        self.known_hosts.write_text("".join(f"{a} {host_type} {host_blob}\n" for a in addresses))
        self.config = self.dir / "ssh_config"
        self.config.write_text("\n".join([
            "Host *",
            "  User root",
            f"  Port {PORT}",
            f"  IdentityFile {self.identity}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.known_hosts}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",   # only the lab's own host key is trusted
            "  BatchMode yes",
            "  ConnectTimeout 10",
            "  LogLevel ERROR",
            ""]))
        self.bin = self.dir / "bin"
        self.bin.mkdir()
        for tool in ("ssh", "scp"):
            wrapper = self.bin / tool
            wrapper.write_text(f"#!/bin/sh\nexec {shutil.which(tool)} -F {shlex.quote(str(self.config))} \"$@\"\n")
            wrapper.chmod(0o755)

    def ssh_argv(self, address: str, remote: str) -> list[str]:
        return ["ssh", "-F", str(self.config), "--", address, remote]   # "--": the address is never an option

    def env_path(self, path: str | None = None) -> str:
        """PATH with the wrappers first (for tools that run plain `ssh`)."""
        return f"{self.bin}:{path if path is not None else os.environ.get('PATH', '')}"

    def sshd_config(self, address: str, name: str) -> Path:
        path = self.dir / f"sshd_{name}.conf"
        path.write_text("\n".join([
            f"ListenAddress {address}:{PORT}",   # the host's lab address only, never 0.0.0.0
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "UsePAM no",
            "StrictModes no",                    # the kit lives under /tmp
            f"PidFile {self.dir}/sshd_{name}.pid",
            "Subsystem sftp internal-sftp",       # scp copies over sftp
            "AllowTcpForwarding no",
            "X11Forwarding no",
            "PrintMotd no",
            "LogLevel ERROR",
            ""]))
        return path

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def write_hostname_at_lab_address(lab, host: int) -> Path:
    """/etc/netns/<ns>/hosts: localhost, and this machine's hostname at the host's lab address (for
    what `ip netns exec` starts there). Returns its folder, for the caller to remove."""
    return write_netns_hosts(lab, host, {socket.gethostname(): lab.addr(host)})


class SshLab:
    """Context manager: an sshd in each of `hosts` of a NetLab (all by default), stopped and the kit
    removed on exit. `addr(h)` and `ssh_argv(h, cmd)` address a host by its lab index."""

    def __init__(self, lab, hosts: Sequence[int] | None = None):
        reason = unavailable_reason()
        if reason:
            raise ConfigError(f"cannot start sshd on lab hosts: {reason}")
        self.lab = lab
        self.hosts = list(range(lab.hosts)) if hosts is None else list(hosts)
        self.kit: SshKit | None = None
        self.procs: list[subprocess.Popen] = []
        self.netns_etc: list[Path] = []

    def __enter__(self) -> "SshLab":
        try:
            self.kit = SshKit([self.lab.addr(h) for h in range(self.lab.hosts)])
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
            for h in self.hosts:
                self._write_hosts(h)
                conf = self.kit.sshd_config(self.lab.addr(h), f"h{h}")
                self.procs.append(self.lab.exec(h, [SSHD, "-D", "-e", "-f", str(conf)], stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            for h, proc in zip(self.hosts, self.procs):
                try:
                    self.lab.wait_listening(h, PORT, timeout=15)
                except TimeoutError:
                    err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
                    raise RuntimeError(f"sshd on host {h} did not start: {err.strip()}") from None
        except BaseException:
            self.__exit__()
            raise
        return self

    def _write_hosts(self, host: int) -> None:
        self.netns_etc.append(write_hostname_at_lab_address(self.lab, host))

    def __exit__(self, *exc) -> None:
        from psbench.core.supervisor import stop_tree

        stop_tree(self.procs, 2.0)
        for proc in self.procs:
            if proc.stderr:
                proc.stderr.close()
        self.procs.clear()
        for folder in self.netns_etc:
            shutil.rmtree(folder, ignore_errors=True)
        self.netns_etc.clear()
        if self.kit is not None:
            self.kit.remove()

    def addr(self, host: int) -> str:
        return self.lab.addr(host)

    def ssh_argv(self, host: int, remote: str) -> list[str]:
        assert self.kit is not None
        return self.kit.ssh_argv(self.addr(host), remote)
