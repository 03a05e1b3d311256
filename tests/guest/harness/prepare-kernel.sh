#!/bin/bash
# prepare-kernel.sh - fetch and unpack the pinned guest kernels + virtme-ng into the cache.
#
#   tests/guest/harness/prepare-kernel.sh [[--kernel] 6.1|7.3|all]   (default: all)
#
# Environment: RDMAD_GUEST_CACHE (default /opt/rdmad-guest),
#              RDMAD_DEBIAN_MIRROR / RDMAD_DEBIAN_SECURITY_MIRROR (default: what the host's
#              apt sources name).
#
# Kernels are unpacked (dpkg-deb -x + depmod -b), never installed: the host's /boot,
# initramfs hooks and dpkg database stay untouched. The .debs are fetched through a private
# apt state (scripts/private-apt.sh), which leaves the host's apt configuration alone too.
# Idempotent: each kernel dir carries a .complete stamp naming its pin; re-runs are no-ops.
# Layout: $CACHE/k-6.1/{boot/vmlinuz-KVER,lib/modules/KVER}, $CACHE/k-7.3/..., $CACHE/vng-venv
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=./pins.sh source-path=SCRIPTDIR
. "$HERE/pins.sh"
# shellcheck source=../../../scripts/private-apt.sh
. "$HERE/../../../scripts/private-apt.sh"
CACHE=$RDMAD_GUEST_CACHE

say() { echo "[prepare-kernel] $*" >&2; }
die() { echo "[prepare-kernel] ERROR: $*" >&2; exit 1; }

which=all
while [ $# -gt 0 ]; do
    case $1 in
        --kernel) which=${2:?--kernel needs 6.1, 7.3 or all}; shift 2 ;;
        --kernel=*) which=${1#--kernel=}; shift ;;
        -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
        6.1|7.3|all) which=$1; shift ;;
        *) die "unknown argument: $1" ;;
    esac
done
case $which in 6.1|7.3|all) ;; *) die "--kernel must be 6.1, 7.3 or all" ;; esac

[ "$(id -u)" = 0 ] || die "run as root (depmod of the unpacked tree, cache under /opt)"
for c in apt-get dpkg-deb depmod python3; do
    command -v "$c" >/dev/null || die "$c missing: run scripts/bootstrap.sh first"
done
case $CACHE in
    /var/cache/*|/var/lib/apt/*|/tmp/*) die "RDMAD_GUEST_CACHE=$CACHE is hidden inside the guest; use e.g. /opt/rdmad-guest" ;;
esac
mkdir -p "$CACHE"
# One preparer at a time (two CI jobs on one box, or run-guest-tests racing a manual run).
exec 9>"$CACHE/.lock"
flock 9

pin61="$KERNEL_61_PKG=$KERNEL_61_VERSION"
pin73="$KERNEL_73_PKGS=$KERNEL_73_VERSION"
need61=0; need73=0
if [ "$which" != 7.3 ] && [ "$(cat "$CACHE/k-6.1/.complete" 2>/dev/null)" != "$pin61" ]; then need61=1; fi
if [ "$which" != 6.1 ] && [ "$(cat "$CACHE/k-7.3/.complete" 2>/dev/null)" != "$pin73" ]; then need73=1; fi

# ------------------------------------------------------------------ private apt state
if [ "$need61" = 1 ] || [ "$need73" = 1 ]; then
    st=$(mktemp -d "$CACHE/apt.XXXXXX")
    trap 'rm -rf "$st"' EXIT
    private_apt_state "$st"
    {
        if [ "$need61" = 1 ]; then
            for s in $KERNEL_61_SUITES; do echo "deb ${SIGNED_BY}$MIRROR $s main"; done
            echo "deb ${SIGNED_BY}$SECMIRROR bookworm-security main"
        fi
        if [ "$need73" = 1 ]; then
            for s in $KERNEL_73_SUITES; do echo "deb ${SIGNED_BY}$MIRROR $s main"; done
        fi
    } > "$st/sources.list"
    private_apt_update "$st"

    # fetch NAME=VERSION ...: fail with bump instructions when a pin left the archive
    fetch() {
        local spec missing=()
        for spec in "$@"; do in_archive "$spec" || missing+=("$spec"); done
        if [ ${#missing[@]} -gt 0 ]; then
            {
                echo "[prepare-kernel] ERROR: pinned package(s) no longer in the archive: ${missing[*]}"
                echo "[prepare-kernel] The archive now offers:"
                apt-cache "${APT[@]}" depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/    linux-image-amd64 -> \1/p'
                apt-cache "${APT[@]}" policy linux-image-amd64 2>/dev/null | sed -n 's/^ *Candidate: /    linux-image-amd64 candidate /p'
                for spec in "${missing[@]}"; do
                    apt-cache "${APT[@]}" policy "${spec%%=*}" 2>/dev/null | sed -n "s/^ *Candidate: /    ${spec%%=*} candidate /p"
                done
                echo "[prepare-kernel] Bump the pin in tests/guest/harness/pins.sh (package name, version,"
                echo "[prepare-kernel] KVER), run this script again and re-run the guest tests on both kernels."
            } >&2
            exit 1
        fi
        (cd "$st/debs" && apt-get "${APT[@]}" download "$@" >&2) || die "apt-get download $* failed"
    }

    if [ "$need61" = 1 ]; then
        say "fetching $pin61"
        rm -rf "$st/debs"/* "$st/x"/*
        fetch "$pin61"
        out="$CACHE/k-6.1"; rm -rf "$out"; mkdir -p "$out"
        dpkg-deb -x "$st"/debs/*.deb "$out"
        # bookworm ships /lib/modules (merged-/usr symlinks are not in the .deb)
        [ -f "$out/boot/vmlinuz-$KERNEL_61_KVER" ] || die "no boot/vmlinuz-$KERNEL_61_KVER in $KERNEL_61_PKG"
        grep -q '^CONFIG_RDMA_RXE=m' "$out/boot/config-$KERNEL_61_KVER" || die "$KERNEL_61_PKG lacks CONFIG_RDMA_RXE=m"
        # quiet: 7.3's packages lack modules.order/builtin (harmless warnings), errors still shown
        depmod -a -b "$out" "$KERNEL_61_KVER" 2>"$st/depmod.err" || { cat "$st/depmod.err" >&2; die "depmod failed"; }
        echo "$pin61" > "$out/.complete"
    fi
    if [ "$need73" = 1 ]; then
        specs=(); for p in $KERNEL_73_PKGS; do specs+=("$p=$KERNEL_73_VERSION"); done
        say "fetching ${specs[*]}"
        rm -rf "$st/debs"/* "$st/x"/*
        fetch "${specs[@]}"
        for d in "$st"/debs/*.deb; do dpkg-deb -x "$d" "$st/x"; done
        out="$CACHE/k-7.3"; rm -rf "$out"; mkdir -p "$out/boot" "$out/lib/modules"
        # trixie's packages are merged-/usr: vmlinuz sits inside usr/lib/modules/KVER
        m="$st/x/usr/lib/modules/$KERNEL_73_KVER"
        [ -f "$m/vmlinuz" ] || die "no usr/lib/modules/$KERNEL_73_KVER/vmlinuz in $KERNEL_73_PKGS"
        mv "$m/vmlinuz" "$out/boot/vmlinuz-$KERNEL_73_KVER"
        # no config file in these packages: check for the module itself
        [ -n "$(find "$m" -name 'rdma_rxe.ko*' -print -quit)" ] || die "7.3 kernel has no rdma_rxe module"
        mv "$m" "$out/lib/modules/"
        # quiet: 7.3's packages lack modules.order/builtin (harmless warnings), errors still shown
        depmod -a -b "$out" "$KERNEL_73_KVER" 2>"$st/depmod.err" || { cat "$st/depmod.err" >&2; die "depmod failed"; }
        echo "$pin73" > "$out/.complete"
    fi
fi

# ------------------------------------------------------------------ virtme-ng
VENV="$CACHE/vng-venv"
if [ "$(cat "$VENV/.complete" 2>/dev/null)" != "virtme-ng==$VNG_VERSION" ]; then
    say "pip install virtme-ng==$VNG_VERSION into $VENV"
    rm -rf "$VENV"
    # the system python: the guest sees the host root, but vng itself only runs on the host
    python3 -m venv "$VENV" >&2 || die "venv for virtme-ng failed (python3-venv?)"
    "$VENV/bin/pip" install -q "virtme-ng==$VNG_VERSION" >&2 || die "pip install virtme-ng==$VNG_VERSION failed"
    echo "virtme-ng==$VNG_VERSION" > "$VENV/.complete"
fi
# vng expects /lib/modules on the host root even when booting a kernel from elsewhere
[ -d /lib/modules ] || mkdir -p /lib/modules

for k in 6.1 7.3; do
    if [ "$which" = all ] || [ "$which" = "$k" ]; then echo "$CACHE/k-$k"; fi
done
