"""CDI spec files, one per claim, so a runtime can inject the claim's char devices by name
(`podman --device rdmad.io/rdma=<claim id>`, containerd's CDI support), and by the name its
caller chose (`cdi_name`, which rdmad-cni derives from the attachment) when it gave one; and
one per pod that asked for a pod CDI name (`pod_cdi_name`), with all its claims' devices.

A pod is the claims in one netns. Every spec of a pod carries the same environment, which
describes all the pod's rails (pod_env): a runtime that injects several of them keeps one
value per key whatever their order. So a claim made or ended, or a change to its GIDs,
rewrites every spec of its pod: O(claims in the netns).

Written as rdmad's state files are (rdmad.core.swapfile.write_swapped): a rewrite is swapped in
from one spare, `.rdmad.io-rdma.spare`, and frees no inode, as renaming a temp file over the
spec would, right before the pod's next claim moves a netdev. Nothing is synced: start
rewrites every spec (CdiWriter.sync), so a spec needs to outlive rdmad, not the kernel.
Runtimes read only the directory's *.json and *.yaml files (container-device-interface,
scanSpecDirs), never the spare."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from rdmad.core.observer import CoreObserver
from rdmad.core.swapfile import write_swapped
from rdmad.model import ROCE_V2, Claim, Gid, ReleaseReason

CDI_KIND = "rdmad.io/rdma"
SPARE = ".rdmad.io-rdma.spare"  # not *.json nor *.yaml: no runtime reads it
# podman 4.3 and containerd 1.6 read CDI specs up to 0.5.0 and refuse newer ones; 0.6.0
# would add per-device annotations, which rdmad does not need.
CDI_VERSION = "0.5.0"
_IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"

# The live claims of the netns a claim is in (it included while live), in pod order.
PodOf = Callable[[Claim], Sequence[Claim]]

log = logging.getLogger("rdmad.daemon.cdi")


def preferred_gid(gids: tuple[Gid, ...]) -> Gid | None:
    """The entry NCCL and perftest should use: RoCE v2 over IPv4 routes anywhere the
    netns's address does; then any RoCE v2 entry; then the first (InfiniBand)."""
    v2 = [g for g in gids if g.type == ROCE_V2]
    v4 = [g for g in v2 if g.gid.startswith(_IPV4_MAPPED)]
    return next(iter(v4 or v2 or gids), None)


def pod_order(claims: Sequence[Claim]) -> list[Claim]:
    """The order of a pod's rails in every list the env gives: by interface name in the pod,
    then by RDMA device name (claims that moved no netdev have no interface name)."""
    return sorted(claims, key=lambda c: (c.ifname, c.device, c.id))


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


def pod_env(pod: Sequence[Claim]) -> list[str]:
    """The environment of every spec of a pod. One claim: its claim_env. Several: only keys
    whose value describes all the rails, as lists in pod_order, so that no key differs
    between the specs a runtime injects into one container."""
    if len(pod) == 1:
        return claim_env(pod[0])
    rails = pod_order(pod)
    gids = [preferred_gid(c.gids) for c in rails]
    hcas = [f"{c.device}:{g.port}" if g else c.device for c, g in zip(rails, gids, strict=True)]
    env = [
        f"RDMAD_DEVICES={','.join(c.device for c in rails)}",
        f"RDMAD_IFNAMES={','.join(c.ifname for c in rails)}",
        f"RDMAD_PORTS={','.join(str(g.port) if g else '' for g in gids)}",
        f"RDMAD_GID_INDEXES={','.join(str(g.index) if g else '' for g in gids)}",
        f"NCCL_IB_HCA=={','.join(hcas)}",  # one "=": exact names, for the whole list
    ]
    known = [g for g in gids if g is not None]
    if not known:
        return env
    if len(known) == len(gids) and len({g.index for g in known}) == 1:
        return [*env, f"NCCL_IB_GID_INDEX={known[0].index}"]
    # NCCL_IB_GID_INDEX is one index for every HCA: unset, NCCL (2.21+) picks a GID per port,
    # by these, the entry preferred_gid picks (IPv4 where a rail has it).
    v4 = any(g.gid.startswith(_IPV4_MAPPED) for g in known)
    return [
        *env,
        f"NCCL_IB_ADDR_FAMILY={'AF_INET' if v4 else 'AF_INET6'}",
        "NCCL_IB_ROCE_VERSION_NUM=2",
    ]


def _nodes(claims: Sequence[Claim]) -> list[dict[str, object]]:
    """The claims' char devices, each path once (every claim has the one rdma_cm)."""
    seen: dict[str, dict[str, object]] = {}
    for claim in claims:
        for c in claim.chardevs:
            seen.setdefault(
                c.path, {"path": c.path, "type": "c", "major": c.major, "minor": c.minor}
            )
    return list(seen.values())


def _spec(names: list[str], edits: dict[str, object]) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": name, "containerEdits": edits} for name in names],
    }


def spec_for(claim: Claim, env: list[str] | None = None) -> dict[str, object]:
    """A claim's spec: its own device nodes, its pod's env (`env`: pod_env of the claims of
    its netns; none given, it is alone)."""
    edits = {"env": claim_env(claim) if env is None else env, "deviceNodes": _nodes([claim])}
    return _spec([claim.id, claim.cdi_name] if claim.cdi_name else [claim.id], edits)


def pod_spec_for(name: str, pod: Sequence[Claim], env: list[str]) -> dict[str, object]:
    """The spec of a pod CDI name: every device node of the pod's claims, the pod's env
    (`env`: pod_env(pod))."""
    return _spec([name], {"env": env, "deviceNodes": _nodes(pod_order(pod))})


class CdiWriter(CoreObserver):
    """Observer: writes a claim's spec when it is made, removes it when the claim ends, and
    rewrites the other specs of its pod (and its pod CDI name's spec) either way, unless the
    pod's netns died."""

    def __init__(self, directory: Path, pod_of: PodOf) -> None:
        self.directory = directory
        self._spare = os.path.join(directory, SPARE)
        self._pod_of = pod_of
        # Paths as strings: a pod's rewrite names O(claims in it) files, and pathlib's
        # objects cost each more than its system calls.
        self._prefix = os.path.join(directory, "rdmad.io-rdma-")
        # What each spec file holds, as this process last wrote it: a pod's rewrite skips
        # the specs it would not change (a GID change the env does not show rewrote all).
        self._written: dict[str, bytes] = {}

    def path_for(self, claim_id: str) -> Path:
        return Path(self._claim_file(claim_id))

    def pod_path_for(self, pod_cdi_name: str) -> Path:
        return Path(self._pod_file(pod_cdi_name))

    def _claim_file(self, claim_id: str) -> str:
        return f"{self._prefix}{claim_id}.json"

    def _pod_file(self, pod_cdi_name: str) -> str:
        return f"{self._prefix}pod.{pod_cdi_name}.json"

    def _write(self, path: str, spec: dict[str, object]) -> None:
        """Swap `spec` in at `path` unless it holds it already."""
        # One line: json's C encoder does not indent, and the Python one took 60 us a spec.
        data = json.dumps(spec).encode()
        if self._written.get(path) == data:
            return
        try:
            # Readable by every runtime, as a spec written by a plain open() would be.
            write_swapped(path, data, self._spare, mode=0o644)
        except OSError as exc:
            # The claim stands (the kernel part is done); runtimes can still use CharDevices.
            log.error("cannot write CDI spec %s: %s", path, exc)
            self._written.pop(path, None)
            return
        self._written[path] = data

    def _remove(self, path: str) -> None:
        self._written.pop(path, None)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("cannot remove CDI spec %s: %s", path, exc)

    def _write_pod(self, pod: Sequence[Claim]) -> None:
        env = pod_env(pod)  # once: the same in every spec of the pod
        for c in pod:
            self._write(self._claim_file(c.id), spec_for(c, env))
        for name in {c.pod_cdi_name for c in pod if c.pod_cdi_name}:
            self._write(self._pod_file(name), pod_spec_for(name, pod, env))

    def claimed(self, claim: Claim) -> None:
        self._write_pod(self._pod_of(claim))

    def claim_changed(self, claim: Claim) -> None:
        self.claimed(claim)  # its GIDs changed: the env of its whole pod follows

    def released(self, claim: Claim, reason: ReleaseReason) -> None:
        self._remove(self._claim_file(claim.id))
        rest = self._pod_of(claim)
        if claim.pod_cdi_name and not any(c.pod_cdi_name == claim.pod_cdi_name for c in rest):
            self._remove(self._pod_file(claim.pod_cdi_name))
        if reason != ReleaseReason.NETNS_GONE:
            # A dead netns's other claims leave as well, each removing its own spec: rewriting
            # theirs would cost O(claims in the pod) a claim, O(n^2) a pod.
            self._write_pod(rest)

    def left_netns(self, claim: Claim, rest: list[Claim]) -> None:
        # Its own spec and pod CDI name's follow in claim_changed; those of the pod it left
        # must stop naming its devices now, or a container started from them gets them.
        self._write_pod(rest)

    def sync(self, live: list[Claim]) -> None:
        """At start: a spec for every live claim and pod CDI name, none for anything else."""
        keep = {self._claim_file(c.id) for c in live}
        keep |= {self._pod_file(c.pod_cdi_name) for c in live if c.pod_cdi_name}
        if self.directory.is_dir():
            # Specs of claims gone, and what older rdmads left: temp files (`.json.tmp`)
            # and spares (`.json.next`) beside each spec.
            for pattern in ("rdmad.io-rdma-*.json*", ".rdmad.io-rdma-*.json.tmp"):
                for stale in self.directory.glob(pattern):
                    if str(stale) not in keep:
                        stale.unlink(missing_ok=True)
        pods: dict[int | str, list[Claim]] = {}
        for claim in live:
            # netns 0: held for a pod whose netns does not exist yet, a pod of its own
            pods.setdefault(claim.netns_inode or claim.id, []).append(claim)
        for pod in pods.values():
            self._write_pod(pod)
