#!/usr/bin/env bash
# Debian's OpenSSH server and client for the cross-host tests (tests/test_ssh_launcher.py,
# tests/test_horovod_hosts.py): they run their own sshd inside network namespaces, bound to a
# 198.18 address. The package's own service is never started (policy-rc.d says no while it installs).
set -euo pipefail
if [ -x /usr/sbin/sshd ] && command -v ssh scp ssh-keygen >/dev/null; then
  exit 0
fi
policy=/usr/sbin/policy-rc.d
made=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made=1
fi
trap '[ "$made" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server openssh-client
echo ".ci/install-openssh.sh: $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
