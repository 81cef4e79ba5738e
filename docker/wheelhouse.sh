#!/usr/bin/env bash
# Builds docker/wheelhouse/: a wheel of every Python package the image installs (the project's
# dependencies with the spark extra, and the build backend), built on the host with pip, so the
# image builds with no index at all (`pip install --no-index --find-links /wheels`). pip takes
# the CPU torch wheel from this machine's disk. Idempotent: skips when the stamp matches
# pyproject.toml (FORCE=1 rebuilds).
#   usage: docker/wheelhouse.sh [PYTHON]
set -euo pipefail
py=${1:-python3}
cd "$(dirname "$0")/.."
out=docker/wheelhouse
# The image's Python is 3.11 (Debian bookworm's, or python:3.11-slim): wheels must be cp311.
"$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "psbench: error: the wheelhouse needs Python 3.11 (the image's); $py is $("$py" -V 2>&1)" >&2; exit 2; }
stamp=$out/.stamp
want=$(sha1sum pyproject.toml | cut -c1-40)
if [ "${FORCE:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "wheelhouse $out is up to date"; exit 0
fi
"$py" - >"$out/requirements.txt" <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["spark"]))
PY
# the build backend the image's `pip install .` needs (pyproject's [build-system]), and pip itself
"$py" - >"$out/build-requirements.txt" <<'PY'
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"] + ["wheel", "pip"]))
PY
"$py" -m pip wheel -q --wheel-dir "$out" -r "$out/requirements.txt" -r "$out/build-requirements.txt"
echo "$want" >"$stamp"
echo "wheelhouse $out: $(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1)"
