#!/bin/bash
# run-in-guest.sh - run one command in a throw-away QEMU guest with a real RDMA kernel.
#
#   tests/guest/harness/run-in-guest.sh --kernel 6.1|7.3 [options] [--] CMD [ARGS...]
#
# options:  --rwdir DIR    host dir the guest may write (repeatable; default: none writable,
#                          the guest sees the host root read-only over 9p)
#           --timeout S    wall-clock limit for the whole boot -> exit 124 (default 900 s
#                          with KVM, 2100 s under TCG: the whole 7.3 guest suite took 873 s
#                          here under TCG and overran 900 s on a slower CI machine)
#           --cpus N --mem SIZE   guest size (default 2, 1G)
#           --verbose      show guest set-up output and the kernel console on stderr
# env:      RDMAD_GUEST_CACHE (default /opt/rdmad-guest; filled by prepare-kernel.sh)
#           RDMAD_GUEST_9P_CACHE=loose|none  loose (default): the checkout, the venv's Python,
#                          the host's programs and libraries shared again, read-only and
#                          cached in the guest (see "cached trees" below)
#           RDMAD_GUEST_ACCEL=auto|kvm|tcg  (auto: TCG when /dev/kvm is missing or is the
#                          PVM flavour - stock kernels hang under kvm_pvm)
#
# Inside the guest: ib_core ib_uverbs rdma_ucm rdma_rxe veth dummy macvlan are loaded, NO rxe
# device exists (tests create their own), an isolated virtio-net NIC sits on a qemu hub with
# nothing else attached, and the command runs in the caller's cwd with
#   RDMA_VM_GUEST=1  RDMA_VM_KERNEL=6.1|7.3  RDMA_VM_NIC=<virtio NIC name>
#   RDMA_VM_RWDIRS="<the --rwdir dirs>"
# The command's stdout/stderr come back on stdout/stderr; its exit status is ours.
# 125 = the guest did not boot, its set-up failed or it died before the command finished
# (decided by a status file the guest writes, never by the absence of an error).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
# shellcheck source=./pins.sh source-path=SCRIPTDIR
. "$HERE/pins.sh"
CACHE=$RDMAD_GUEST_CACHE
# shellcheck source=./vm.sh source-path=SCRIPTDIR
. "$HERE/vm.sh"

die() { echo "[guest] ERROR: $*" >&2; exit 125; }

kernel=""; timeout_s=""; cpus=2; mem=1G; verbose=0; rwdirs=()
while [ $# -gt 0 ]; do
    case $1 in
        --kernel) kernel=${2:?}; shift 2 ;;
        --kernel=*) kernel=${1#*=}; shift ;;
        --rwdir) rwdirs+=("$(realpath "${2:?}")"); shift 2 ;;
        --rwdir=*) rwdirs+=("$(realpath "${1#*=}")"); shift ;;
        --timeout) timeout_s=${2:?}; shift 2 ;;
        --cpus) cpus=${2:?}; shift 2 ;;
        --mem) mem=${2:?}; shift 2 ;;
        --verbose) verbose=1; shift ;;
        -h|--help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
        --) shift; break ;;
        -*) die "unknown option $1" ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || die "no command given (usage: --kernel 6.1|7.3 [--] CMD...)"
case $kernel in
    6.1) kver=$KERNEL_61_KVER; pin="$KERNEL_61_PKG=$KERNEL_61_VERSION" ;;
    7.3) kver=$KERNEL_73_KVER; pin="$KERNEL_73_PKGS=$KERNEL_73_VERSION" ;;
    *) die "--kernel must be 6.1 or 7.3" ;;
esac
[ "$(id -u)" = 0 ] || die "must run as root (qemu, 9p root share)"
kdir="$CACHE/k-$kernel"
[ "$(cat "$kdir/.complete" 2>/dev/null)" = "$pin" ] \
    || die "kernel $kernel ($pin) not prepared in $CACHE: run tests/guest/harness/prepare-kernel.sh"
[ -x "$CACHE/vng-venv/bin/vng" ] || die "virtme-ng missing: run tests/guest/harness/prepare-kernel.sh"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run scripts/bootstrap.sh"
[ -d /lib/modules ] || mkdir -p /lib/modules   # vng wants it on the host root

# ------------------------------------------------------------------ accelerator
accel=$(guest_accel)
[ -n "$timeout_s" ] || { [ "$accel" = tcg ] && timeout_s=2100 || timeout_s=900; }

# ------------------------------------------------------------------ per-run dir
# Writable in the guest (--rwdir): the guest leaves "setup-ok" and "rc" there. A missing rc
# means the guest never got to (or never finished) the command: that is a failure.
RUN_DIR=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$RUN_DIR"' EXIT   # replaced once the VM runs

cat > "$RUN_DIR/guest.sh" <<'EOS'
#!/bin/bash
# runs inside the guest; $1 = run dir, $2 = host cwd, rest = command
run=$1; cwd=$2; shift 2
set -o pipefail
setup() {
    set -e
    modprobe -a ib_core ib_uverbs rdma_ucm rdma_rxe veth dummy macvlan virtio_net
    # the virtio NIC: identify by driver, not by name (eth0/enp0sN depends on the kernel)
    local n nic=""
    for n in /sys/class/net/*; do
        if [ "$(basename "$(readlink -f "$n/device/driver" 2>/dev/null)")" = virtio_net ]; then
            nic=$(basename "$n"); break
        fi
    done
    [ -n "$nic" ] || { echo "no virtio-net NIC in the guest" >&2; ls /sys/class/net >&2; return 1; }
    echo "$nic" > "$run/nic"
    rdma dev >/dev/null   # RDMA netlink answers
    cache_trees
}
# cache_trees: mount each of RDMA_VM_CACHED's "tag=dir" shares over its dir, read-only and
# cached; a writable dir inside one (--rwdir, this run's) is bound aside and back on top
cache_trees() {
    local ent dir rw kept i=0
    for ent in $RDMA_VM_CACHED; do
        dir=${ent#*=}; kept=()
        for rw in $RDMA_VM_RWDIRS "$run"; do
            case $rw/ in "$dir"/*)
                mkdir -p "/run/rdmad-keep$i"; mount --bind "$rw" "/run/rdmad-keep$i"
                kept+=("$i=$rw"); i=$((i + 1)) ;;
            esac
        done
        mount -t 9p -o ro,trans=virtio,version=9p2000.L,access=any,msize=524288,cache=loose \
            "${ent%%=*}" "$dir"
        for rw in "${kept[@]}"; do mount --bind "/run/rdmad-keep${rw%%=*}" "${rw#*=}"; done
    done
}
if [ "$RDMA_VM_VERBOSE" = 1 ]; then
    (setup) >&2 || { echo "[guest] guest set-up failed" >&2; exit 125; }
else
    out=$( (setup) 2>&1) || { echo "[guest] guest set-up failed:" >&2; echo "$out" >&2; exit 125; }
fi
touch "$run/setup-ok"
export RDMA_VM_GUEST=1
RDMA_VM_NIC=$(cat "$run/nic"); export RDMA_VM_NIC
cd "$cwd" || exit 125
"$@"
rc=$?
echo "$rc" > "$run/rc"
exit "$rc"
EOS
chmod 755 "$RUN_DIR/guest.sh"

# ------------------------------------------------------------------ cached trees
# vng's initramfs mounts the host root itself, uncached (rootflags= never reach it): each
# stat, open and read of Python's imports, and of every program the tests run, is a 9p
# round trip through the emulated CPU. The trees they read, which do not change during a
# run, are shared once more, read-only, and the guest mounts each over itself with
# cache=loose (pages and metadata): the checkout (its .venv, rdmad, tests), the standard
# library of the venv's Python (its whole prefix unless that is the system's, under the
# overlays vng makes), the host's programs and shared libraries, and containerd's cache.
cached=(); cache_opts=""
if [ "${RDMAD_GUEST_9P_CACHE:-loose}" != none ]; then
    trees=("$ROOT" /usr/bin /usr/sbin /usr/libexec /usr/lib/x86_64-linux-gnu
           "${RDMAD_CONTAINERD_CACHE:-/opt/rdmad-containerd}")
    if [ -x "$ROOT/.venv/bin/python" ]; then
        prefix=$(dirname "$(dirname "$(readlink -f "$ROOT/.venv/bin/python")")")
        case $prefix in
            /|/usr|/usr/local) trees+=("$("$ROOT/.venv/bin/python" -c \
                'import sysconfig; print(sysconfig.get_paths()["stdlib"])')") ;;
            *) trees+=("$prefix") ;;
        esac
    fi
    for d in "${trees[@]}"; do
        [ -d "$d" ] || continue
        if [[ ! $d =~ ^/[A-Za-z0-9_./+-]+$ ]]; then
            echo "[guest] WARNING: $d stays uncached: vng's options cannot carry its path" >&2
            continue
        fi
        tag=rdmadro${#cached[@]}
        cache_opts+=" -fsdev local,id=$tag,path=$d,security_model=none,readonly=on,multidevs=remap"
        cache_opts+=" -device virtio-9p-pci,fsdev=$tag,mount_tag=$tag"
        cached+=("$tag=$d")
    done
fi

{
    printf 'export RDMA_VM_KERNEL=%q RDMA_VM_VERBOSE=%q RDMA_VM_RWDIRS=%q RDMA_VM_CACHED=%q\n' \
        "$kernel" "$verbose" "${rwdirs[*]}" "${cached[*]}"
    printf 'exec bash %q %q %q' "$RUN_DIR/guest.sh" "$RUN_DIR" "$PWD"
    printf ' %q' "$@"
    printf '\n'
} > "$RUN_DIR/entry.sh"

# ------------------------------------------------------------------ bytecode
# The guest sees the tree read-only and runs Python with PYTHONDONTWRITEBYTECODE=1, so a
# module with no current .pyc on the host is compiled again in every process that imports
# it: under TCG that was most of each daemon start (see README.md, "Measured"). pip wrote
# the venv's; write the checkout's here (a no-op when they are current), whatever the
# caller's PYTHONDONTWRITEBYTECODE.
if [ -x "$ROOT/.venv/bin/python" ]; then
    (cd "$ROOT" && .venv/bin/python -m compileall -q -j0 rdmad testbed tests bench >/dev/null) \
        || echo "[guest] WARNING: compileall failed: the guest compiles what it imports" >&2
fi

vng_args=(--run "$kdir/boot/vmlinuz-$kver" --force-9p --cpus "$cpus" --memory "$mem"
          --rwdir "$RUN_DIR")
# 9p: qemu 7.2's virtiofsd is too old for virtme-ng
[ "$accel" = tcg ] && vng_args+=(--disable-kvm)
[ -n "$cache_opts" ] && vng_args+=(--qemu-opts="$cache_opts")
[ "$verbose" = 1 ] && vng_args+=(--verbose)
for d in "${rwdirs[@]}"; do vng_args+=(--rwdir "$d"); done
# A NIC on an isolated hub (nothing else on hub 0): a "physical" netdev with no way out.
# Physical netdevs return to init_net when their netns dies; veth/macvlan are destroyed.
vng_args+=(--qemu-opts='-netdev hubport,id=rdmadnic,hubid=0 -device virtio-net-pci,netdev=rdmadnic,mac=52:54:00:7d:00:01')

# qemu writes to FIFOs (see run_vm), keeping stdout/stderr apart.
mkfifo "$RUN_DIR/out" "$RUN_DIR/err"
boot() {
    cat "$RUN_DIR/out" &
    local cat_out=$!
    sed -u "/warning: hub 0 is not connected to host network/d" "$RUN_DIR/err" >&2 &
    local cat_err=$!
    t0=$(date +%s)
    run_vm "$timeout_s" "$RUN_DIR" "$RUN_DIR/out" "$RUN_DIR/err" \
        "${vng_args[@]}" --exec "bash $RUN_DIR/entry.sh"
    wait "$cat_out" "$cat_err" || true
    dt=$(( $(date +%s) - t0 ))
}
boot
# A guest that never reached its set-up ran no test: boot it once more (seen once under
# TCG: vng rc=255 after 6 s, nothing on the console). A guest that got as far as the
# command is never re-run: its result stands.
if [ ! -f "$RUN_DIR/setup-ok" ] && [ "$vng_rc" != 124 ] && [ "$vng_rc" != 137 ]; then
    echo "[guest] WARNING: kernel $kernel: the guest did not boot (vng rc=$vng_rc, ${dt}s, accel $accel); booting it again" >&2
    boot
fi

if [ "$vng_rc" = 124 ] || [ "$vng_rc" = 137 ]; then
    echo "[guest] ERROR: kernel $kernel: timed out after ${timeout_s}s (accel $accel)" >&2
    exit 124
fi
if [ ! -f "$RUN_DIR/setup-ok" ]; then
    echo "[guest] ERROR: kernel $kernel: guest did not boot or its set-up failed (vng rc=$vng_rc, ${dt}s, accel $accel); re-run with --verbose" >&2
    exit 125
fi
if [ ! -f "$RUN_DIR/rc" ]; then
    echo "[guest] ERROR: kernel $kernel: guest died before the command finished (vng rc=$vng_rc, ${dt}s)" >&2
    exit 125
fi
rc=$(cat "$RUN_DIR/rc")
if [ "$vng_rc" != "$rc" ]; then
    echo "[guest] WARNING: vng rc=$vng_rc differs from the command's rc=$rc; using the latter" >&2
fi
echo "[guest] kernel $kernel ($kver, accel $accel): rc=$rc in ${dt}s" >&2
exit "$rc"
