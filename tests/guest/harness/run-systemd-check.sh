#!/bin/bash
# run-systemd-check.sh - rdmad as a real systemd service on a real RDMA kernel (7.3), from
# its Debian package: build/refresh the systemd image (systemd-image.sh: `apt install
# ./rdmad_*.deb ./rdmad-dra_*.deb`, rdmad-dra checked and removed there again, natively),
# boot it once (systemd is PID 1; a set-up unit makes rxe0 and a netns, then rdmad starts at
# boot; the probe claims/releases, runs rdmactl as root and as nobody, checks the polkit
# actions, `apt remove`s rdmad under a live claim and reinstalls it, runs a CRI pod under the
# kubelet's systemd cgroup driver (tests/systemd, by pytest from this checkout, shared
# read-only), runs systemd-analyze security, restarts rdmad on a claim whose give-back the
# kernel refuses (it must come up, once: no restart loop), stops rdmad and powers off), then
# check what the image build and the probe recorded.
# Prints the security score.
#
#   tests/guest/harness/run-systemd-check.sh [--timeout S]
#                    (root; default 900 s with KVM, 1800 s under TCG: the in-guest apt remove
#                    and reinstall and the CRI pod run emulated)
#
# Exit: 0 all checks passed; 1 a check failed (each one named on stderr); 124 boot timeout;
# 125 the image could not be built or the probe left no record (never a silent pass).
# env: RDMAD_GUEST_CACHE, RDMAD_GUEST_ACCEL=auto|kvm|tcg (as run-in-guest.sh),
# RDMAD_CONTAINERD_CACHE (scripts/fetch-containerd.sh's).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=./pins.sh source-path=SCRIPTDIR
. "$HERE/pins.sh"
CACHE=$RDMAD_GUEST_CACHE
# shellcheck source=./vm.sh source-path=SCRIPTDIR
. "$HERE/vm.sh"

die() { echo "[sdcheck] ERROR: $*" >&2; exit 125; }
timeout_s=""
while [ $# -gt 0 ]; do
    case $1 in
        --timeout) timeout_s=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}"; exit 0 ;;
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
SD=$(dirname "$ROOT")
OUT=$SD/rdmad-probe.out
CONSOLE=$SD/console.log
DISK=$SD/root.ext4
rm -f "$OUT" "$OUT.tmp"

accel=$(guest_accel)
[ -n "$timeout_s" ] || { [ "$accel" = tcg ] && timeout_s=1800 || timeout_s=900; }
# A panic powers the guest off at once (vng's --exec boots do the same), not a hang until the
# timeout
vng_args=(--systemd --rw --root-disk "$DISK" --root-fstype ext4 --force-9p --cpus 2 --memory 2G
          --run "$kernel" --append panic=-1 --qemu-opts=-no-reboot)
[ "$accel" = tcg ] && vng_args+=(--disable-kvm)
# The probe's CRI pod runs tests/systemd from this checkout, with its venv and the Python
# that made the venv, and containerd from its cache: shared read-only at the same paths.
REPO=$(cd "$HERE/../../.." && pwd)
[ -x "$REPO/.venv/bin/python" ] || die "$REPO/.venv missing: run make setup"
python_prefix=$(dirname "$(dirname "$(readlink -f "$REPO/.venv/bin/python")")")
containerd_cache=${RDMAD_CONTAINERD_CACHE:-/opt/rdmad-containerd}
[ -x "$containerd_cache/containerd2/usr/bin/containerd" ] \
    || die "containerd missing in $containerd_cache: run scripts/fetch-containerd.sh"
shared_dirs=("$REPO" "$containerd_cache")
# Debian's Python (/usr) is the image's too, rdmad's own; another is shared
[ "$python_prefix" = /usr ] || shared_dirs+=("$python_prefix")
for shared in "${shared_dirs[@]}"; do
    vng_args+=(--rodir "$shared=$shared")   # (the probe mounts them)
done
echo "$REPO" > "$ROOT/etc/rdmad-probe-checkout"
# The guest boots a copy of the image on a virtio disk, not the directory over 9p: each of
# dpkg's and Python's small reads and writes was a 9p round trip through the emulated CPU.
# The directory stays as built; the disk has room for the reinstall, the journal and the pod.
make_disk() {
    rm -f "$DISK"
    mke2fs -q -t ext4 -L rdmadsd -d "$ROOT" "$DISK" "$(( $(du -sm "$ROOT" | cut -f1) + 1024 ))M" \
        >/dev/null || die "mke2fs could not make $DISK from $ROOT"
}
# boot: one boot of the disk, its console to $CONSOLE through a FIFO (see run_vm); then the
# probe's record, read back from the disk
boot() {
    local fifo cat_pid t1 f
    fifo=$(mktemp -u "$CACHE/sdcheck.XXXXXX")
    mkfifo "$fifo"
    cat "$fifo" > "$CONSOLE" &
    cat_pid=$!
    t1=$(date +%s)
    run_vm "$timeout_s" "$fifo" "$fifo" "&1" "${vng_args[@]}"
    wait "$cat_pid" || true
    rm -f "$fifo"
    boot_s=$(( $(date +%s) - t1 ))
    for f in rdmad-probe.out rdmad-probe.out.tmp; do
        debugfs -R "dump -p /$f $SD/$f" "$DISK" >/dev/null 2>&1 || true
    done
}
make_disk
echo "[sdcheck] image ready in $(( $(date +%s) - t0 ))s; booting (console: $CONSOLE)" >&2
# the guest sees the checkout read-only and writes no byte-code: write it here (a no-op
# when current), as run-in-guest.sh does
(cd "$REPO" && .venv/bin/python -m compileall -q -j0 rdmad testbed tests >/dev/null) \
    || echo "[sdcheck] WARNING: compileall failed: the guest compiles what it imports" >&2
[ -d /lib/modules ] || mkdir -p /lib/modules   # vng wants it on the host

boot
# A kernel that panicked before the probe began ran no check (seen once under TCG: an int3
# oops in a timer interrupt 2.5 s into the boot): boot a fresh copy once more. A probe that
# began is never run again: its record stands.
if [ ! -s "$OUT" ] && [ ! -s "$OUT.tmp" ] && grep -q 'Kernel panic' "$CONSOLE"; then
    mv "$CONSOLE" "$CONSOLE.panic"
    echo "[sdcheck] WARNING: the kernel panicked in the boot (console: $CONSOLE.panic);" \
        "booting a fresh copy again" >&2
    make_disk
    boot
fi
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
check "package installed"       "$(get boot_package)"      '^install ok installed '
check "unit enabled"            "$(get boot_enabled)"      '^enabled$'
# rdmad-dra, installed beside rdmad in the image build (systemd-image.sh), then removed
facts=$(dirname "$ROOT")/rdmad-dra.facts
getf() { sed -n "s/^@$1=//p" "$facts" | head -n 1; }
check "rdmad-dra installed"     "$(getf dra_package)"      '^install ok installed$'
check "rdmad-dra unit present"  "$(getf dra_unit)"         '^/lib/systemd/system/rdmad-dra\.service$'
check "rdmad-dra not enabled"   "$(getf dra_enabled)"      '^disabled$'
check "apt remove rdmad-dra"    "$(getf dra_remove_rc) $(getf dra_removed)" '^0 [a-z]+ ok (config-files|not-installed)$'
check "rdmad stays without it"  "$(getf rdmad_after_dra_removed)" '^install ok installed$'
check "rxe0 created"            "$(get rxe_rc)"            '^0$'
check "started at boot"         "$(get start_rc)"          '^0$'
check "is-active"               "$(get is_active)"         '^active$'
check "Type"                    "$(get show.Type)"         '^notify$'
check "NotifyAccess"            "$(get show.NotifyAccess)" '^main$'
check "SubState"                "$(get show.SubState)"     '^running$'
check "StatusText (READY sent)" "$(get show.StatusText)"   '^serving [0-9]+ RDMA devices'
check "WatchdogUSec"            "$(get show.WatchdogUSec)" '^30s$'
check "ListDevices has rxe0"    "$(get listdevices)"       '"rxe0" "[a-z]+" "veth0"'
check "rdmactl list (root)"     "$(get rdmactl_root_list_rc)/$(get rdmactl_root_list_rxe0)" '^0/1$'
check "rdmactl list (nobody)"   "$(get rdmactl_user_list_rc)" '^0$'
check "rdmactl claim (nobody)"  "$(get rdmactl_user_claim_rc) $(get rdmactl_user_claim_err)" \
    '^1 rdmactl: .*AccessDenied'
check "polkit action file"      "$(get polkit_action_file)" '^rdmad: /usr/share/polkit-1/actions/io\.rdmad1\.policy$'
shipped=$(sed -n 's/.*<action id="\([^"]*\)".*/\1/p' "$HERE/../../../polkit/io.rdmad1.policy" | paste -sd' ')
check "pkaction lists each"     "$(get polkit_listed)"     "^${shipped//./\\.}$"
check "user share: defaults"    "$(get polkit_default_rc) $(get polkit_default_err)" \
    '^1 rdmactl: .*AccessDenied.*io\.rdmad1\.claim-share: not authorized by polkit'
check "user share: a rule"      "$(get polkit_rule_rc)"    '^0$'
check "CNI plugin VERSION"      "$(get cni_version_rc) $(get cni_versions)" '^0 (.* )?1\.1\.0( |$)'
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
claim_id=$(get pkg_claim_id)
check "claim before apt remove" "$(get pkg_claim_rc) $claim_id" '^0 [0-9a-f]+$'
check "apt remove rdmad"        "$(get apt_remove_rc)"      '^0$'
check "removed: rdmad"          "$(get removed_package)"    '^deinstall ok config-files$'
check "removed: daemon stopped" "$(get removed_active)"     '^inactive$'
check "removed: netdev stays"   "$(get removed_netdev)"     '^net1(@|$)'
check "apt install ./rdmad_*.deb" "$(get apt_install_rc)"   '^0$'
check "reinstalled: started"    "$(get reinstalled_active)" '^active$'
check "reinstalled: claim kept" "$(get reinstalled_claims_rc) $(get reinstalled_claim_ids)" \
    "^0 ${claim_id:-NONE}$"
check "reinstalled: rxe0 state" "$(get reinstalled_device)" '^shared$'
check "release after reinstall" "$(get pkg_release_rc)"    '^0$'
check "released: child gone"    "$(get released_child)"     '^0$'
check "CRI pod, systemd driver" "$(get cri_rc) $(get cri_summary)" '^0 [0-9]+ passed in '
check "refused: set-up"         "$(get refuse_setup_rc) $(get refuse_sim_start_rc) $(get refuse_squatter_rc)" '^0 0 0$'
refuse_id=$(get refuse_claim_id)
check "refused: whole claim"    "$(get refuse_claim_rc) $refuse_id" '^0 [0-9a-f]+$'
check "refused: Release fails"  "$(get refuse_release_rc)"   '^1$'
check "refused: restart"        "$(get refuse_restart_rc)"   '^0$'
check "refused: still active"   "$(get refuse_active)"       '^active$'
check "refused: no restart loop" "$(get refuse_nrestarts)"   '^([0-9]+) \1$'
check "refused: STATUS="        "$(get refuse_status)"       'could not give back 1 claim at start'
check "refused: claim listed"   "$(get refuse_claims_rc) $(get refuse_claim_ids)" "^0 ${refuse_id:-NONE}$"
check "refused: State"          "$(get refuse_state)"        '^s "not-returned"$'
# (which step the kernel refused depends on how far the failed Release got: any reason)
check "refused: Failure"        "$(get refuse_failure)"      '^s "[^"]+'
check "refused: journal"        "$(get refuse_journal)"      '^[1-9][0-9]*$'
check "refused: given back"     "$(get refuse_claims_after) $(get refuse_home)" '^0 vsim0 198\.51\.100\.7/24$'

# where the guest's time went: each @t.KEY (uptime at its start, s) to the next one
timeline=$(sed -n 's/^@t\.\([a-z_]*\)=\([0-9.]*\)$/\2 \1/p' "$OUT" | sort -n \
    | awk 'NR == 1 { printf "from %.0fs: ", $1 } NR > 1 { printf "%s%s %.0fs", sep, key, $1 - t; sep = ", " }
           { t = $1; key = $2 } END { printf "%s%s at %.0fs\n", sep, key, t }')
echo "[sdcheck] guest timeline (uptime): $timeline" >&2
score=$(get security | sed -n 's/.*rdmad\.service: //p')
offline=$(get security_offline | sed -n 's/.*rdmad\.service: //p')
echo "[sdcheck] systemd-analyze security (in guest, $(get systemd_version)): ${score:-NONE}" \
     "(offline on the same files: ${offline:-NONE}); start at boot $(get start_ms) ms, stop $(get stop_ms) ms;" \
     "boot+probe ${boot_s}s, accel $accel; record: $OUT"
if [ "$fails" != 0 ]; then
    echo "[sdcheck] $fails check(s) FAILED; full record: $OUT" >&2
    exit 1
fi
