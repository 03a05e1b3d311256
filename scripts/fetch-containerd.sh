#!/bin/bash
# fetch-containerd.sh - fetch and unpack the pinned containerd for the CRI tests (tests/cri).
#
#   scripts/fetch-containerd.sh        prints the unpacked tree's dir, $CACHE/containerd2
#                                      (its usr/bin holds containerd, ctr and
#                                      containerd-shim-runc-v2)
#
# Environment: RDMAD_CONTAINERD_CACHE (default /opt/rdmad-containerd),
#              RDMAD_DEBIAN_MIRROR / RDMAD_DEBIAN_SECURITY_MIRROR (default: what the host's
#              apt sources name).
#
# The CRI tests run on containerd 2 (Kubernetes after 1.35 supports no 1.x): Debian sid's 2.1,
# whose binaries run on bookworm (they need glibc 2.34). bookworm's containerd (1.6) is
# too old for them. So the package is fetched as tests/guest/harness/prepare-kernel.sh
# fetches the 7.3 kernel, through a private apt state (scripts/private-apt.sh), then
# `dpkg-deb -x` into the cache, never installed. Its runtime is bookworm's runc, which
# scripts/bootstrap.sh installs. Idempotent: the tree carries a .complete stamp naming its
# pin; a re-run is a no-op. A pin gone from the archive fails: bump CONTAINERD_VERSION (a
# 2.x release; the tests write its version 3 config).
set -euo pipefail

# shellcheck source=./private-apt.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"

CONTAINERD_PKG=containerd
CONTAINERD_VERSION=2.1.9+ds1-5
CACHE=${RDMAD_CONTAINERD_CACHE:-/opt/rdmad-containerd}

say() { echo "[fetch-containerd] $*" >&2; }
die() { echo "[fetch-containerd] ERROR: $*" >&2; exit 1; }

case ${1:-} in
    "") ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1" ;;
esac

pin="$CONTAINERD_PKG=$CONTAINERD_VERSION"
out="$CACHE/containerd2"
fetch_unpacked "$pin" "$out" sid
for b in containerd ctr containerd-shim-runc-v2; do
    [ -x "$out/usr/bin/$b" ] || die "no usr/bin/$b in $pin"
done
echo "$out"
