"""Where the kubelet puts a pod's cgroup, found from the pod's UID (its QoS class is not in
the ResourceClaim): the kubelet makes it before it prepares the pod's claims
(NodePrepareResources comes in the runtime's SyncPod, after the pod's cgroup exists).

  systemd driver:   kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice,
                    with the UID's dashes as underscores
  cgroupfs driver:  kubepods/<qos>/pod<uid>

with <qos> burstable or besteffort; a guaranteed pod's sits directly under kubepods
(kubepods.slice/kubepods-pod<uid>.slice, kubepods/pod<uid>).
"""

from __future__ import annotations

import re
from pathlib import Path

CGROUP2_MOUNT = Path("/sys/fs/cgroup")
_UID = re.compile(r"^[0-9A-Fa-f-]{1,64}$")  # a UUID: nothing that could leave a directory


def pod_cgroups(pod_uid: str) -> tuple[str, ...]:
    """The pod's cgroup under each driver and QoS class, relative to the cgroup2 mount."""
    if not _UID.match(pod_uid):
        raise ValueError(f"pod UID {pod_uid!r} is not a UUID")
    unit = pod_uid.replace("-", "_")
    systemd = [f"kubepods.slice/kubepods-pod{unit}.slice"] + [
        f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{unit}.slice"
        for qos in ("burstable", "besteffort")
    ]
    cgroupfs = [f"kubepods/pod{pod_uid}"] + [
        f"kubepods/{qos}/pod{pod_uid}" for qos in ("burstable", "besteffort")
    ]
    return (*systemd, *cgroupfs)


def find_pod_cgroup(root: Path, pod_uid: str) -> str | None:
    """The pod's cgroup that exists under the cgroup2 mount `root`, None if none does."""
    return next((c for c in pod_cgroups(pod_uid) if (root / c).is_dir()), None)
