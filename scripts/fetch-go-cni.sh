#!/bin/bash
# fetch-go-cni.sh - fetch and unpack the pinned CNI library (Go) the plugin rdmad-cni builds on.
#
#   scripts/fetch-go-cni.sh             fetch it when missing (root); print its GOPATH entry
#   scripts/fetch-go-cni.sh --present   print its GOPATH entry, or fail: never fetches
#                                       (scripts/go.sh, and so the .deb build, stay offline)
#
# Environment: RDMAD_GOCODE_CACHE (default /opt/rdmad-gocode), RDMAD_DEBIAN_MIRROR /
#              RDMAD_DEBIAN_SECURITY_MIRROR (default: what the host's apt sources name).
#
# The CNI project's library (skel, types, invoke, version) with the spec's GC and STATUS
# verbs is 1.2 and later; bookworm's and trixie's golang-github-appc-cni-dev are 1.1.2, so
# forky's 1.3.0 (CNI spec 1.1.0) is fetched through a private apt state
# (scripts/private-apt.sh), as scripts/fetch-containerd.sh fetches trixie's containerd, and
# unpacked with `dpkg-deb -x`, never installed: its usr/share/gocode is a GOPATH entry laid
# out as Debian's other Go libraries are. It is Go source only (Architecture: all); what it
# imports is the standard library and vishvananda/netns, bookworm's (scripts/bootstrap.sh).
set -euo pipefail

# shellcheck source=./private-apt.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"

CNI_PKG=golang-github-appc-cni-dev
CNI_VERSION=1.3.0-2
CACHE=${RDMAD_GOCODE_CACHE:-/opt/rdmad-gocode}

say() { echo "[fetch-go-cni] $*" >&2; }
die() { echo "[fetch-go-cni] ERROR: $*" >&2; exit 1; }

pin="$CNI_PKG=$CNI_VERSION"
out="$CACHE/$CNI_PKG"
case ${1:-} in
    "") fetch_unpacked "$pin" "$out" forky ;;
    --present)
        [ "$(cat "$out/.complete" 2>/dev/null)" = "$pin" ] \
            || die "$pin is not unpacked in $out: run scripts/fetch-go-cni.sh as root (make setup does)" ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1" ;;
esac
[ -f "$out/usr/share/gocode/src/github.com/containernetworking/cni/pkg/skel/skel.go" ] \
    || die "no pkg/skel in $out"
echo "$out/usr/share/gocode"
