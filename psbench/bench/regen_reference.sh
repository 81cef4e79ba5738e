#!/usr/bin/env bash
# Regenerate the reference results from ONE clean commit, resumably, across as many working
# stretches as it takes (about 12 hours on 2 cores: the powered sharding design ~10 h; make bench
# 54 min after a fresh clone's 4-minute set-up, measured for 70bbb091; the extras about an hour).
# Every step resumes: a complete run (its manifest) is never rerun.
#
#   bash bench/regen_reference.sh COMMIT CLONE OUT [powered|bench|all]
#
# COMMIT  the commit every run comes from; CLONE a clean clone of it (made here if missing, with its
#         own `make setup`); OUT the results folder. `powered` runs the powered sharding design only
#         (bench/experiments/extra/sharding_powered.toml); `bench` everything else (make bench, timed,
#         the extras, the documents; a later `powered` adds the powered design); `all` (default) runs it, then make bench,
#         the two extras the findings need, and the documents: the kassela report (checked against
#         10 M rows), the powered suite slimmed (`psbench slim --keep-seeds 5`) and reported,
#         thesis.md, the scale model; then every suite packed (`psbench pack`).
# Between stretches, a stopped run loses only the run in flight. Where the machine may not be kept,
# slim the powered suite and commit it as results/reference-next/ (see its README.md); the next
# stretch copies it into OUT first, so its runs count as done.
# The machine must be otherwise quiet: asynchronous runs' interleavings are what the study measures.
set -euo pipefail
usage="usage: regen_reference.sh COMMIT CLONE OUT [powered|bench|all]"
commit=${1:?$usage}
clone=${2:?$usage}
out=${3:?$usage}
what=${4:-all}
case $what in powered|bench|all) ;; *) echo "regen_reference.sh: '$what': give powered, bench or all" >&2; exit 2;; esac
here=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$(realpath -m "$out")

sha=$(git -C "$here" rev-parse --verify --quiet "$commit^{commit}") || {
  echo "regen_reference.sh: '$commit' is not a commit of $here" >&2; exit 2; }
if [ ! -d "$clone/.git" ]; then git clone --quiet "$here" "$clone"; fi
git -C "$clone" fetch --quiet "$here" '+refs/heads/*:refs/remotes/here/*'  # an existing clone: bring the new commits
git -C "$clone" checkout --quiet --detach "$sha"
if [ -n "$(git -C "$clone" status --porcelain --untracked-files=no)" ]; then
  echo "regen_reference.sh: $clone has uncommitted changes; the runs must come from a clean $commit" >&2; exit 2
fi
mkdir -p "$out"
staged="$here/results/reference-next/sharding-powered"
if [ -d "$staged" ] && [ "$what" != bench ]; then  # runs of COMMIT committed by an earlier stretch (slimmed): done, not rerun
  mkdir -p "$out/sharding-powered"
  for run in "$staged"/*/; do
    name=$(basename "$run")
    [ -f "$run/manifest.json" ] || continue
    if ! grep -q "\"git_sha\": \"$sha\"" "$run/manifest.json"; then  # another commit's run is not a run of this one
      echo "regen_reference.sh: $run is not from $commit; clear results/reference-next/ first" >&2; exit 2
    fi
    [ -e "$out/sharding-powered/$name" ] || cp -r "$run" "$out/sharding-powered/$name"
  done
fi
for manifest in "$out"/*/*/manifest.json; do  # nor may OUT hold another commit's runs
  [ -f "$manifest" ] || continue
  grep -q "\"git_sha\": \"$sha\"" "$manifest" || {
    echo "regen_reference.sh: $manifest is not from $commit; give an empty OUT or one of this commit's" >&2; exit 2; }
done
cd "$clone"
stamp() { echo "regen $(date -u +%FT%TZ) $*"; }
make setup
if [ "$what" != bench ]; then
  stamp "powered design start"
  .venv/bin/psbench run --config bench/experiments/extra/sharding_powered.toml --results-dir "$out" --no-progress
  stamp "powered design done"
  [ "$what" = powered ] && exit 0
fi

stamp "make bench start"
make bench RESULTS="$out"
stamp "make bench done; extras start"
.venv/bin/psbench bench --results-dir "$out" --no-progress \
  bench/experiments/extra/kassela_10m.toml bench/experiments/extra/throughput.toml
stamp "extras done"
.venv/bin/psbench report "$out/kassela"
if [ -d "$out/sharding-powered" ]; then
  .venv/bin/psbench slim "$out/sharding-powered" --keep-seeds 5
  .venv/bin/psbench report "$out/sharding-powered"
fi
.venv/bin/psbench thesis "$out"
.venv/bin/psbench simulate --from "$out" --out "$out/simulate"
stamp "documents done"
.venv/bin/psbench pack "$out"/*/  # each suite's folders into <suite>/records/, checked, to commit
