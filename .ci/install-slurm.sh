#!/usr/bin/env bash
# Debian's Slurm (slurmctld, slurmd, sbatch/srun) and MUNGE for tests/test_slurm.py: the lab
# (psbench/bench/lab/slurm.py) runs its own munged, slurmctld and a slurmd per network-namespace host
# under a temp folder. The packages' own services are never started (.ci/apt-install.sh).
set -euo pipefail
# every tool, one by one: `command -v a b` succeeds when any one is found
have=1
for tool in slurmctld slurmd sbatch srun sinfo munged mungekey; do command -v "$tool" >/dev/null || have=0; done
if [ "$have" = 1 ]; then
  exit 0
fi
"$(dirname "$0")/apt-install.sh" slurm-wlm munge
echo ".ci/install-slurm.sh: $(slurmctld -V 2>&1 | head -1 || true), $(munged -V 2>&1 | head -1 || true)"
