"""An event source that overran (Resync) is one journal event, MESSAGE_RESYNC, and a resync."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import cast

import pytest

from rdmad.backend import NetdevBackend, RdmaBackend
from rdmad.events import Resync
from rdmad.inventory import Inventory
from rdmad.logfields import MESSAGE_RESYNC
from rdmad.model import Claim, Netdev, NetnsMode, RdmaDevice, ReleaseReason
from rdmad.tracking import ClaimKeeper, InventoryTracker


class EmptyKernel:
    """init_net with no netdevs, no RDMA devices and no other netns: what a resync reads."""

    async def list_netdevs(self) -> list[Netdev]:
        return []

    async def get_netdev(self, ifindex: int) -> Netdev | None:
        return None

    async def live_nsids(self) -> set[int]:
        return set()

    async def list_devices(self) -> list[RdmaDevice]:
        return []


class NoClaims:
    netns_mode = NetnsMode.SHARED

    def __init__(self) -> None:
        self.restores_retried = asyncio.Event()

    def iter_claims(self) -> Iterable[Claim]:
        return []

    def busy(self, device: str) -> bool:
        return False

    def moved_devices(self) -> set[str]:
        return set()

    async def retry_restores(self) -> None:
        self.restores_retried.set()

    async def end_claim(self, claim: Claim, reason: ReleaseReason) -> None:
        raise AssertionError("no claim to end")


async def test_an_overrun_is_logged_as_a_resync_event_and_the_kernel_is_read_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kernel, keeper = EmptyKernel(), NoClaims()
    tracker = InventoryTracker(
        Inventory(),
        cast(NetdevBackend, kernel),
        cast(RdmaBackend, kernel),
        cast(ClaimKeeper, keeper),
    )
    tracker.start()
    try:
        with caplog.at_level(logging.WARNING, logger="rdmad"):
            tracker.handle(Resync("rtnl"))
            await asyncio.wait_for(keeper.restores_retried.wait(), 5)
    finally:
        await tracker.close()
    (record,) = [r for r in caplog.records if getattr(r, "MESSAGE_ID", None) == MESSAGE_RESYNC]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "rtnl events were lost (socket overrun): resynchronising"
