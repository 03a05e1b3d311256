"""The claims on record, as the state machine (rdmad.core.Core) keeps them and the tracker
(rdmad.tracking.InventoryTracker) reads them to tell how each device looks."""

from __future__ import annotations

import asyncio

from rdmad.model import Claim, HostConfig


class ClaimBook:
    """Written by the core only. Plain records and queries: nothing here touches the kernel."""

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}
        # Netdevs whose netns died before the kernel handed them back: restore on return.
        self.pending_restores: list[HostConfig] = []
        self._locks: dict[str, asyncio.Lock] = {}

    def of(self, device: str) -> list[Claim]:
        return [c for c in self.claims.values() if c.device == device]

    def lock(self, device: str) -> asyncio.Lock:
        """Held by a claim or release for the length of its operation on `device`."""
        return self._locks.setdefault(device, asyncio.Lock())

    def busy(self, device: str) -> bool:
        """Whether a claim or release is operating on `device` right now."""
        lock = self._locks.get(device)
        return lock is not None and lock.locked()

    def moved_devices(self) -> set[str]:
        """The RDMA devices a claim moved into its netns (exclusive mode hides them)."""
        return {c.device for c in self.claims.values() if c.rdma_moved}

    def restore_waits_for(self, ifindex: int) -> bool:
        """Whether a netdev that did not come home in time is still to be restored."""
        return any(h.ifindex == ifindex for h in self.pending_restores)
