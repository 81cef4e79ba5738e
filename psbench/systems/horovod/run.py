"""horovodrun, kept on loopback: `python -m psbench.systems.horovod.run ARGS` runs horovodrun's own command
line (horovod.runner.launch) with ARGS. With PSBENCH_HOROVOD_LOOPBACK=1 (the adapter sets it for
localhost-only runs) horovodrun's rendezvous and helper HTTP servers bind 127.0.0.1 instead of every
interface (Horovod's find_port binds ('', port)); nothing else about horovodrun changes."""
from __future__ import annotations

import os
import sys

LOOPBACK_ENV = "PSBENCH_HOROVOD_LOOPBACK"


def _bind_loopback() -> None:
    import horovod.runner.common.util.network as common_network
    import horovod.runner.http.http_server as http_server
    import horovod.runner.util.network as network

    original = network.find_port

    def find_port(server_factory):
        return original(lambda addr: server_factory(("127.0.0.1", addr[1])))

    for module in (network, http_server, common_network):
        module.find_port = find_port


def main() -> None:
    if os.environ.get(LOOPBACK_ENV) == "1":
        _bind_loopback()
    from horovod.runner.launch import run_commandline

    sys.argv[0] = "horovodrun"
    sys.exit(run_commandline())


if __name__ == "__main__":
    main()
