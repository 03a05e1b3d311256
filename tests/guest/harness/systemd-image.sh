#!/bin/bash
# systemd-image.sh - build (idempotent) a bookworm root with systemd as PID 1 and rdmad
# installed as a real service, for run-systemd-check.sh.
#
#   tests/guest/harness/systemd-image.sh        # prints the root dir on stdout
#
# Layout under $RDMAD_GUEST_CACHE/sdimg (default /opt/rdmad-guest/sdimg):
#   root/           the image (booted by vng --systemd --rw --root, i.e. 9p, writable)
#   .base-stamp     the mmdebstrap inputs the base was built from (a change rebuilds it)
#   .rdmad-stamp    hash of the .debs last installed (a change reinstalls)
# Layers: base (mmdebstrap, ~40 s), kernel modules (hard links), rdmad (the .debs from
# scripts/build-deb.sh: both installed, ~15 s; rdmad-dra checked and removed again), the
# probe unit. Also: rdmad-dra.facts, what the check of rdmad-dra found.
# Needs root, and prepare-kernel.sh 7.3 first (kernel modules + virtme-ng in the cache).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
# shellcheck source=./pins.sh source-path=SCRIPTDIR
. "$HERE/pins.sh"
# shellcheck source=../../../scripts/private-apt.sh
. "$REPO/scripts/private-apt.sh"
CACHE=$RDMAD_GUEST_CACHE
SD=$CACHE/sdimg
ROOT=$SD/root

die() { echo "[sdimg] ERROR: $*" >&2; exit 1; }
log() { echo "[sdimg] $*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap --mode=root, chroot)"
[ -d "$CACHE/k-7.3/lib/modules/$KERNEL_73_KVER" ] \
    || die "kernel 7.3 not prepared in $CACHE: run tests/guest/harness/prepare-kernel.sh 7.3"
command -v mmdebstrap >/dev/null || apt-get install -y -qq --no-install-recommends mmdebstrap >&2
mkdir -p "$SD"

# ------------------------------------------------------------------ base
# A node as the package expects it: the .deb's dependencies are all here, so its install
# needs no network; no compiler, no python3-venv (the venv comes built in the package).
SUITE=bookworm
# polkitd: the package recommends it (apt installs recommends; no network in the chroot).
# runc, the CNI plugins, busybox-static (the pod's image) and the verbs tools: the CRI pod
# under the kubelet's systemd cgroup driver (tests/systemd; containerd comes from the host's
# cache, scripts/fetch-containerd.sh).
INCLUDE=systemd,systemd-sysv,udev,kmod,iproute2,dbus,python3,libudev1,polkitd
INCLUDE+=,runc,containernetworking-plugins,busybox-static,ibverbs-utils,ibverbs-providers
debian_mirrors   # MIRROR: the archive the host's apt sources name (scripts/private-apt.sh)
base_stamp="$SUITE $INCLUDE $MIRROR v3"
if [ "$(cat "$SD/.base-stamp" 2>/dev/null)" != "$base_stamp" ] || [ ! -x "$ROOT/lib/systemd/systemd" ]; then
    log "building the base root with mmdebstrap ($SUITE)"
    rm -rf "$ROOT" "$SD/.base-stamp" "$SD/.rdmad-stamp"
    mmdebstrap --mode=root --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOT" "$MIRROR" >&2
    echo "$base_stamp" > "$SD/.base-stamp"
fi

# ------------------------------------------------------------------ kernel modules
# Hard links (same file system as the cache): no copy of 120 MB. /lib is /usr/lib (merged).
if [ ! -d "$ROOT/lib/modules/$KERNEL_73_KVER" ]; then
    mkdir -p "$ROOT/lib/modules"
    cp -al "$CACHE/k-7.3/lib/modules/$KERNEL_73_KVER" "$ROOT/lib/modules/"
fi

# ------------------------------------------------------------------ rdmad, rdmad-dra
# The project's Debian packages (scripts/build-deb.sh, a no-op when the sources did not
# change), installed the way a node gets them: `apt install ./rdmad_*.deb ./rdmad-dra_*.deb`
# (their dependencies are in the base: no network in the chroot). rdmad's postinst enables
# rdmad.service; starting is skipped in the chroot (no systemd running), so the unit first
# starts at the boot. rdmad-dra is checked here (installed, its unit there and not
# enabled) and removed again with apt, natively, into $SD/rdmad-dra.facts for
# run-systemd-check.sh: removing its ~3900 files is slow under emulation, and the probe's
# `apt remove rdmad` would take them with it. The guest
# boots with rdmad alone; its .deb stays in /root for the probe's reinstall.
built=$("$REPO/scripts/build-deb.sh") || die "the Debian packages did not build"
mapfile -t debs <<<"$built"
[ "${#debs[@]}" = 2 ] || die "build-deb.sh printed ${#debs[@]} paths, not rdmad's and rdmad-dra's"
rdmad_stamp=$(cat "${debs[@]}" | sha256sum | cut -d' ' -f1)
FACTS=$SD/rdmad-dra.facts
status() {   # status PACKAGE: dpkg's status of PACKAGE in the image
    dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f='${Status}' "$1" 2>/dev/null || true
}
in_image() {   # a command in the image, with a clean environment (the host's variables
               # name paths the image does not have)
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive \
        chroot "$ROOT" "$@"
}
if [ "$(cat "$SD/.rdmad-stamp" 2>/dev/null)" != "$rdmad_stamp" ] || [ ! -s "$FACTS" ] \
        || [ "$(status rdmad)" != "install ok installed" ]; then
    log "installing $(basename "${debs[0]}") and $(basename "${debs[1]}") into the image"
    rm -f "$SD/.rdmad-stamp" "$FACTS" "$ROOT"/root/rdmad_*.deb "$ROOT"/root/rdmad-dra_*.deb
    cp "${debs[0]}" "${debs[1]}" "$ROOT/root/"
    t0=$(date +%s)
    in_image sh -c 'cd /root && apt-get install -y -q --reinstall ./rdmad_*.deb ./rdmad-dra_*.deb' >&2 \
        || die "apt install of the two .debs failed in the image"
    log "installed in $(( $(date +%s) - t0 ))s"
    {
        echo "@dra_package=$(status rdmad-dra)"
        unit=/lib/systemd/system/rdmad-dra.service
        if [ -f "$ROOT$unit" ]; then echo "@dra_unit=$unit"; else echo "@dra_unit=none"; fi
        echo "@dra_enabled=$(in_image systemctl is-enabled rdmad-dra.service 2>&1)"
        in_image apt-get remove -y -q rdmad-dra >&2 && rc=0 || rc=$?
        echo "@dra_remove_rc=$rc"
        echo "@dra_removed=$(status rdmad-dra)"
        echo "@rdmad_after_dra_removed=$(status rdmad)"
    } > "$FACTS.tmp"
    rm -f "$ROOT"/root/rdmad-dra_*.deb
    mv "$FACTS.tmp" "$FACTS"
    echo "$rdmad_stamp" > "$SD/.rdmad-stamp"
fi

# ------------------------------------------------------------------ probe
install -m 0755 "$HERE/systemd-probe.sh" "$ROOT/usr/local/bin/rdmad-probe.sh"
# dpkg syncs each file it writes, a 9p round trip each under emulation, for a root that is
# a test's and rebuilt on any doubt: the probe's apt remove and reinstall skip them
echo force-unsafe-io > "$ROOT/etc/dpkg/dpkg.cfg.d/50-rdmad-check"
cat > "$ROOT/etc/systemd/system/rdmad-probe-setup.service" <<'EOF'
# systemd-image.sh: what a node has when rdmad starts at boot (an RDMA device, a netns)
[Unit]
Description=rdmad systemd check (RDMA set-up)
Before=rdmad.service
[Service]
Type=oneshot
ExecStart=/usr/local/bin/rdmad-probe.sh setup
[Install]
WantedBy=multi-user.target
EOF
# Under emulation (TCG) on a loaded host, Python's start-up alone can take over a minute,
# and boot competes for the CPU: the unit's own 120 s would measure the host, not rdmad.
mkdir -p "$ROOT/etc/systemd/system/rdmad.service.d"
cat > "$ROOT/etc/systemd/system/rdmad.service.d/10-emulated.conf" <<'EOF'
# systemd-image.sh: an emulated guest is slow to start Python
[Service]
TimeoutStartSec=600s
EOF
cat > "$ROOT/etc/systemd/system/rdmad-probe.service" <<'EOF'
# systemd-image.sh: one check of rdmad under systemd, then power off
[Unit]
Description=rdmad systemd check (probe)
After=multi-user.target dbus.service
[Service]
Type=oneshot
ExecStart=/usr/local/bin/rdmad-probe.sh
# always power off, also when the probe fails: the host waits for the VM to end
ExecStopPost=/bin/systemctl poweroff --no-block
StandardOutput=journal+console
[Install]
WantedBy=multi-user.target
EOF
chroot "$ROOT" systemctl enable rdmad-probe-setup.service rdmad-probe.service >&2 2>/dev/null
# no getty on the serial console (nothing to log in to) and a quiet, quick boot
chroot "$ROOT" systemctl mask serial-getty@ttyS0.service getty@tty1.service >/dev/null 2>&1 || true
echo rdmad-guest > "$ROOT/etc/hostname"

echo "$ROOT"
