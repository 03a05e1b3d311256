#!/bin/bash
# run-systemd-check.sh - rdmad as a real systemd service on a real RDMA kernel (7.3):
# build/refresh the systemd image (systemd-image.sh), boot it once (systemd is PID 1, the
# probe unit starts rdmad, claims/releases, runs systemd-analyze security, stops rdmad and
# powers off), then check what the probe recorded. Prints the security score.
#
#   tests/guest/harness/run-systemd-check.sh [--timeout S]     (root; default 600 s)
#
# Exit: 0 all checks passed; 1 a check failed (each one named on stderr); 124 boot timeout;
# 125 the image could not be built or the probe left no record (never a silent pass).
# env: RDMAD_GUEST_CACHE, RDMAD_GUEST_ACCEL=auto|kvm|tcg (as run-in-guest.sh).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=./pins.sh source-path=SCRIPTDIR
. "$HERE/pins.sh"
CACHE=$RDMAD_GUEST_CACHE
# shellcheck source=./vm.sh source-path=SCRIPTDIR
. "$HERE/vm.sh"

die() { echo "[sdcheck] ERROR: $*" >&2; exit 125; }
timeout_s=600
while [ $# -gt 0 ]; do
    case $1 in
        --timeout) timeout_s=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument $1" ;;
    esac
done
[ "$(id -u)" = 0 ] || die "must run as root"
[ -x "$CACHE/vng-venv/bin/vng" ] || die "virtme-ng missing: run tests/guest/harness/prepare-kernel.sh"
kernel=$CACHE/k-7.3/boot/vmlinuz-$KERNEL_73_KVER
[ -f "$kernel" ] || die "$kernel missing: run tests/guest/harness/prepare-kernel.sh 7.3"

t0=$(date +%s)
ROOT=$("$HERE/systemd-image.sh") || die "systemd-image.sh failed"
[ -x "$ROOT/usr/local/bin/rdmad-probe.sh" ] || die "image at '$ROOT' has no probe"
OUT=$ROOT/rdmad-probe.out
CONSOLE=$(dirname "$ROOT")/console.log
rm -f "$OUT" "$OUT.tmp"
echo "[sdcheck] image ready in $(( $(date +%s) - t0 ))s; booting (console: $CONSOLE)" >&2

accel=$(guest_accel)
vng_args=(--systemd --rw --root "$ROOT" --force-9p --cpus 2 --memory 1G --run "$kernel")
[ "$accel" = tcg ] && vng_args+=(--disable-kvm)
[ -d /lib/modules ] || mkdir -p /lib/modules   # vng wants it on the host

# the guest console goes through a FIFO (see run_vm) to $CONSOLE
FIFO=$(mktemp -u "$CACHE/sdcheck.XXXXXX")
mkfifo "$FIFO"
cat "$FIFO" > "$CONSOLE" &
cat_pid=$!
t1=$(date +%s)
run_vm "$timeout_s" "$FIFO" "$FIFO" "&1" "${vng_args[@]}"
wait "$cat_pid" || true
boot_s=$(( $(date +%s) - t1 ))
if [ "$vng_rc" = 124 ] || [ "$vng_rc" = 137 ]; then
    tail -n 30 "$CONSOLE" >&2
    echo "[sdcheck] ERROR: guest timed out after ${timeout_s}s (accel $accel)" >&2; exit 124
fi
if [ ! -f "$OUT" ]; then
    tail -n 40 "$CONSOLE" >&2
    [ -f "$OUT.tmp" ] && { echo "--- partial probe record:" >&2; cat "$OUT.tmp" >&2; }
    die "the probe left no complete record (vng rc=$vng_rc, ${boot_s}s): see $CONSOLE"
fi

# ------------------------------------------------------------------ checks
get() { sed -n "s/^@$1=//p" "$OUT" | head -n 1; }
fails=0
check() {   # check NAME ACTUAL EXPECTED-REGEX
    if [[ $2 =~ $3 ]]; then
        echo "[sdcheck] ok   $1: $2" >&2
    else
        echo "[sdcheck] FAIL $1: got '$2', want /$3/" >&2; fails=$((fails + 1))
    fi
}
check "PID 1"                   "$(get pid1)"              '^systemd$'
check "kernel"                  "$(get kernel)"            "^${KERNEL_73_KVER//+/\\+}$"
check "rxe0 created"            "$(get rxe_rc)"            '^0$'
check "systemctl start rdmad"   "$(get start_rc)"          '^0$'
check "is-active"               "$(get is_active)"         '^active$'
check "Type"                    "$(get show.Type)"         '^notify$'
check "NotifyAccess"            "$(get show.NotifyAccess)" '^main$'
check "SubState"                "$(get show.SubState)"     '^running$'
check "StatusText (READY sent)" "$(get show.StatusText)"   '^serving [0-9]+ RDMA devices'
check "WatchdogUSec"            "$(get show.WatchdogUSec)" '^30s$'
check "ListDevices has rxe0"    "$(get listdevices)"       '"rxe0" "[a-z]+" "veth0"'
check "shared Claim"            "$(get claim)"             '^o "/io/rdmad1/'
check "Claim.Release"           "$(get release_rc)"        '^0$'
check "rxe0 available again" "$(get listdevices_after)" '"rxe0" "available"'
check "security score line"     "$(get security)"          'Overall exposure level for rdmad\.service: [0-9.]+ '
check "systemctl stop rdmad"    "$(get stop_rc)"           '^0$'
check "stopped: ActiveState"    "$(get stopped.ActiveState)"    '^inactive$'
check "stopped: Result"         "$(get stopped.Result)"         '^success$'
check "stopped: exit status"    "$(get stopped.ExecMainStatus)" '^0$'
check "NRestarts"               "$(get show.NRestarts)"    '^0$'
check "journal RDMAD_CLAIM="    "$(get journal_rdmad_fields)" '^[1-9][0-9]*$'
check "journal logging errors"  "$(get journal_logging_errors)" '^0$'

score=$(get security | sed -n 's/.*rdmad\.service: //p')
offline=$(get security_offline | sed -n 's/.*rdmad\.service: //p')
echo "[sdcheck] systemd-analyze security (in guest, $(get systemd_version)): ${score:-NONE}" \
     "(offline on the same files: ${offline:-NONE}); start $(get start_ms) ms, stop $(get stop_ms) ms;" \
     "boot+probe ${boot_s}s, accel $accel; record: $OUT"
if [ "$fails" != 0 ]; then
    echo "[sdcheck] $fails check(s) FAILED; full record: $OUT" >&2
    exit 1
fi
