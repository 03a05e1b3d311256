#!/bin/bash
# fetch-containerd.sh - fetch and unpack the pinned containerd for the CRI tests (tests/cri).
#
#   scripts/fetch-containerd.sh        prints the unpacked tree's dir (its usr/bin holds
#                                      containerd, ctr and containerd-shim-runc-v2)
#
# Environment: RDMAD_CONTAINERD_CACHE (default /opt/rdmad-containerd),
#              RDMAD_DEBIAN_MIRROR / RDMAD_DEBIAN_SECURITY_MIRROR (default: what the host's
#              apt sources name, else deb.debian.org).
#
# bookworm's containerd (1.6) cannot hand CDI devices from CRI's CDIDevices field to the
# runtime; trixie's 1.7.24 can, and its binaries run on bookworm (they need glibc 2.34).
# So the package is fetched the way tests/guest/harness/prepare-kernel.sh fetches the 7.3
# kernel: a private apt state (own sources.list, lists, cache; the host's apt configuration
# and dpkg database stay untouched; apt still checks the archive's signed Release files),
# then `dpkg-deb -x` into the cache, never installed. Its runtime is bookworm's runc, which
# scripts/bootstrap.sh installs.
# Idempotent: the tree carries a .complete stamp naming its pin; a re-run is a no-op.
set -euo pipefail

CONTAINERD_PKG=containerd
CONTAINERD_VERSION=1.7.24~ds1-6+deb13u1
CONTAINERD_SUITES="trixie trixie-updates"   # + trixie-security from the security URI
CACHE=${RDMAD_CONTAINERD_CACHE:-/opt/rdmad-containerd}

say() { echo "[fetch-containerd] $*" >&2; }
die() { echo "[fetch-containerd] ERROR: $*" >&2; exit 1; }

case ${1:-} in
    "") ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}"; exit 0 ;;
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

# ------------------------------------------------------------------ archive URIs
# The host's apt sources tell which mirror is reachable from here; else deb.debian.org.
host_uris() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822 "URIs: a b" and one-line "deb [opts] URI suite comps"
        awk '/^[[:space:]]*URIs:/ {for (i = 2; i <= NF; i++) print $i}
             /^[[:space:]]*deb[[:space:]]/ {i = 2; if ($i ~ /^\[/) {while (i <= NF && $i !~ /\]$/) i++; i++} print $i}' "$f"
    done
}
uris=$(host_uris || true)
MIRROR=${RDMAD_DEBIAN_MIRROR:-$(grep -E '/debian/?$' <<<"$uris" | head -1 || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECMIRROR=${RDMAD_DEBIAN_SECURITY_MIRROR:-$(grep -E '/debian-security/?$' <<<"$uris" | head -1 || true)}
SECMIRROR=${SECMIRROR:-http://deb.debian.org/debian-security}

# ------------------------------------------------------------------ private apt state
st=$(mktemp -d "$CACHE/apt.XXXXXX")
trap 'rm -rf "$st"' EXIT
mkdir -p "$st/lists/partial" "$st/cache/archives/partial" "$st/debs" "$st/x"
key=/usr/share/keyrings/debian-archive-keyring.gpg
sb=""; [ -r "$key" ] && sb="[signed-by=$key] "
{
    for s in $CONTAINERD_SUITES; do echo "deb ${sb}$MIRROR $s main"; done
    echo "deb ${sb}$SECMIRROR trixie-security main"
} > "$st/sources.list"
APT=(-o "Dir::Etc::SourceList=$st/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
     -o "Dir::State::Lists=$st/lists" -o "Dir::Cache=$st/cache"
     -o "Dir::State::status=/dev/null" -o APT::Sandbox::User=root
     -o APT::Architecture=amd64 -o APT::Architectures=amd64 -o Acquire::Languages=none)
say "apt-get update (private state: $(tr '\n' ';' < "$st/sources.list"))"
apt-get "${APT[@]}" update -qq >&2 || die "apt-get update of the private state failed"

# `apt-cache show pkg=ver` exits 0 for an unknown version: compare madison's list
if ! apt-cache "${APT[@]}" madison "$CONTAINERD_PKG" 2>/dev/null \
        | awk -F' *[|] *' -v v="$CONTAINERD_VERSION" '$2 == v {f = 1} END {exit !f}'; then
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
