#!/bin/bash
# systemd-probe.sh - runs INSIDE the systemd guest image; installed there by
# systemd-image.sh as /usr/local/bin/rdmad-probe.sh, for two units:
#   rdmad-probe.sh setup   rdmad-probe-setup.service, at boot, Before=rdmad.service: the
#                          RDMA device and netns a node has when rdmad starts at boot;
#                          writes /rdmad-setup.out
#   rdmad-probe.sh         rdmad-probe.service, after multi-user.target: the checks
# The probe writes /rdmad-probe.out (the root is the host's image dir over 9p, --rw):
# free-form output, plus "@key=value" lines that run-systemd-check.sh checks (the set-up's
# record included). The file appears only when the probe ran to its end (written as .tmp,
# renamed last), so a half run cannot pass. Every step runs even when an earlier one
# failed: the host decides, with the whole record.
set -u

kv() { printf '@%s=%s\n' "$1" "$2"; }
section() { printf '\n===== %s\n' "$*"; }
# jget EXPR: EXPR on the JSON document on stdin (as j), printed
jget() { python3 -c 'import json, sys; print(eval(sys.argv[1], {}, {"j": json.load(sys.stdin)}))' "$1"; }

if [ "${1:-}" = setup ]; then
    exec >/rdmad-setup.out 2>&1
    section "RDMA set-up at boot, before rdmad starts: modules, veth, rxe0, netns probe1"
    modprobe -a ib_core ib_uverbs rdma_ucm rdma_rxe veth; kv modprobe_rc $?
    ip link add veth0 type veth peer name veth1 && ip link set veth0 up && ip link set veth1 up
    kv veth_rc $?
    rdma link add rxe0 type rxe netdev veth0; kv rxe_rc $?
    rdma dev
    ip netns add probe1; kv netns_rc $?
    exit 0
fi

OUT=/rdmad-probe.out
rm -f "$OUT" "$OUT.tmp"
exec >"$OUT.tmp" 2>&1

kv pid1 "$(cat /proc/1/comm)"
kv kernel "$(uname -r)"
kv uptime_start "$(cut -d' ' -f1 /proc/uptime)"
kv systemd_version "$(systemctl --version | head -1)"
cat /rdmad-setup.out

section "rdmad started at boot (installed by apt install ./rdmad_*.deb)"
kv boot_package "$(dpkg-query -W -f='${Status} ${Version}' rdmad)"
kv boot_enabled "$(systemctl is-enabled rdmad)"
# joins the boot's start job if it is still running; a no-op once rdmad is up
systemctl start rdmad; kv start_rc $?
ms() { systemctl show rdmad -p "$1" --value; }
kv start_ms $(( ($(ms ActiveEnterTimestampMonotonic) - $(ms InactiveExitTimestampMonotonic)) / 1000 ))
kv is_active "$(systemctl is-active rdmad)"
systemctl show rdmad -p Type -p NotifyAccess -p ActiveState -p SubState -p StatusText \
    -p WatchdogUSec -p NRestarts | sed 's/^/@show./'

section "ListDevices"
devs=$(busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager ListDevices); kv list_rc $?
kv listdevices "$devs"

section "rdmactl over the system bus: root, then an unprivileged user (nobody)"
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"; }
out=$(rdmactl list 2>&1); kv rdmactl_root_list_rc $?; echo "$out"
kv rdmactl_root_list_rxe0 "$(grep -c '^rxe0 ' <<<"$out")"
out=$(as_nobody rdmactl list 2>&1); kv rdmactl_user_list_rc $?; echo "$out"
out=$(as_nobody rdmactl claim rxe0 probe1 --shared 2>&1); kv rdmactl_user_claim_rc $?
echo "$out"
kv rdmactl_user_claim_err "$(head -n 1 <<<"$out")"

section "the CNI plugin (Go, a static binary): VERSION"
out=$(echo '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION /usr/lib/cni/rdmad)
kv cni_version_rc $?; echo "$out"
kv cni_versions "$(jget '" ".join(j["supportedVersions"])' <<<"$out" 2>&1)"

section "shared claim into netns probe1, then release"
claim=$(busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager Claim 'ssa{sv}' \
    rxe0 probe1 1 shared b true); kv claim_rc $?
kv claim "$claim"
ip netns exec probe1 ip -br link
ip netns exec probe1 rdma dev
path=$(sed -n 's/^o "\(.*\)"$/\1/p' <<<"$claim")
if [ -n "$path" ]; then
    busctl --system call io.rdmad1 "$path" io.rdmad1.Claim Release; kv release_rc $?
else
    kv release_rc "no-claim-path"
fi
kv listdevices_after "$(busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager ListDevices)"

section "apt remove with a live claim, then reinstall: the claim is reconciled"
# a shared claim: the macvlan child net1 in probe1 is the claim's netdev (rxe0's own veth0
# cannot move: a software RDMA device dies with its netdev's move)
out=$(rdmactl --json claim rxe0 probe1 --shared --ifname net1 2>&1); kv pkg_claim_rc $?
echo "$out"
pkg_claim=$(jget 'j["id"]' <<<"$out" 2>&1)
kv pkg_claim_id "$pkg_claim"
apt-get remove -y -q rdmad; kv apt_remove_rc $?
kv removed_active "$(systemctl is-active rdmad)"
kv removed_netdev "$(ip netns exec probe1 ip -br link show net1 2>&1 | cut -d' ' -f1)"
(cd /root && apt-get install -y -q ./rdmad_*.deb); kv apt_install_rc $?
kv reinstalled_active "$(systemctl is-active rdmad)"
out=$(rdmactl --json claims 2>&1); kv reinstalled_claims_rc $?; echo "$out"
kv reinstalled_claim_ids "$(jget '" ".join(c["id"] for c in j)' <<<"$out" 2>&1)"
kv reinstalled_device "$(rdmactl --json list 2>&1 | jget '[d["state"] for d in j if d["name"] == "rxe0"]')"
rdmactl release "$pkg_claim"; kv pkg_release_rc $?
kv released_child "$(ip netns exec probe1 ip -o link show 2>&1 | grep -c ' net1@')"

section "systemd-analyze security rdmad.service"
sec=$(systemd-analyze security rdmad.service --no-pager 2>&1); kv security_rc $?
echo "$sec"
kv security "$(grep -m1 'Overall exposure level' <<<"$sec")"
# the same unit files read offline (what README quoted before this check existed)
kv security_offline "$(systemd-analyze security --offline=yes --no-pager \
    /lib/systemd/system/rdmad.service 2>&1 | grep -m1 'Overall exposure level')"

section "systemctl stop rdmad"
t0=$(date +%s%N)
systemctl stop rdmad; kv stop_rc $?
kv stop_ms $(( ($(date +%s%N) - t0) / 1000000 ))
systemctl show rdmad -p ActiveState -p Result -p ExecMainCode -p ExecMainStatus | sed 's/^/@stopped./'

section "journal (rdmad, verbose, RDMAD_* events)"
journalctl --sync 2>/dev/null
jr=$(journalctl -u rdmad -o verbose --no-pager)
kv journal_rdmad_fields "$(grep -c '^ *RDMAD_CLAIM=' <<<"$jr")"
# a handler that raises loses the record to stderr as "--- Logging error ---"
kv journal_logging_errors "$(journalctl -u rdmad -o cat --no-pager | grep -c -- '--- Logging error ---')"
# the records of this run that name rxe0 (claim, release), verbose: the RDMAD_* fields
journalctl -o verbose --no-pager _SYSTEMD_UNIT=rdmad.service RDMAD_DEVICE=rxe0 \
    | grep -E '^[A-Z][a-z]{2} |^ *(MESSAGE|MESSAGE_ID|PRIORITY|CODE_[A-Z]+|RDMAD_[A-Z_]+)=' | tail -n 40
section "journal (rdmad, short)"
journalctl -u rdmad --no-pager | tail -n 30

kv uptime_end "$(cut -d' ' -f1 /proc/uptime)"
kv "done" 1
sync
mv "$OUT.tmp" "$OUT"
sync
