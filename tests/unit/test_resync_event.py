"""An event source that overran (Resync) is one journal event, MESSAGE_RESYNC, and a resync."""

from __future__ import annotations

import logging

import pytest

from rdmad.core.events import Resync
from rdmad.core.logfields import MESSAGE_RESYNC
from rdmad.model import ClaimOptions, ReleaseReason
from tests.support.core_rig import Rigs, two_nics


async def test_an_overrun_is_logged_as_one_resync_event_before_the_inventory_resyncs(
    rigs: Rigs, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim(
        "mlx5_0", rig.process.resolver.open("pod"), ClaimOptions(ifname="net0")
    )
    with caplog.at_level(logging.WARNING, logger="rdmad"):
        with kernel.hold_events():  # never delivered: the socket overran
            kernel.delete_netns("pod")
        rig.core.handle(Resync("rtnl"))
        # the resync finds the lost netns death
        assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    (record,) = [r for r in caplog.records if getattr(r, "MESSAGE_ID", None) == MESSAGE_RESYNC]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "rtnl events were lost (socket overrun): resynchronising"
