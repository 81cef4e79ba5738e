#!/usr/bin/env bash
# Debian's Slurm (slurmctld, slurmd, sbatch/srun) and MUNGE for tests/test_slurm.py: the lab
# (psbench/bench/lab/slurm.py) runs its own munged, slurmctld and slurmd per network-namespace host
# under a temp folder. The packages' own services are never started (policy-rc.d says no while they install).
set -euo pipefail
if command -v slurmctld slurmd sbatch srun munged mungekey >/dev/null; then
  exit 0
fi
policy=/usr/sbin/policy-rc.d
made=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made=1
fi
trap '[ "$made" = 1 ] && rm -f "$policy"' EXIT
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge
echo ".ci/install-slurm.sh: $(slurmctld -V 2>&1 | head -1 || true), $(munged -V 2>&1 | head -1 || true)"
