"""Horovod's gloo controller without horovodrun: what horovodrun's gloo_run does for the ranks it
starts, done by ranks an engine started. The ranks' hosts give Horovod's slot plan (rank, local and
cross ranks and sizes); rank 0 serves Horovod's rendezvous (its RendezvousHTTPServer, bound to one
address rather than every interface) and each rank gets the environment hvd.init() reads, made by
horovodrun's own functions."""
from __future__ import annotations

import socket
import threading
from typing import Sequence

from psbench.core.errors import ConfigError
from psbench.core.exposure import is_loopback


def slot_plan(hosts: Sequence[str]) -> list:
    """Horovod's SlotInfo of each rank, rank r running on hosts[r]: local ranks in rank order within
    a host, cross ranks (the ranks of one local rank across hosts) in the order the hosts first
    appear. For ranks placed host by host this is horovodrun's get_host_assignments; it also holds
    when an engine interleaves them (Slurm's cyclic distribution)."""
    from horovod.runner.common.util.hosts import SlotInfo

    order = list(dict.fromkeys(hosts))
    ranks_on = {host: [r for r, h in enumerate(hosts) if h == host] for host in order}
    plan = []
    for rank, host in enumerate(hosts):
        local_rank = ranks_on[host].index(rank)
        cross = [h for h in order if len(ranks_on[h]) > local_rank]   # hosts with a rank of this local rank
        plan.append(SlotInfo(hostname=host, rank=rank, local_rank=local_rank, cross_rank=cross.index(host),
                             size=len(hosts), local_size=len(ranks_on[host]), cross_size=len(cross)))
    return plan


def interface_of(address: str) -> str:
    """The network interface that holds `address` (gloo's HOROVOD_GLOO_IFACE): `lo` for loopback."""
    if is_loopback(address):
        return "lo"
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise ConfigError(f"no network interface of this host holds {address}: name one with --network-interface")


def hostname_address() -> str:
    """The address this host's hostname resolves to first, as gloo's hostname lookup finds it ('' if
    it does not resolve)."""
    try:
        return str(socket.getaddrinfo(socket.gethostname(), None, socket.AF_UNSPEC, socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return ""


def check_hostnames(hosts: Sequence[str], hostname_addresses: Sequence[str]) -> None:
    """Across hosts, every host's hostname must resolve beyond loopback: Horovod 0.28's gloo makes
    its process sets' device from the hostname (HOROVOD_GLOO_IFACE is used for the global context
    only), so a host whose hostname says 127.0.x.x advertises loopback to its peers and the job
    aborts in gloo's connect. On one host loopback is right."""
    if len(set(hosts)) < 2:
        return
    bad = sorted({(host, addr) for host, addr in zip(hosts, hostname_addresses) if is_loopback(addr)})
    if bad:
        host, addr = bad[0]
        raise ConfigError(f"horovod across hosts: the hostname of host {host} resolves to {addr}; Horovod's gloo "
                          f"binds its process sets to the hostname's address (HOROVOD_GLOO_IFACE notwithstanding), "
                          f"which its peers cannot reach: map the hostname to {host} in that host's /etc/hosts")


def rank_env(slot, rendezvous_addr: str, rendezvous_port: int, interface: str) -> dict[str, str]:
    """The variables horovodrun's gloo_run gives this slot's process: its rank and sizes, the
    rendezvous, the gloo controller and CPU operations, the interface."""
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    return {k: str(v) for k, v in {**create_slot_env_vars(slot),
                                   **create_run_env_vars(rendezvous_addr, [interface], rendezvous_port)}.items()}


class Rendezvous:
    """Horovod's rendezvous server for `plan`, on `host` only (a free port): the KV store the ranks'
    gloo contexts meet in. It has no authentication, as under horovodrun."""

    def __init__(self, host: str, plan: list) -> None:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        try:
            self.httpd = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
        except OSError as exc:
            raise ConfigError(f"cannot listen for Horovod's rendezvous on {host}: {exc.strerror}") from None
        self.httpd.init(plan)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="horovod-rendezvous", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
