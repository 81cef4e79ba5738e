#!/usr/bin/env bash
# Makes sure a Docker engine answers. When none does, starts dockerd (needs root) with
# docker/daemon.json: its bridge and address pools lie in 198.19.0.0/16 and it leaves the host's
# firewall and forwarding alone. Prints "started PID" when it started one, "running" otherwise.
# A running engine whose default bridge lies outside 198.18.0.0/15 is refused (exit 2).
set -euo pipefail
cd "$(dirname "$0")/.."
check_bridge() {
  local subnets
  subnets=$(docker network inspect bridge --format '{{range .IPAM.Config}}{{.Subnet}} {{end}}' 2>/dev/null || true)
  python3 - "$subnets" <<'PY' || { echo "psbench: error: docker's bridge network is $subnets, outside 198.18.0.0/15; start dockerd with --config-file docker/daemon.json" >&2; exit 2; }
import ipaddress, sys
allowed = ipaddress.ip_network("198.18.0.0/15")
sys.exit(0 if all(ipaddress.ip_network(s).subnet_of(allowed) for s in sys.argv[1].split()) else 1)
PY
}
if docker info >/dev/null 2>&1; then check_bridge; echo running; exit 0; fi
command -v dockerd >/dev/null || { echo "psbench: error: dockerd is not installed (bash docker/ci-setup.sh installs Debian's docker.io)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "psbench: error: starting dockerd needs root" >&2; exit 2; }
mkdir -p .cache/docker
nohup dockerd --config-file docker/daemon.json >.cache/docker/dockerd.log 2>&1 </dev/null &
pid=$!
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && { check_bridge; echo "started $pid"; exit 0; }
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
tail -20 .cache/docker/dockerd.log >&2
echo "psbench: error: dockerd did not come up (log: .cache/docker/dockerd.log)" >&2
exit 1
