#!/usr/bin/env bash
# What `make test-docker` needs on a fresh Debian machine (CI runs it as root): the Docker engine
# (docker.io), compose (Debian's docker-compose), debootstrap. Idempotent: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# Should the package start a daemon, it must not take docker's default 172.17.0.0/16: our ranges first.
if [ ! -e /etc/docker/daemon.json ]; then
  mkdir -p /etc/docker && cp docker/daemon.json /etc/docker/daemon.json
fi
need=()
command -v dockerd >/dev/null || need+=(docker.io)
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "docker/ci-setup.sh: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
echo "docker/ci-setup.sh: $(dockerd --version); compose: $(docker compose version 2>/dev/null || docker-compose version --short)"
