#!/usr/bin/env bash
# Builds the offline base image (default psbench-base:bookworm) when no registry can be reached: a
# Debian rootfs made with debootstrap from Debian's packages (the mirror this machine's apt uses),
# with Python 3.11, Java 17 and the tools psbench's containers need, loaded with `docker import`.
# Idempotent: does nothing when the image exists (FORCE=1 rebuilds).
#   usage: docker/base-image.sh [IMAGE]
#          docker/base-image.sh --rootfs-only   the rootfs tarball alone (.cache/docker), no docker
#                                               needed: CI makes it while Horovod compiles
set -euo pipefail
rootfs_only=0
if [ "${1:-}" = --rootfs-only ]; then rootfs_only=1; shift; fi
image=${1:-psbench-base:bookworm}
suite=${DEBIAN_SUITE:-bookworm}
cd "$(dirname "$0")/.."
if [ "$rootfs_only" = 0 ] && [ "${FORCE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image exists"; exit 0
fi
work=.cache/docker
tarball=$work/rootfs-$suite.tar
import_image() {
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' - "$image" < "$tarball"
  echo "base image $image built"
}
if [ "${FORCE:-0}" != 1 ] && [ -s "$tarball" ]; then   # made earlier (--rootfs-only): import it
  echo "rootfs $tarball exists"
  [ "$rootfs_only" = 1 ] || import_image
  exit 0
fi
command -v debootstrap >/dev/null || { echo "psbench: error: debootstrap is missing (apt-get install debootstrap, or bash docker/ci-setup.sh)" >&2; exit 2; }

# The mirror: DEBIAN_MIRROR, else the first non-security URI of this machine's apt sources.
mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}')
fi
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '$2 !~ /security/ && $3 ~ /^'"$suite"'$/ {print $2; exit}')
fi
[ -n "$mirror" ] || { echo "psbench: error: no Debian mirror found in /etc/apt; set DEBIAN_MIRROR" >&2; exit 2; }

mkdir -p "$work"
root=$(mktemp -d "$work/rootfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase \
  --include=python3,python3-venv,openjdk-17-jre-headless,procps,iproute2,ca-certificates \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; echo "psbench: error: debootstrap failed (log: $work/debootstrap.log)" >&2; exit 1; }
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
mv "$tarball.tmp" "$tarball"   # whole or absent: a stopped build is not taken for a made one
echo "rootfs $tarball made"
[ "$rootfs_only" = 1 ] || import_image
