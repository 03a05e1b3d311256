"""The claims on record, as the state machine (rdmad.core.core.Core) keeps them and the tracker
(rdmad.core.tracking.InventoryTracker) reads them to tell how each device looks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeVar

from rdmad.model import Claim, HostConfig

K = TypeVar("K")


class _Filing(NamedTuple):
    """Where the book has a claim filed: what its indexes by netns and host read."""

    inode: int
    nsid: int
    host: HostConfig | None


_HELD = _Filing(0, -1, None)  # a held claim: no netns, no netdev taken


class ClaimBook:
    """Plain records and queries: nothing here touches the kernel. Changed only through the
    methods below: the claims by the core (add, refile, drop, load), the netdevs still to
    restore by GiveBack (restore_later, restored), which is the one to restore them.
    Everything else only reads it."""

    def __init__(self) -> None:
        self._claims: dict[str, Claim] = {}
        # Netdevs whose netns died before the kernel handed them back: restore on return.
        self._restores: list[HostConfig] = []
        self._locks: dict[str, asyncio.Lock] = {}
        # The claims of each netns, by inode and by the nsid init_net knows it by, and the
        # (inode, nsid, host) each claim is filed under: a pod's claims without a walk over
        # the node's (rdmad.daemon.cdi rewrites a pod's specs together; a kernel event names an
        # nsid; a table is free in a netns if none of its claims has it).
        self._by_netns: dict[int, dict[str, Claim]] = {}
        self._by_nsid: dict[int, dict[str, Claim]] = {}
        self._filed: dict[str, _Filing] = {}
        # The claims that took a netdev from init_net, by its ifindex and name there and by
        # device: a link event finds the claims of its netdev, not every claim on the node.
        self._by_host_ifindex: dict[int, dict[str, Claim]] = {}
        self._by_host_name: dict[str, dict[str, Claim]] = {}
        self._hosted: dict[str, dict[str, Claim]] = {}
        # The claims of each device and each held-for pod (neither changes for a claim): a
        # claim, a view and a prepare look at theirs, not at every claim on the node.
        self._by_device: dict[str, dict[str, Claim]] = {}
        self._by_pod_uid: dict[str, dict[str, Claim]] = {}

    @property
    def claims(self) -> Mapping[str, Claim]:
        return self._claims

    @property
    def pending_restores(self) -> list[HostConfig]:
        """A copy: the list changes through restore_later and restored only."""
        return list(self._restores)

    def load(self, claims: Iterable[Claim], restores: Iterable[HostConfig]) -> None:
        """What the state file recorded, at start."""
        for claim in claims:
            self.add(claim)
        self._restores.extend(restores)

    def add(self, claim: Claim) -> None:
        self._claims[claim.id] = claim
        self.refile(claim)
        self._by_device.setdefault(claim.device, {})[claim.id] = claim
        if claim.hold is not None:
            self._by_pod_uid.setdefault(claim.hold.pod_uid, {})[claim.id] = claim

    def drop(self, claim: Claim) -> None:
        if self._claims.pop(claim.id, None) is None:
            return
        self._unfile(claim, self._filed.pop(claim.id))
        _unindex(self._by_device, claim.device, claim.id)
        if claim.hold is not None:
            _unindex(self._by_pod_uid, claim.hold.pod_uid, claim.id)

    def refile(self, claim: Claim) -> None:
        """File a claim on record under its netns's inode and nsid and its host netdev,
        moving it if any changed since. The core calls this wherever it changes them (an
        Attach, a placement, a claim held again), before its next await: a claim is never
        filed where it no longer is, nor missing where it is."""
        if self._claims.get(claim.id) is not claim:
            return
        at = claim.attachment
        now = _Filing(at.netns_inode, at.nsid, at.host) if at is not None else _HELD
        old = self._filed.get(claim.id)
        if old == now:
            return
        if old is not None:
            self._unfile(claim, old)
        self._filed[claim.id] = now
        self._by_netns.setdefault(now.inode, {})[claim.id] = claim
        self._by_nsid.setdefault(now.nsid, {})[claim.id] = claim
        if now.host is not None:
            self._by_host_ifindex.setdefault(now.host.ifindex, {})[claim.id] = claim
            self._by_host_name.setdefault(now.host.name, {})[claim.id] = claim
            self._hosted.setdefault(claim.device, {})[claim.id] = claim

    def _unfile(self, claim: Claim, filed: _Filing) -> None:
        _unindex(self._by_netns, filed.inode, claim.id)
        _unindex(self._by_nsid, filed.nsid, claim.id)
        if filed.host is not None:
            _unindex(self._by_host_ifindex, filed.host.ifindex, claim.id)
            _unindex(self._by_host_name, filed.host.name, claim.id)
            _unindex(self._hosted, claim.device, claim.id)

    def in_netns(self, inode: int) -> list[Claim]:
        """The claims on record in the netns of this inode: O(claims in that netns)."""
        return list(self._by_netns.get(inode, {}).values())

    def in_netns_of(self, claim: Claim) -> list[Claim]:
        """The claims on record in `claim`'s netns, it included while on record: O(claims in
        that netns)."""
        return self.in_netns(claim.netns_inode)

    def in_nsid(self, nsid: int) -> list[Claim]:
        """The claims on record in the netns init_net knows as `nsid`, as last filed (see
        refile): O(claims in that netns). A kernel event names a netns by its nsid."""
        return list(self._by_nsid.get(nsid, {}).values())

    def on_host_netdev(self, ifindex: int, name: str) -> list[Claim]:
        """The claims that took the init_net netdev of this ifindex or name (their host), as
        last filed: O(claims on that netdev)."""
        found = self._by_host_ifindex.get(ifindex, {}) | self._by_host_name.get(name, {})
        return list(found.values())

    def took_netdev(self, device: str) -> bool:
        """Whether a claim of `device` took its netdev from init_net (has a host): its
        netdev is away on purpose."""
        return device in self._hosted

    def restore_later(self, host: HostConfig) -> None:
        """`host`'s netdev has not come home yet: restore it when it does."""
        self._restores.append(host)

    def restored(self, host: HostConfig) -> None:
        self._restores.remove(host)

    def of(self, device: str) -> list[Claim]:
        return list(self._by_device.get(device, {}).values())

    def held_for(self, pod_uid: str) -> list[Claim]:
        """The claims held for a pod (Hold), attached or not."""
        return list(self._by_pod_uid.get(pod_uid, {}).values())

    def lock(self, device: str) -> asyncio.Lock:
        """Held by a claim or release for the length of its operation on `device`."""
        return self._locks.setdefault(device, asyncio.Lock())

    def busy(self, device: str) -> bool:
        """Whether a claim or release is operating on `device` right now."""
        lock = self._locks.get(device)
        return lock is not None and lock.locked()

    def moved_devices(self) -> set[str]:
        """The RDMA devices a claim moved into its netns (exclusive mode hides them)."""
        return {c.device for c in self._claims.values() if c.attachment and c.attachment.rdma_moved}

    def restore_waits_for(self, ifindex: int) -> bool:
        """Whether a netdev that did not come home in time is still to be restored."""
        return any(h.ifindex == ifindex for h in self._restores)


def _unindex(index: dict[K, dict[str, Claim]], key: K, claim_id: str) -> None:
    group = index[key]
    del group[claim_id]
    if not group:
        del index[key]
