#!/bin/bash
# bootstrap.sh - idempotent set-up of a machine for building and testing rdmad.
#
#   scripts/bootstrap.sh            apt packages (host + QEMU guest harness), .venv, CNI plugin
#   scripts/bootstrap.sh --no-apt   only the .venv and the plugin (a developer box without root)
#
# Environment: RDMAD_PYTHON (the venv's interpreter; default /usr/bin/python3, Debian's, which
#              the .debs run on: a python3 first in PATH may be much slower, see
#              docs/performance.md; a venv of another interpreter is made again),
#              RDMAD_FORCE_PIP=1 (re-run pip even if the stamp says it is up to date).
#
# A second run is a fast no-op: installed packages are checked with one dpkg-query before
# any `apt-get update` (which alone takes ~10 s), and the venv carries a stamp keyed on
# the lock so pip is skipped when nothing changed.
# Python packages come from the lock (requirements/dev.txt, hashes checked; `make lock`
# updates it), then rdmad itself, editable, with no dependency or build step of its own.
# Then rdmad-dra's *_pb2 modules (scripts/gen-proto.sh). Last, the CNI plugin (Go) into
# build/cni/rdmad-cni (scripts/build-cni.sh), every run: Go's build cache makes that a no-op
# when cni/ did not change.
# The guest kernels are NOT fetched here: tests/guest/harness/prepare-kernel.sh does that.
set -euo pipefail

say() { echo "[setup] $*"; }
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${RDMAD_PYTHON:-/usr/bin/python3}
do_apt=1
for a in "$@"; do
    case $a in
        --no-apt) do_apt=0 ;;
        -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown option: $a" ;;
    esac
done

# ------------------------------------------------------------------ apt packages
# host build/test: libsystemd-dev + pkg-config + gcc + python3-dev build systemd-python
#   (sdist only on PyPI); dbus = dbus-daemon for private-bus tests; iproute2 = ip, rdma.
# guest harness: qemu-system-x86 (TCG/KVM), kmod (depmod on the host, modprobe in the
#   guest), busybox-static (virtme-ng's initramfs), udev (virtme-ng's exit-code channel
#   needs /dev/virtio-ports links); python3-venv for the venvs; ca-certificates for pip.
# rdmad-exporter's tests: prometheus (promtool check metrics).
# bench: containernetworking-plugins (the macvlan CNI plugin, side by side with a shared claim).
# rdmad-cni's tests: podman (4.3, CNI backend) with runc, Debian's CNI plugins (host-local
#   IPAM, and host-device/macvlan for the benchmark), catatonit (podman's pod pause binary).
# Debian package (make deb): debhelper + dh-virtualenv build it, help2man writes its man
#   pages (debian/control's Build-Depends: these and the host build packages above, plus
#   build-essential, which dpkg-buildpackage always requires), lintian checks it.
# RDMA traffic in the guest (it shares this root): ibverbs-utils (ibv_rc_pingpong,
#   ibv_devices), rdmacm-utils (rping), perftest (ib_write_bw), ibverbs-providers (rxe's
#   userspace driver); crun runs the CDI test's container (runc killed the guest, issue 19).
# rdmad-cni (Go): the compiler and the Go libraries it imports, Debian's (GOPATH mode, no
#   module downloads; also the package's Build-Depends); the CNI library is forky's,
#   unpacked by scripts/fetch-go-cni.sh (bookworm's 1.1 has no GC or STATUS).
# polkitd: tests/bus/test_polkit.py runs it on the test's private system bus.
# Rootless podman (tests/e2e/test_rootless_podman.py, tests/guest/test_podman_rootless.py):
#   uidmap (newuidmap/newgidmap for the user's subordinate ids), slirp4netns (the pod's
#   network namespace of its own).
# make image (scripts/build-image.sh): mmdebstrap makes the image's bookworm, jq its JSON.
PKGS=(prometheus libsystemd-dev pkg-config gcc python3-dev python3-venv dbus iproute2
      qemu-system-x86 kmod busybox-static udev ca-certificates containernetworking-plugins
      podman runc catatonit ibverbs-utils rdmacm-utils perftest ibverbs-providers crun
      build-essential debhelper dh-virtualenv help2man lintian
      golang-go golang-dbus-dev golang-github-vishvananda-netlink-dev
      golang-github-vishvananda-netns-dev polkitd uidmap slirp4netns mmdebstrap jq)

missing_pkgs() {
    # one dpkg-query for all packages; anything not "installed" counts as missing
    local p st
    for p in "${PKGS[@]}"; do
        st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
        [ "$st" = installed ] || echo "$p"
    done
}

if [ "$do_apt" = 1 ]; then
    command -v dpkg-query >/dev/null || die "not a Debian system (no dpkg-query); use --no-apt"
    mapfile -t need < <(missing_pkgs)
    if [ ${#need[@]} -eq 0 ]; then
        say "apt packages present"
    else
        [ "$(id -u)" = 0 ] || die "need root to install: ${need[*]} (or use --no-apt)"
        export DEBIAN_FRONTEND=noninteractive
        say "apt-get update"
        apt-get update -qq || die "apt-get update failed"
        say "apt-get install ${need[*]}"
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
            || die "apt-get install ${need[*]} failed"
    fi
    # tests/cri's containerd: sid's 2.1, unpacked into a cache (a no-op when present)
    "$ROOT/scripts/fetch-containerd.sh" >/dev/null || die "scripts/fetch-containerd.sh failed"
    # rdmad-cni's CNI library: forky's, unpacked into a GOPATH entry (a no-op when present)
    "$ROOT/scripts/fetch-go-cni.sh" >/dev/null || die "scripts/fetch-go-cni.sh failed"
fi

# ------------------------------------------------------------------ venv
VENV="$ROOT/.venv"
STAMP="$VENV/.rdmad-bootstrap"
LOCK="$ROOT/requirements/dev.txt"
want_stamp=$(cat "$LOCK" "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)

# a venv of another interpreter is made again
base=$(readlink -f "$(command -v "$PYTHON")") || die "no interpreter $PYTHON"
if [ -x "$VENV/bin/python" ] && [ "$(readlink -f "$VENV/bin/python")" != "$base" ]; then
    say "$VENV is of $(readlink -f "$VENV/bin/python"), not $base: making it again"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV ($PYTHON)"
    "$PYTHON" -m venv "$VENV" || die "python venv failed (python3-venv installed?)"
fi

# Up to date = same lock + pyproject + this script, and the editable install still points here
# (a checkout moved/copied elsewhere keeps a stale .venv otherwise).
up_to_date() {
    [ "${RDMAD_FORCE_PIP:-0}" != 1 ] || return 1
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] || return 1
    "$VENV/bin/python" - "$ROOT" <<'EOF' 2>/dev/null
import pathlib, sys
import rdmad, systemd.daemon, dbus_fast, pyroute2, pyudev, pytest  # noqa: F401
sys.exit(0 if pathlib.Path(rdmad.__file__).resolve().is_relative_to(sys.argv[1]) else 1)
EOF
}

if up_to_date; then
    say "venv up to date ($VENV)"
else
    say "pip install --require-hashes -r requirements/dev.txt into $VENV"
    "$VENV/bin/python" -m pip install -q --require-hashes -r "$LOCK" \
        || die "pip install -r requirements/dev.txt failed"
    # the lock holds every dependency and the build backend (setuptools)
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" \
        || die "pip install -e . failed"
    echo "$want_stamp" > "$STAMP"
fi

# rdmad-dra's protobuf modules, generated from its .proto files (not in git), every run
"$ROOT/scripts/gen-proto.sh" "$VENV/bin/python" || die "scripts/gen-proto.sh failed"

# ------------------------------------------------------------------ CNI plugin
"$ROOT/scripts/build-cni.sh" || die "the CNI plugin did not build (scripts/build-cni.sh)"
say "done"
