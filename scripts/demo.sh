#!/bin/bash
# demo.sh - the main job: rdmad handing an RDMA device to a container netns and taking it
# back when the netns dies.
#   scripts/demo.sh --guest   on a real RDMA kernel (trixie-backports 7.3, soft-RoCE) in QEMU
#   scripts/demo.sh --host    on this host, with the simulated RDMA backend on a real veth
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:---guest} in
    --guest)
        echo "[demo] booting the RDMA guest (kernel 7.3; ~1-2 min under software emulation)"
        exec "$ROOT/tests/guest/harness/run-in-guest.sh" --kernel 7.3 -- \
            "$ROOT/scripts/demo-steps.sh" guest ;;
    --host) exec "$ROOT/scripts/demo-steps.sh" sim ;;
    *) echo "usage: $0 [--guest|--host]" >&2; exit 2 ;;
esac
