#!/bin/bash
# demo-steps.sh - the life of a claim, shown with rdmactl against a running rdmad.
# Runs inside the RDMA guest (real rxe device) or on the host (--sim: simulated RDMA backend
# bound to a real veth). Starts its own private dbus-daemon; leaves nothing behind.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
mode=${1:-guest}
work=$(mktemp -d /tmp/rdmad-demo.XXXXXX)
ns=demo$$
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
rdmactl() { PYTHONPATH="$ROOT" "$PY" -m rdmad.cli.main "$@"; }

cleanup() {
    set +e
    [ -n "${mon:-}" ] && kill "$mon" 2>/dev/null
    [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    [ -n "${busd:-}" ] && kill "$busd" 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    [ "$mode" = guest ] && rdma link del rxedemo 2>/dev/null
    ip link del vdemo0 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

step "a private D-Bus system bus for the demo"
cat > "$work/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$work/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/>
  </policy>
</busconfig>
CONF
dbus-daemon --config-file="$work/bus.conf" --nofork --nopidfile 2>/dev/null & busd=$!
export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$work/bus"
for _ in $(seq 100); do [ -S "$work/bus" ] && break; sleep 0.05; done
echo "bus at $DBUS_SYSTEM_BUS_ADDRESS"

step "a NIC with an RDMA device on it"
run ip link add vdemo0 type veth peer name vdemo1
run ip link set vdemo0 up
run ip link set vdemo1 up
if [ "$mode" = guest ]; then
    run rdma link add rxedemo type rxe netdev vdemo0
    args=()
    dev=rxedemo
else
    echo "(host kernel has no RDMA: simulated RDMA device sim0 bound to the real veth vdemo0)"
    args=(--sim-devices sim0=vdemo0)
    dev=sim0
fi

step "start rdmad (waits for READY=1 from sd_notify)"
mkfifo "$work/notify.fifo" 2>/dev/null || true
PYTHONPATH="$ROOT" "$PY" -m rdmad.daemon.main --state-dir "$work/state" --cdi-dir "$work/cdi" \
    "${args[@]}" 2>"$work/rdmad.log" & daemon=$!
for _ in $(seq 600); do rdmactl status >/dev/null 2>&1 && break; kill -0 "$daemon" || { cat "$work/rdmad.log"; exit 1; }; sleep 0.1; done
run rdmactl status
rdmactl monitor > "$work/monitor.log" 2>&1 & mon=$!

step "list the RDMA devices"
run rdmactl list

step "a container's netns, and a shared claim into it"
run ip netns add "$ns"
echo "$ rdmactl --json claim $dev $ns --shared --ifname net1 --address 192.0.2.10/24"
rdmactl --json claim "$dev" "$ns" --shared --ifname net1 --address 192.0.2.10/24 | tee "$work/claim.json"
run rdmactl claims

step "inside the netns: the macvlan child, the RDMA device, its char devices"
run ip -n "$ns" -br addr show net1
if [ "$mode" = guest ]; then
    run ip netns exec "$ns" rdma dev
    run ip netns exec "$ns" rdma link
fi
run rdmactl show "$dev"
echo "the claim's char devices, compared with /dev (read from the kernel after the move):"
"$PY" - "$work/claim.json" <<'PYEOF'
import json, os, sys
claim = json.load(open(sys.argv[1]))
for c in claim["char_devices"]:
    path, want = c["path"], f'{c["major"]}:{c["minor"]}'
    if os.path.exists(path):
        st = os.stat(path)
        have = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    else:
        have = "absent (simulated device)"
    print(f"  {path:28} claim {want:8} /dev {have}")
PYEOF

if [ "$mode" = guest ]; then
    step "RDMA traffic through the claim: ib_write_bw inside the netns"
    echo "the claim's CDI spec gives a container this environment:"
    "$PY" - "$work/claim.json" "$work/cdi" > "$work/claim.env" <<'PYEOF'
import json, shlex, sys
claim = json.load(open(sys.argv[1]))
spec = json.load(open(f"{sys.argv[2]}/rdmad.io-rdma-{claim['id']}.json"))
for kv in spec["devices"][0]["containerEdits"]["env"]:
    key, _, value = kv.partition("=")
    print(f"export {key}={shlex.quote(value)}")
PYEOF
    sed 's/^export /  /' "$work/claim.env"
    . "$work/claim.env"
    ip -n "$ns" link set lo up  # server and client meet over 127.0.0.1, as in a pod
    bw=(ib_write_bw -F -d "$RDMAD_DEVICE" -x "$RDMAD_GID_INDEX" -n 2000)
    echo "counters of $RDMAD_DEVICE before:"
    run rdma statistic show link "$RDMAD_DEVICE/$RDMAD_PORT"
    ip netns exec "$ns" "${bw[@]}" > "$work/bw-server.log" 2>&1 & server=$!
    echo "$ ip netns exec $ns ${bw[*]} 127.0.0.1   (server: the same, without the address)"
    # the server prints nothing when it listens: start the client until it gets through
    until ip netns exec "$ns" "${bw[@]}" 127.0.0.1 > "$work/bw-client.log" 2>&1 \
        || ! grep -q "Couldn't connect" "$work/bw-client.log"; do sleep 0.2; done
    wait "$server" || { cat "$work/bw-server.log" "$work/bw-client.log"; exit 1; }
    grep -A1 '#bytes' "$work/bw-client.log" | sed 's/^/  /'
    grep -q '#bytes' "$work/bw-server.log" || { echo "demo FAILED: the server saw no traffic"; exit 1; }
    echo "counters of $RDMAD_DEVICE after:"
    run rdma statistic show link "$RDMAD_DEVICE/$RDMAD_PORT"
fi

step "the netns dies: rdmad ends the claim by itself"
run ip netns del "$ns"
for _ in $(seq 200); do grep -q netns-gone "$work/monitor.log" && break; sleep 0.05; done
echo "signals seen by 'rdmactl monitor':"
sed 's/^/  /' "$work/monitor.log"
run rdmactl claims
run rdmactl list
grep -q netns-gone "$work/monitor.log" || { echo "demo FAILED: no Released(netns-gone)"; exit 1; }
step "done"
