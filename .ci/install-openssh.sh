#!/usr/bin/env bash
# Debian's OpenSSH server and client for the cross-host tests (tests/test_ssh_launcher.py,
# tests/test_horovod_hosts.py): they run their own sshd inside network namespaces, bound to a
# 198.18 address. The package's own service is never started (.ci/apt-install.sh).
set -euo pipefail
# every tool, one by one: `command -v a b` succeeds when any one is found
have=1
for tool in ssh scp ssh-keygen; do command -v "$tool" >/dev/null || have=0; done
if [ -x /usr/sbin/sshd ] && [ "$have" = 1 ]; then
  exit 0
fi
"$(dirname "$0")/apt-install.sh" openssh-server openssh-client
echo ".ci/install-openssh.sh: $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
