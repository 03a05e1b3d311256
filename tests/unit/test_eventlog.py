"""rdmad.daemon.eventlog.EventLog: what the core tells observers, as journal events."""

from __future__ import annotations

import logging

import pytest

from rdmad.core import logfields
from rdmad.daemon.eventlog import EventLog
from rdmad.model import NetnsMode, ReleaseReason
from tests.unit.test_cdi_writer import claim

CLAIM = claim("c1")


def test_each_release_reason_is_its_own_kind_of_event_apart_from_device_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="rdmad"):
        for reason in ReleaseReason:
            EventLog().released(CLAIM, reason)
    ids = [r.__dict__["MESSAGE_ID"] for r in caplog.records]
    assert len(set(ids)) == len(ReleaseReason)
    assert not set(ids) & {logfields.MESSAGE_DEVICE_ADDED, logfields.MESSAGE_DEVICE_REMOVED}


def test_a_claims_event_carries_its_device_netns_and_id_and_names_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="rdmad"):
        EventLog().claimed(CLAIM)
    [record] = caplog.records
    fields = {k: record.__dict__[k] for k in ("RDMAD_DEVICE", "RDMAD_NETNS", "RDMAD_CLAIM")}
    assert fields == {
        "RDMAD_DEVICE": "mlx5_0",
        "RDMAD_NETNS": CLAIM.netns,
        "RDMAD_CLAIM": "c1",
    }
    # CODE_FILE in the journal: the module that logged, not the logfields helpers
    assert record.pathname.endswith("rdmad/daemon/eventlog.py")


def test_an_event_names_the_module_that_logged_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rdmad"):
        EventLog().mode_changed(NetnsMode.SHARED)
    [record] = caplog.records
    assert record.pathname.endswith("rdmad/daemon/eventlog.py")
