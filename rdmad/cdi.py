"""CDI spec files, one per claim, so a runtime can inject the claim's char devices by name
(`podman --device rdmad.io/rdma=<claim id>`, containerd's CDI support), and by the name its
caller chose (`cdi_name`, which rdmad-cni derives from the attachment) when it gave one.

Written to a temp file beside the spec and renamed over it (rdmad.swapfile.write_renamed),
as the CDI library's own producer does: runtimes read only the directory's *.json and *.yaml
files (container-device-interface, scanSpecDirs), and the temp file is a dot-name ending in
.tmp, there only while a spec is written; one a crash left is removed at the next start."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rdmad.model import ROCE_V2, Claim, Gid, ReleaseReason
from rdmad.observer import CoreObserver
from rdmad.swapfile import write_renamed

CDI_KIND = "rdmad.io/rdma"
# podman 4.3 and containerd 1.6 read CDI specs up to 0.5.0 and refuse newer ones; 0.6.0
# would add per-device annotations, which rdmad does not need.
CDI_VERSION = "0.5.0"
_IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"

log = logging.getLogger("rdmad.cdi")


def preferred_gid(gids: tuple[Gid, ...]) -> Gid | None:
    """The entry NCCL and perftest should use: RoCE v2 over IPv4 routes anywhere the
    netns's address does; then any RoCE v2 entry; then the first (InfiniBand)."""
    v2 = [g for g in gids if g.type == ROCE_V2]
    v4 = [g for g in v2 if g.gid.startswith(_IPV4_MAPPED)]
    return next(iter(v4 or v2 or gids), None)


def claim_env(claim: Claim) -> list[str]:
    """Environment naming the claim's device and GID, so that NCCL (NCCL_IB_HCA,
    NCCL_IB_GID_INDEX) and perftest (-d $RDMAD_DEVICE -x $RDMAD_GID_INDEX) need no
    per-pod configuration."""
    env = [f"RDMAD_DEVICE={claim.device}"]
    gid = preferred_gid(claim.gids)
    if gid is None:
        return [*env, f"NCCL_IB_HCA=={claim.device}"]
    return [
        *env,
        f"RDMAD_PORT={gid.port}",
        f"RDMAD_GID_INDEX={gid.index}",
        f"NCCL_IB_HCA=={claim.device}:{gid.port}",  # "=": this name exactly, not a prefix
        f"NCCL_IB_GID_INDEX={gid.index}",
    ]


def spec_for(claim: Claim) -> dict[str, object]:
    edits = {
        "env": claim_env(claim),
        "deviceNodes": [
            {"path": c.path, "type": "c", "major": c.major, "minor": c.minor}
            for c in claim.chardevs
        ],
    }
    names = [claim.id, claim.cdi_name] if claim.cdi_name else [claim.id]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": name, "containerEdits": edits} for name in names],
    }


class CdiWriter(CoreObserver):
    """Observer: writes a spec when a claim is made, removes it when the claim ends."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, claim_id: str) -> Path:
        return self.directory / f"rdmad.io-rdma-{claim_id}.json"

    def claimed(self, claim: Claim) -> None:
        path = self.path_for(claim.id)
        try:
            # Readable by every runtime, as a spec written by a plain open() would be. One
            # line: json's C encoder does not indent, and the Python one took 60 us a spec.
            data = json.dumps(spec_for(claim)).encode()
            write_renamed(path, data, path.with_name(f".{path.name}.tmp"), mode=0o644)
        except OSError as exc:
            # The claim stands (the kernel part is done); runtimes can still use CharDevices.
            log.error("cannot write CDI spec %s: %s", path, exc)

    def claim_changed(self, claim: Claim) -> None:
        self.claimed(claim)  # its GIDs changed: the env follows

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        path = self.path_for(claim.id)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.error("cannot remove CDI spec for claim %s: %s", claim.id, exc)

    def sync(self, live: list[Claim]) -> None:
        """At start: a spec for every live claim, none for anything else."""
        keep = {self.path_for(c.id) for c in live}
        if self.directory.is_dir():
            # Specs of claims gone, temp files a crash left, and the spares (`.json.next`)
            # rdmad kept beside specs before it renamed them in.
            for pattern in ("rdmad.io-rdma-*.json*", ".rdmad.io-rdma-*.json.tmp"):
                for stale in self.directory.glob(pattern):
                    if stale not in keep:
                        stale.unlink(missing_ok=True)
        for claim in live:
            self.claimed(claim)
