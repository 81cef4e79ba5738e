#!/usr/bin/env bash
# Build a Horovod 0.28.1 wheel (PyTorch + Gloo, CPU only, no MPI/TF/MXNet) against the
# torch that is installed in PYTHON's environment, with the C++17 patch from patches/.
#
# usage: build_wheel.sh PYTHON CACHE_DIR
#   PYTHON     interpreter whose environment has torch installed (the wheel is built for it)
#   CACHE_DIR  where the finished wheel is kept; CACHE_DIR/build.log holds the build log
#
# Prints the path of the wheel on stdout (and nothing else there); progress goes to stderr.
# If CACHE_DIR already holds horovod-0.28.1-*.whl, prints that and exits 0 without building.
#
# Tunables (environment): HOROVOD_BUILD_JOBS (default: nproc), HOROVOD_KEEP_BUILD_DIR=1 to
# keep the temporary source/build tree, HOROVOD_BUILD_ARCH_FLAGS (passed through to Horovod's
# CMake; default there is "-mf16c -mavx -mfma").
set -euo pipefail

HVD_VERSION=0.28.1

if [[ $# -ne 2 ]]; then
    echo "usage: $(basename "$0") PYTHON CACHE_DIR" >&2
    exit 2
fi
PYTHON=$1
CACHE_DIR=$2
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PATCH_FILE="$SCRIPT_DIR/patches/horovod-${HVD_VERSION}-torch2.13.patch"

log() { echo "[build_wheel] $*" >&2; }

# ---- cached? ----------------------------------------------------------------------------
mkdir -p "$CACHE_DIR"
CACHE_DIR=$(cd "$CACHE_DIR" && pwd)
shopt -s nullglob
cached=("$CACHE_DIR"/horovod-"$HVD_VERSION"-*.whl)
shopt -u nullglob
if [[ ${#cached[@]} -gt 0 ]]; then
    log "cached wheel found, not rebuilding (delete it to force a rebuild)"
    echo "${cached[0]}"
    exit 0
fi

LOG="$CACHE_DIR/build.log"
: > "$LOG"

fail() {
    echo "[build_wheel] FAILED: $*" >&2
    echo "[build_wheel] last 40 lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
}

# ---- prerequisites ------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || [[ -x "$PYTHON" ]] || { echo "PYTHON '$PYTHON' not found" >&2; exit 2; }
[[ -f "$PATCH_FILE" ]] || { echo "patch not found: $PATCH_FILE" >&2; exit 2; }
for tool in tar patch make c++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "missing build tool: $tool (apt-get install build-essential patch)" >&2; exit 2; }
done

# torch must already be installed: the extension is compiled against its headers and libs.
if ! "$PYTHON" -c 'import torch' >>"$LOG" 2>&1; then
    fail "'$PYTHON -c \"import torch\"' failed; install torch into that environment first"
fi

# Python build requirements. setup.py imports packaging, and (setup_requires) asks setuptools
# to fetch cloudpickle/psutil/pyyaml/packaging/cffi if they are missing, so install them up front.
missing=()
"$PYTHON" -c 'import setuptools' 2>/dev/null || missing+=(setuptools)
"$PYTHON" -c 'import wheel' 2>/dev/null || missing+=(wheel)
"$PYTHON" -c 'import packaging' 2>/dev/null || missing+=(packaging)
"$PYTHON" -c 'import cloudpickle' 2>/dev/null || missing+=(cloudpickle)
"$PYTHON" -c 'import psutil' 2>/dev/null || missing+=(psutil)
"$PYTHON" -c 'import yaml' 2>/dev/null || missing+=(pyyaml)
"$PYTHON" -c 'import cffi' 2>/dev/null || missing+=(cffi)
# Horovod needs CMake >= 3.13 (setup.py would otherwise try to pip-install cmake~=3.13 itself).
if ! command -v cmake >/dev/null 2>&1 || \
   ! "$PYTHON" - "$(cmake --version | head -n1)" <<'PY' >/dev/null 2>&1
import re, sys
v = tuple(int(x) for x in re.search(r"(\d+)\.(\d+)", sys.argv[1]).groups())
sys.exit(0 if v >= (3, 13) else 1)
PY
then
    missing+=("cmake>=3.13,<4")
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing build requirements into $PYTHON's environment: ${missing[*]}"
    "$PYTHON" -m pip install "${missing[@]}" >>"$LOG" 2>&1 || fail "pip install ${missing[*]}"
fi
# A pip-installed cmake lives next to PYTHON; put that bin dir first so it is found.
PY_BIN_DIR=$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')")
export PATH="$PY_BIN_DIR:$PATH"

# ---- fetch, patch, build ------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
cleanup() {
    if [[ "${HOROVOD_KEEP_BUILD_DIR:-0}" == 1 ]]; then
        log "kept build tree: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

start=$(date +%s)
log "downloading horovod==$HVD_VERSION sdist (log: $LOG)"
"$PYTHON" -m pip download --no-deps --no-binary :all: --no-build-isolation \
    "horovod==$HVD_VERSION" -d "$WORK/sdist" >>"$LOG" 2>&1 || fail "pip download horovod==$HVD_VERSION"
tar -xzf "$WORK/sdist/horovod-$HVD_VERSION.tar.gz" -C "$WORK" >>"$LOG" 2>&1 || fail "extracting the sdist"
SRC="$WORK/horovod-$HVD_VERSION"

log "applying $(basename "$PATCH_FILE")"
(cd "$SRC" && patch -p1 --forward < "$PATCH_FILE") >>"$LOG" 2>&1 || fail "applying $PATCH_FILE"
# Without debug information: RelWithDebInfo's -g is about a third of the compile's CPU (the torch
# extension's heaviest source, mpi_ops_v2.cc: 43.2 and 52.2 s user with it, 32.3 and 29.2 s
# without) and 97 % of its object file, and nothing here reads it. Horovod's optimisation flags
# (-O3 -DNDEBUG and the arch flags) stay as they are: the same code.
sed -i 's/^string(REPLACE "-O2" "-O3" \(CMAKE_[A-Z]*_FLAGS_RELWITHDEBINFO\) .*/&\nstring(REPLACE "-g" "" \1 "${\1}")/' \
    "$SRC/CMakeLists.txt"
[[ $(grep -c '^string(REPLACE "-g" ""' "$SRC/CMakeLists.txt") -eq 3 ]] || fail "dropping -g from $SRC/CMakeLists.txt"

JOBS=${HOROVOD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
log "building the wheel with $JOBS make jobs (takes a few minutes; tail -f $LOG)"
# MAKEFLAGS replaces setup.py's hard-coded `make -j8` (too many for small machines).
env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$JOBS" \
    "$PYTHON" -m pip wheel --no-build-isolation --no-deps -v -w "$WORK/dist" "$SRC" \
    >>"$LOG" 2>&1 || fail "building the wheel"

shopt -s nullglob
built=("$WORK"/dist/horovod-"$HVD_VERSION"-*.whl)
shopt -u nullglob
[[ ${#built[@]} -eq 1 ]] || fail "expected one wheel in $WORK/dist, found ${#built[@]}"
name=$(basename "${built[0]}")

# The torch extension must really be in the wheel (a framework that CMake silently skipped
# would still give a "successful" wheel).
"$PYTHON" - "${built[0]}" <<'PY' >>"$LOG" 2>&1 || fail "wheel has no horovod/torch/mpi_lib_v2 extension"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(0 if any(n.startswith("horovod/torch/mpi_lib_v2") and n.endswith(".so") for n in names) else 1)
PY

# Atomic publish: copy under a temporary name in CACHE_DIR, then rename.
tmp="$CACHE_DIR/.$name.tmp.$$"
cp "${built[0]}" "$tmp"
mv -f "$tmp" "$CACHE_DIR/$name"
log "built $name in $(( $(date +%s) - start ))s"
echo "$CACHE_DIR/$name"
