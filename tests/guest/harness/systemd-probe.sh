#!/bin/bash
# systemd-probe.sh - runs INSIDE the systemd guest image (rdmad-probe.service, after
# multi-user.target); installed there by systemd-image.sh as /usr/local/bin/rdmad-probe.sh.
# Writes /rdmad-probe.out (the root is the host's image dir over 9p, --rw): free-form
# output, plus "@key=value" lines that run-systemd-check.sh checks. The file appears only
# when the probe ran to its end (written as .tmp, renamed last), so a half run cannot pass.
# Every step runs even when an earlier one failed: the host decides, with the whole record.
set -u
OUT=/rdmad-probe.out
rm -f "$OUT" "$OUT.tmp"
exec >"$OUT.tmp" 2>&1

kv() { printf '@%s=%s\n' "$1" "$2"; }
section() { printf '\n===== %s\n' "$*"; }

kv pid1 "$(cat /proc/1/comm)"
kv kernel "$(uname -r)"
kv uptime_start "$(cut -d' ' -f1 /proc/uptime)"
kv systemd_version "$(systemctl --version | head -1)"

section "RDMA set-up: modules, veth, rxe0, netns probe1"
modprobe -a ib_core ib_uverbs rdma_ucm rdma_rxe veth; kv modprobe_rc $?
ip link add veth0 type veth peer name veth1 && ip link set veth0 up && ip link set veth1 up
kv veth_rc $?
rdma link add rxe0 type rxe netdev veth0; kv rxe_rc $?
rdma dev
# before rdmad starts: the netns bind mount then exists in rdmad's mount namespace from
# the start (no reliance on propagation into ProtectSystem='s private namespace)
ip netns add probe1; kv netns_rc $?

section "systemctl start rdmad"
t0=$(date +%s%N)
systemctl start rdmad; kv start_rc $?
kv start_ms $(( ($(date +%s%N) - t0) / 1000000 ))
kv is_active "$(systemctl is-active rdmad)"
systemctl show rdmad -p Type -p NotifyAccess -p ActiveState -p SubState -p StatusText \
    -p WatchdogUSec -p NRestarts | sed 's/^/@show./'

section "ListDevices"
devs=$(busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager ListDevices); kv list_rc $?
kv listdevices "$devs"

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

section "systemd-analyze security rdmad.service"
sec=$(systemd-analyze security rdmad.service --no-pager 2>&1); kv security_rc $?
echo "$sec"
kv security "$(grep -m1 'Overall exposure level' <<<"$sec")"
# the same unit files read offline (what README quoted before this check existed)
kv security_offline "$(systemd-analyze security --offline=yes --no-pager \
    /etc/systemd/system/rdmad.service 2>&1 | grep -m1 'Overall exposure level')"

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
