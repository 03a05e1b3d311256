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
# Idempotent: the tree carries a .complete stamp naming its pin; a re-run is a no-op.
set -euo pipefail

# shellcheck source=./private-apt.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"

CONTAINERD_PKG=containerd
CONTAINERD_VERSION=1.7.24~ds1-6+deb13u1
CONTAINERD_SUITES="trixie trixie-updates"   # + trixie-security from the security URI
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
if [ "$(cat "$out/.complete" 2>/dev/null)" = "$pin" ]; then
    echo "$out"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (the cache is under /opt)"
for c in apt-get apt-cache dpkg-deb flock; do
    command -v "$c" >/dev/null || die "$c missing: run scripts/bootstrap.sh on a Debian host"
done
mkdir -p "$CACHE"
# One fetcher at a time (a CI job racing a manual run); the winner's stamp ends the loser's wait.
exec 9>"$CACHE/.lock"
flock 9
if [ "$(cat "$out/.complete" 2>/dev/null)" = "$pin" ]; then
    echo "$out"
    exit 0
fi

# ------------------------------------------------------------------ private apt state
st=$(mktemp -d "$CACHE/apt.XXXXXX")
trap 'rm -rf "$st"' EXIT
private_apt_state "$st"
{
    for s in $CONTAINERD_SUITES; do echo "deb ${SIGNED_BY}$MIRROR $s main"; done
    echo "deb ${SIGNED_BY}$SECMIRROR trixie-security main"
} > "$st/sources.list"
private_apt_update "$st"

if ! in_archive "$pin"; then
    {
        echo "[fetch-containerd] ERROR: the pinned $pin is no longer in the archive; it offers:"
        apt-cache "${APT[@]}" madison "$CONTAINERD_PKG" 2>/dev/null | sed 's/^/    /'
        echo "[fetch-containerd] Bump CONTAINERD_VERSION in scripts/fetch-containerd.sh (a 1.7"
        echo "[fetch-containerd] release, for CRI's CDIDevices), run it again and run tests/cri."
    } >&2
    exit 1
fi
say "fetching $pin"
(cd "$st/debs" && apt-get "${APT[@]}" download "$pin" >&2) || die "apt-get download $pin failed"
dpkg-deb -x "$st"/debs/*.deb "$st/x"
for b in containerd ctr containerd-shim-runc-v2; do
    [ -x "$st/x/usr/bin/$b" ] || die "no usr/bin/$b in $pin"
done
rm -rf "$out"
mv "$st/x" "$out"
echo "$pin" > "$out/.complete"
say "unpacked into $out"
echo "$out"
