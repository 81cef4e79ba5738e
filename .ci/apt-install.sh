#!/usr/bin/env bash
# apt-get install the named Debian packages without starting their services (policy-rc.d says no
# while they install): the tests run their own daemons, inside network namespaces.
set -euo pipefail
policy=/usr/sbin/policy-rc.d
made=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made=1
fi
trap '[ "$made" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
