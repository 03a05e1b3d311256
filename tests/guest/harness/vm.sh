# shellcheck shell=bash disable=SC2034
# (SC2034: vng_rc is read by the scripts that source this file)
# How a guest is booted: sourced by run-in-guest.sh and run-systemd-check.sh (after pins.sh,
# so that CACHE is set).

# guest_accel: kvm where /dev/kvm is usable and is not the PVM flavour (stock kernels hang
# under kvm_pvm), else tcg. RDMAD_GUEST_ACCEL=kvm|tcg overrides.
guest_accel() {
    local accel=${RDMAD_GUEST_ACCEL:-auto}
    if [ "$accel" = auto ]; then
        accel=tcg
        if [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then accel=kvm; fi
    fi
    echo "$accel"
}

# run_vm TIMEOUT_S REMOVE_ON_EXIT OUT ERR VNG_ARGS... : boot vng with stdout to OUT and
# stderr to ERR (ERR "&1": to OUT as well) and wait; vng_rc is its status (124/137: timed out).
# qemu re-opens /proc/self/fd/1 and 2 itself: OUT and ERR must be FIFOs, never regular files.
# timeout(1) puts vng+qemu in a process group of their own (pgid = its pid): killing our
# caller's group would orphan a running qemu, so INT/TERM (and any exit) are forwarded to it.
run_vm() {
    local timeout_s=$1 remove=$2 out=$3 err=$4
    shift 4
    if [ "$err" = "&1" ]; then
        PATH="$CACHE/vng-venv/bin:$PATH" timeout --kill-after=10 "$timeout_s" vng "$@" \
            </dev/null >"$out" 2>&1 &
    else
        PATH="$CACHE/vng-venv/bin:$PATH" timeout --kill-after=10 "$timeout_s" vng "$@" \
            </dev/null >"$out" 2>"$err" &
    fi
    _vm_pid=$!
    # shellcheck disable=SC2064  # the path is fixed now, on purpose
    trap "stop_vm; wait; rm -rf -- $(printf %q "$remove")" EXIT
    trap 'stop_vm; exit 130' INT
    trap 'stop_vm; exit 143' TERM
    wait "$_vm_pid" && vng_rc=0 || vng_rc=$?
}

# shellcheck disable=SC2317  # called from the traps
stop_vm() { kill -TERM -- "-$_vm_pid" 2>/dev/null || true; }
