#!/bin/bash
# systemd-image.sh - build (idempotent) a bookworm root with systemd as PID 1 and rdmad
# installed as a real service, for run-systemd-check.sh.
#
#   tests/guest/harness/systemd-image.sh        # prints the root dir on stdout
#
# Layout under $RDMAD_GUEST_CACHE/sdimg (default /opt/rdmad-guest/sdimg):
#   root/           the image (booted by vng --systemd --rw --root, i.e. 9p, writable)
#   .base-stamp     the mmdebstrap inputs the base was built from (a change rebuilds it)
#   .rdmad-stamp    hash of the rdmad sources + wheel pins last installed (a change reinstalls)
# Layers: base (mmdebstrap, ~40 s), kernel modules (hard links), rdmad (venv, ~20 s), units.
# Needs root, and prepare-kernel.sh 7.3 first (kernel modules + virtme-ng in the cache).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
# shellcheck source=./pins.sh source-path=SCRIPTDIR
. "$HERE/pins.sh"
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
# python3-systemd is bookworm's systemd-python 235 (what pyproject asks for): a venv with
# --system-site-packages uses it, so no compiler or libsystemd-dev in the image.
SUITE=bookworm
INCLUDE=systemd,systemd-sysv,udev,kmod,iproute2,dbus,python3,python3-venv,python3-systemd
MIRROR=${RDMAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base_stamp="$SUITE $INCLUDE $MIRROR v1"
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

# ------------------------------------------------------------------ rdmad
# The image gets the checkout's tracked files as they are in the work tree (uncommitted
# edits included: what is tested is what is checked out). Wheels come from the host's pip
# (its index/config), pinned to the versions in the project's .venv, and are installed in
# the image with --no-index: the chroot needs no network, DNS or CA set-up.
HOSTPIP=$REPO/.venv/bin/pip
[ -x "$HOSTPIP" ] || die "$HOSTPIP missing: run scripts/bootstrap.sh"
pins=$("$HOSTPIP" freeze --all 2>/dev/null | grep -iE '^(dbus-fast|jeepney|pyudev)==') \
    || die "cannot read dbus-fast/jeepney/pyudev versions from .venv"
[ "$(wc -l <<<"$pins")" = 3 ] || die "expected 3 pinned deps in .venv, got: $pins"
src_tar=$(mktemp)
trap 'rm -f "$src_tar"' EXIT
# Only what the package build reads (+ unit/policy): editing tests does not reinstall.
(cd "$REPO" && git ls-files -z -- pyproject.toml README.md rdmad systemd dbus \
    | tar --null -T - -cf "$src_tar" --owner=0 --group=0 --mtime=@0 --sort=name)
rdmad_stamp=$( { sha256sum < "$src_tar"; echo "$pins"; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$SD/.rdmad-stamp" 2>/dev/null)" != "$rdmad_stamp" ] || [ ! -x "$ROOT/opt/rdmad/venv/bin/rdmad" ]; then
    log "installing rdmad into the image"
    rm -rf "$ROOT/opt/rdmad" "$SD/.rdmad-stamp"
    mkdir -p "$ROOT/opt/rdmad/src" "$ROOT/opt/rdmad/wheels"
    tar -xf "$src_tar" -C "$ROOT/opt/rdmad/src"
    # setuptools>=68: pyproject's build requirement (bookworm has 66), for the isolated build.
    # shellcheck disable=SC2086  # $pins: one requirement per word
    # (its log only on failure: the host's pip config adds noisy find-links warnings)
    "$HOSTPIP" download -q --only-binary=:all: -d "$ROOT/opt/rdmad/wheels" \
        $pins 'setuptools>=68' wheel >"$SD/pip-download.log" 2>&1 \
        || { cat "$SD/pip-download.log" >&2; die "pip download of the wheels failed"; }
    # a clean environment: the host's PIP_* variables name paths the image does not have
    inchroot=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root chroot "$ROOT")
    "${inchroot[@]}" python3 -m venv --system-site-packages /opt/rdmad/venv
    "${inchroot[@]}" /opt/rdmad/venv/bin/pip install -q --no-index --find-links /opt/rdmad/wheels \
        --disable-pip-version-check /opt/rdmad/src >&2
    # systemd-python must be Debian's (no second copy in the venv), and every import work
    "${inchroot[@]}" /opt/rdmad/venv/bin/python -c \
        'import systemd.daemon, dbus_fast, jeepney, pyudev, rdmad.daemon; print(systemd.daemon.__file__)' >&2
    echo "$rdmad_stamp" > "$SD/.rdmad-stamp"
fi

# ------------------------------------------------------------------ units and policy
# The shipped unit as is; only ExecStart is overridden (the venv's console script).
install -m 0644 "$REPO/systemd/rdmad.service" "$ROOT/etc/systemd/system/rdmad.service"
mkdir -p "$ROOT/etc/systemd/system/rdmad.service.d"
cat > "$ROOT/etc/systemd/system/rdmad.service.d/10-venv.conf" <<'EOF'
# systemd-image.sh: rdmad lives in a venv in this image
[Service]
ExecStart=
ExecStart=/opt/rdmad/venv/bin/rdmad
EOF
install -m 0644 "$REPO/dbus/io.rdmad1.conf" "$ROOT/etc/dbus-1/system.d/io.rdmad1.conf"

install -m 0755 "$HERE/systemd-probe.sh" "$ROOT/usr/local/bin/rdmad-probe.sh"
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
chroot "$ROOT" systemctl enable rdmad-probe.service >&2 2>/dev/null
# rdmad is started by the probe, not at boot: the probe must see the start it measures
chroot "$ROOT" systemctl disable rdmad.service >/dev/null 2>&1 || true
# no getty on the serial console (nothing to log in to) and a quiet, quick boot
chroot "$ROOT" systemctl mask serial-getty@ttyS0.service getty@tty1.service >/dev/null 2>&1 || true
echo rdmad-guest > "$ROOT/etc/hostname"

echo "$ROOT"
