"""rdmad.eventlog.EventLog: what the core tells observers, as journal events."""

from __future__ import annotations

import logging

import pytest

from rdmad import logfields
from rdmad.eventlog import EventLog
from rdmad.model import Claim, ReleaseReason

CLAIM = Claim(
    id="c1",
    device="mlx5_0",
    netns_inode=4026532000,
    netns_path="/run/netns/pod1",
    nsid=3,
    ifname="net0",
    shared=False,
    owner="pod1",
    created_at_us=1,
)


def test_each_release_reason_is_its_own_kind_of_event_apart_from_device_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="rdmad"):
        for reason in ReleaseReason:
            EventLog().released(CLAIM, reason)
    ids = [r.__dict__["MESSAGE_ID"] for r in caplog.records]
    assert len(set(ids)) == len(ReleaseReason)
    assert not set(ids) & {logfields.MESSAGE_DEVICE_ADDED, logfields.MESSAGE_DEVICE_REMOVED}
