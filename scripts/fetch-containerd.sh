#!/bin/bash
# fetch-containerd.sh - fetch and unpack the pinned containerd for the CRI tests (tests/cri).
#
#   scripts/fetch-containerd.sh        prints the unpacked tree's dir (its usr/bin holds
#                                      containerd, ctr and containerd-shim-runc-v2)
#
# Environment: RDMAD_CONTAINERD_CACHE (default /opt/rdmad-containerd),
#              RDMAD_DEBIAN_MIRROR / RDMAD_DEBIAN_SECURITY_MIRROR (default: what the host's
#              apt sources name).
#
# bookworm's containerd (1.6) cannot hand CDI devices from CRI's CDIDevices field to the
# runtime; trixie's 1.7.24 can, and its binaries run on bookworm (they need glibc 2.34).
# So the package is fetched as tests/guest/harness/prepare-kernel.sh fetches the 7.3 kernel,
# through a private apt state (scripts/private-apt.sh), then `dpkg-deb -x` into the cache,
# never installed. Its runtime is bookworm's runc, which scripts/bootstrap.sh installs.
# Idempotent: the tree carries a .complete stamp naming its pin; a re-run is a no-op. A pin
# gone from the archive fails: bump CONTAINERD_VERSION (a 1.7 release, for CRI's CDIDevices).
set -euo pipefail

# shellcheck source=./private-apt.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"

CONTAINERD_PKG=containerd
CONTAINERD_VERSION=1.7.24~ds1-6+deb13u1
CACHE=${RDMAD_CONTAINERD_CACHE:-/opt/rdmad-containerd}

say() { echo "[fetch-containerd] $*" >&2; }
die() { echo "[fetch-containerd] ERROR: $*" >&2; exit 1; }

case ${1:-} in
    "") ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1" ;;
esac

pin="$CONTAINERD_PKG=$CONTAINERD_VERSION"
out="$CACHE/containerd"
fetch_unpacked "$pin" "$out" trixie trixie-updates trixie-security
for b in containerd ctr containerd-shim-runc-v2; do
    [ -x "$out/usr/bin/$b" ] || die "no usr/bin/$b in $pin"
done
echo "$out"
