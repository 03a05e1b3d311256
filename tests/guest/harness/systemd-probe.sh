#!/bin/bash
# systemd-probe.sh - runs INSIDE the systemd guest image; installed there by
# systemd-image.sh as /usr/local/bin/rdmad-probe.sh, for two units:
#   rdmad-probe.sh setup   rdmad-probe-setup.service, at boot, Before=rdmad.service: the
#                          RDMA device and netns a node has when rdmad starts at boot;
#                          writes /rdmad-setup.out
#   rdmad-probe.sh         rdmad-probe.service, after multi-user.target: the checks
# The probe writes /rdmad-probe.out (the root is a copy of the image dir on a virtio disk,
# which the host reads it back from): free-form output, plus "@key=value" lines that
# run-systemd-check.sh checks (the set-up's record included). The file appears only when
# the probe ran to its end (written as .tmp, renamed last), so a half run cannot pass.
# Every step runs even when an earlier one failed: the host decides, with the whole record.
set -u

kv() { printf '@%s=%s\n' "$1" "$2"; }
# section KEY TITLE: a section's header, and its start (uptime, s) as @t.KEY
section() { printf '\n===== %s\n' "$2"; kv "t.$1" "$(uptime_s)"; }
# Under emulation each Python start costs seconds (rdmactl's imports ~20 s under TCG on a
# busy host): rdmactl runs where it is what is checked (the bus policy, an error's class);
# elsewhere busctl makes the same calls.
# mgr METHOD [SIG ARGS...]: a call on rdmad's Manager
mgr() { busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager "$@"; }
# opath: the object path of busctl's `o "/io/rdmad1/..."` on stdin
opath() { sed -n 's/^o "\(.*\)"$/\1/p'; }
# release PATH: Claim.Release
release() { busctl --system call io.rdmad1 "$1" io.rdmad1.Claim Release; }
# claim_ids: the ids in ListClaims's reply on stdin, space-separated
claim_ids() { grep -o '/io/rdmad1/claim/[0-9a-f]*' | sed 's,.*/,,' | paste -sd' '; }
# uptime: seconds since boot
uptime_s() { cut -d' ' -f1 /proc/uptime; }

if [ "${1:-}" = setup ]; then
    exec >/rdmad-setup.out 2>&1
    section setup "RDMA set-up at boot, before rdmad starts: modules, veth, rxe0, netns probe1"
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
kv t.probe "$(uptime_s)"
kv systemd_version "$(systemctl --version | head -1)"
cat /rdmad-setup.out

section boot "rdmad started at boot (installed by apt install ./rdmad_*.deb)"
kv boot_package "$(dpkg-query -W -f='${Status} ${Version}' rdmad)"
kv boot_enabled "$(systemctl is-enabled rdmad)"
# joins the boot's start job if it is still running; a no-op once rdmad is up
systemctl start rdmad; kv start_rc $?
# when the boot's start began and when rdmad said READY (monotonic, us)
mono() { systemctl show rdmad -p "$1" --value; }
began=$(mono InactiveExitTimestampMonotonic) ready=$(mono ActiveEnterTimestampMonotonic)
kv start_ms $(( (ready - began) / 1000 ))
kv t.rdmad_start "$(( began / 1000000 ))"
kv t.rdmad_ready "$(( ready / 1000000 ))"
kv is_active "$(systemctl is-active rdmad)"
systemctl show rdmad -p Type -p NotifyAccess -p ActiveState -p SubState -p StatusText \
    -p WatchdogUSec -p NRestarts | sed 's/^/@show./'

section list "ListDevices"
devs=$(busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager ListDevices); kv list_rc $?
kv listdevices "$devs"

section rdmactl "rdmactl over the system bus: root, then an unprivileged user (nobody)"
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"; }
out=$(rdmactl list 2>&1); kv rdmactl_root_list_rc $?; echo "$out"
kv rdmactl_root_list_rxe0 "$(grep -c '^rxe0 ' <<<"$out")"
out=$(as_nobody rdmactl list 2>&1); kv rdmactl_user_list_rc $?; echo "$out"
out=$(as_nobody rdmactl claim rxe0 probe1 --shared 2>&1); kv rdmactl_user_claim_rc $?
echo "$out"
kv rdmactl_user_claim_err "$(head -n 1 <<<"$out")"

section polkit "polkit: the package's actions; a user's share refused by the defaults, then allowed"
actions=/usr/share/polkit-1/actions/io.rdmad1.policy
kv polkit_action_file "$(dpkg-query -S "$actions" 2>&1)"
known=$(pkaction)   # every action polkitd has read
listed=()
for id in $(sed -n 's/.*<action id="\([^"]*\)".*/\1/p' "$actions"); do
    grep -qxF "$id" <<<"$known" && listed+=("$id")
done
kv polkit_listed "${listed[*]}"
# nobody claims a share of rxe0 into a netns of its own (its own user namespace's): refused
# by the actions' defaults (auth_admin; rdmactl, which names the error), allowed once a
# rule says so (busctl, then the claim's release)
own_netns() { as_nobody unshare --user --net sh -c "$1"; }
# shellcheck disable=SC2016  # expanded by the inner shell
out=$(own_netns 'rdmactl claim rxe0 "pid:$$" --shared' 2>&1); kv polkit_default_rc $?; echo "$out"
kv polkit_default_err "$(head -n 1 <<<"$out")"
rules=/etc/polkit-1/rules.d/50-rdmad-probe.rules
cat > "$rules" <<'RULES'
polkit.addRule(function(action, subject) {
    if ((action.id == "io.rdmad1.claim-share" || action.id == "io.rdmad1.release-own") &&
        subject.user == "nobody")
        return polkit.Result.YES;
});
RULES
systemctl restart polkit   # the rule read now, not when polkitd's file monitor fires
# shellcheck disable=SC2016  # expanded by the inner shell
out=$(own_netns 'c=$(busctl --system call io.rdmad1 /io/rdmad1 io.rdmad1.Manager Claim "ssa{sv}" \
        rxe0 "pid:$$" 1 shared b true) || exit 1
    echo "$c"; c=${c#o \"}; busctl --system call io.rdmad1 "${c%\"}" io.rdmad1.Claim Release' 2>&1)
kv polkit_rule_rc $?; echo "$out"
rm -f "$rules"   # (nothing asks for nobody again: no restart)

section cni "the CNI plugin (Go, a static binary): VERSION"
out=$(echo '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION /usr/lib/cni/rdmad)
kv cni_version_rc $?; echo "$out"
kv cni_versions "$(sed -n 's/.*"supportedVersions": *\[\([^]]*\)\].*/\1/p' <<<"$out" \
    | tr -d '" ' | tr ',' ' ')"

section claim "shared claim into netns probe1, then release"
claim=$(mgr Claim 'ssa{sv}' rxe0 probe1 1 shared b true); kv claim_rc $?
kv claim "$claim"
ip netns exec probe1 ip -br link
ip netns exec probe1 rdma dev
path=$(opath <<<"$claim")
if [ -n "$path" ]; then
    release "$path"; kv release_rc $?
else
    kv release_rc "no-claim-path"
fi
kv listdevices_after "$(mgr ListDevices)"

section apt "apt remove with a live claim, then reinstall: the claim is reconciled"
# a shared claim: the macvlan child net1 in probe1 is the claim's netdev (rxe0's own veth0
# cannot move: a software RDMA device dies with its netdev's move)
out=$(mgr Claim 'ssa{sv}' rxe0 probe1 2 shared b true ifname s net1 2>&1); kv pkg_claim_rc $?
echo "$out"
pkg_path=$(opath <<<"$out")
kv pkg_claim_id "${pkg_path##*/}"
apt-get remove -y -q rdmad; kv apt_remove_rc $?
kv removed_package "$(dpkg-query -W -f='${Status}' rdmad)"
kv removed_active "$(systemctl is-active rdmad)"
kv removed_netdev "$(ip netns exec probe1 ip -br link show net1 2>&1 | cut -d' ' -f1)"
kv t.apt_reinstall "$(uptime_s)"
(cd /root && apt-get install -y -q ./rdmad_*.deb); kv apt_install_rc $?
kv t.apt_reinstalled "$(uptime_s)"
kv reinstalled_active "$(systemctl is-active rdmad)"
out=$(mgr ListClaims 2>&1); kv reinstalled_claims_rc $?; echo "$out"
kv reinstalled_claim_ids "$(claim_ids <<<"$out")"
kv reinstalled_device "$(mgr ListDevices 2>&1 | grep -o '"rxe0" "[a-z-]*"' | cut -d'"' -f4)"
release "$pkg_path"; kv pkg_release_rc $?
kv released_child "$(ip netns exec probe1 ip -o link show 2>&1 | grep -c ' net1@')"

section cri "a CRI pod under the kubelet's systemd cgroup driver: containerd 2, runc, rdmad-cni"
# tests/systemd, from the host's checkout with its venv and containerd's cache: vng's
# --rodir shares (virtme_initmountN=PATH on the command line, tag virtme.initmountN), which
# vng mounts only for its own shell: mounted here, read-only, and cached (the host does
# not change them during the run; uncached, each stat of Python's imports is a 9p round
# trip through the emulated CPU)
for arg in $(cat /proc/cmdline); do
    [[ $arg =~ ^virtme_initmount([0-9]+)=(/.*)$ ]] || continue
    mkdir -p "${BASH_REMATCH[2]}"
    mount -t 9p -o ro,trans=virtio,version=9p2000.L,access=any,msize=524288,cache=loose \
        "virtme.initmount${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" || echo "mount of $arg failed"
done
checkout=$(cat /etc/rdmad-probe-checkout)
# temporary files (containerd's root, state and socket among them) on a tmpfs, not the 9p root
mkdir -p /run/rdmad-cri
# (no test here uses hypothesis: its plugin alone imports it, seconds under emulation)
out=$(cd "$checkout" && HOME=/root TMPDIR=/run/rdmad-cri CI=true RDMAD_SYSTEMD_GUEST=1 \
    PYTHONDONTWRITEBYTECODE=1 .venv/bin/python -m pytest -p no:cacheprovider \
    -p no:hypothesispytest -q -ra tests/systemd 2>&1)
kv cri_rc $?; echo "$out"
kv cri_summary "$(tail -n 1 <<<"$out")"

section security "systemd-analyze security rdmad.service"
sec=$(systemd-analyze security rdmad.service --no-pager 2>&1); kv security_rc $?
echo "$sec"
kv security "$(grep -m1 'Overall exposure level' <<<"$sec")"
# the same unit files read offline (what README quoted before this check existed)
kv security_offline "$(systemd-analyze security --offline=yes --no-pager \
    /lib/systemd/system/rdmad.service 2>&1 | grep -m1 'Overall exposure level')"

section refuse "a give-back the kernel refuses at start: rdmad comes up anyway, no restart loop"
# A claim that moves its netdev, whose give-back the kernel refuses: rxe0's netdev cannot
# move (a software device dies with it), so for this section, the probe's last with rdmad
# running, rdmad runs its simulated RDMA half (--sim-devices, in a runtime drop-in) on a
# real veth: the refusal is rtnetlink's own.
ip link add vsim0 type veth peer name vsim1 && ip link set vsim0 up && ip link set vsim1 up \
    && ip addr add 198.51.100.7/24 dev vsim0 && ip netns add probe2
kv refuse_setup_rc $?
dropin=/run/systemd/system/rdmad.service.d
mkdir -p "$dropin"
printf '%s\n' '[Service]' 'ExecStart=' \
    'ExecStart=/usr/bin/rdmad --config /etc/rdmad/rdmad.toml --sim-devices sim0=vsim0' \
    > "$dropin/60-sim.conf"
systemctl daemon-reload
systemctl restart rdmad; kv refuse_sim_start_rc $?
out=$(mgr Claim 'ssa{sv}' sim0 probe2 1 ifname s net0 2>&1); kv refuse_claim_rc $?; echo "$out"
refuse_path=$(opath <<<"$out")
refuse_id=${refuse_path##*/}
kv refuse_claim_id "$refuse_id"
# the netdev's home name taken while it is away in probe2: renaming it home fails (EEXIST),
# so the Release fails and leaves the claim on record as being released
ip link add vsim0 type veth peer name vsq1; kv refuse_squatter_rc $?
out=$(release "$refuse_path" 2>&1); kv refuse_release_rc $?; echo "$out"
restarts_before=$(systemctl show rdmad -p NRestarts --value)
# the next start finishes that release, and the kernel refuses it again
kv t.refuse_restart "$(uptime_s)"
systemctl restart rdmad; kv refuse_restart_rc $?
# A start that failed on the claim would be retried every RestartSec (2 s): the unit is
# watched for more than two of those (the reads below in them) before its restarts count.
watch_end=$(( $(date +%s) + 5 ))
kv refuse_status "$(systemctl show rdmad -p StatusText --value)"
out=$(mgr ListClaims 2>&1); kv refuse_claims_rc $?; echo "$out"
kv refuse_claim_ids "$(claim_ids <<<"$out")"
kv refuse_state "$(busctl --system get-property io.rdmad1 "$refuse_path" io.rdmad1.Claim State 2>&1)"
kv refuse_failure "$(busctl --system get-property io.rdmad1 "$refuse_path" io.rdmad1.Claim Failure 2>&1)"
journalctl --sync 2>/dev/null
kv refuse_journal "$(journalctl -u rdmad -o cat --no-pager MESSAGE_ID=84fed45eb174426fa1eb8cdd58df960d \
    RDMAD_CLAIM="$refuse_id" | grep -c 'not-returned')"
while [ "$(date +%s)" -lt "$watch_end" ]; do sleep 1; done
kv refuse_active "$(systemctl is-active rdmad)"
kv refuse_nrestarts "$restarts_before $(systemctl show rdmad -p NRestarts --value)"
# The obstacle gone, the claim is given back: by rdmad's retry on that change (the sim binds
# sim0 by name at start, to the squatter), or else by this Release.
ip link del vsim0
out=$(release "$refuse_path" 2>&1); echo "release once the name is free: $? $out"
out=$(mgr ListClaims 2>&1); echo "$out"
kv refuse_claims_after "$(awk '{print $2; exit}' <<<"$out")"
kv refuse_home "$(ip -br addr show vsim0 2>&1 | awk '{sub(/@.*/, "", $1); print $1, $3}')"

section stop "systemctl stop rdmad"
t0=$(date +%s%N)
systemctl stop rdmad; kv stop_rc $?
kv stop_ms $(( ($(date +%s%N) - t0) / 1000000 ))
systemctl show rdmad -p ActiveState -p Result -p ExecMainCode -p ExecMainStatus | sed 's/^/@stopped./'
rm -f "$dropin/60-sim.conf"; systemctl daemon-reload
ip link del vsim0; ip netns del probe2

section journal "journal (rdmad, verbose, RDMAD_* events)"
journalctl --sync 2>/dev/null
jr=$(journalctl -u rdmad -o verbose --no-pager)
kv journal_rdmad_fields "$(grep -c '^ *RDMAD_CLAIM=' <<<"$jr")"
# a handler that raises loses the record to stderr as "--- Logging error ---"
kv journal_logging_errors "$(journalctl -u rdmad -o cat --no-pager | grep -c -- '--- Logging error ---')"
# the records of this run that name rxe0 (claim, release), verbose: the RDMAD_* fields
journalctl -o verbose --no-pager _SYSTEMD_UNIT=rdmad.service RDMAD_DEVICE=rxe0 \
    | grep -E '^[A-Z][a-z]{2} |^ *(MESSAGE|MESSAGE_ID|PRIORITY|CODE_[A-Z]+|RDMAD_[A-Z_]+)=' | tail -n 40
section journal_short "journal (rdmad, short)"
journalctl -u rdmad --no-pager | tail -n 30

kv t.end "$(uptime_s)"
# the boot's whole journal, with monotonic times, beside the record: where the time went
journalctl -b -o short-monotonic --no-pager > /rdmad-probe.journal 2>&1
kv "done" 1
sync
mv "$OUT.tmp" "$OUT"
sync
