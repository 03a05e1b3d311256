"""A CRI pod whose RDMA claim is limited (`hcaHandles=1`): the script its container runs, the
host paths it needs, and what a run leaves to check. Shared by the 7.3 guest's cgroupfs-driver
test and the systemd check's systemd-driver test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdmad.model import RdmaLimit

SCRIPT_TIMEOUT_S = 300  # two verbs tools under TCG, on a loaded host
HOST_MOUNTS = ("/usr", "/lib", "/lib64", "/etc/libibverbs.d")  # rdma-core
# busybox sh, the host's tools on PATH: a first context held by an ibv_rc_pingpong server
# (it prints its local address once its context and QP exist, then waits for a client),
# then a second open of the same device by ibv_devinfo, and its exit status. stdbuf: its
# stdout is a file, which libc would buffer until it exits.
SCRIPT = """
export PATH=/usr/bin:/bin
stdbuf -oL ibv_rc_pingpong -d $RDMAD_DEVICE -g $RDMAD_GID_INDEX > /tmp/first 2>&1 &
first=$!
until grep -q "local address" /tmp/first || ! kill -0 $first 2>/dev/null; do sleep 0.2; done
echo "== first"; cat /tmp/first
echo "== second"; ibv_devinfo -d $RDMAD_DEVICE 2>&1; echo "exit=$?"
kill $first; true
"""


@dataclass(frozen=True)
class LimitedPod:
    """What the module's one pod run left to check."""

    device: str
    cgroup: str  # the pod's, relative to the cgroup2 mount
    limit_running: RdmaLimit | None  # the device's line in its rdma.max while the pod ran
    out: str  # the container's script's output
    after: list[Any]  # ListClaims once the pod was stopped and removed
    limit_after: RdmaLimit | None  # the device's line then

    def section(self, name: str) -> str:
        _, _, rest = self.out.partition(f"== {name}\n")
        return rest.split("\n== ", 1)[0]
