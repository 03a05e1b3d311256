"""The core's own journal events: one line each, with the device, netns and claim as
structured fields (rdmad.core.logfields). The real Core on the in-memory kernel."""

from __future__ import annotations

import errno
import logging

import pytest

from rdmad.core.logfields import EVENT_FIELDS, MESSAGE_CLAIM_FAILED, MESSAGE_NOT_RETURNED
from rdmad.errors import DeviceBusy, KernelError
from rdmad.model import ClaimOptions, ReleaseReason, netns_label
from tests.support.core_rig import Rigs, two_nics

WHOLE = ClaimOptions(ifname="net0")


def fields(record: logging.LogRecord) -> dict[str, object]:
    """The journal fields a record carries besides its MESSAGE_ID."""
    return {k: v for k, v in record.__dict__.items() if k in EVENT_FIELDS}


async def test_a_refused_claim_is_one_warning_naming_its_device_netns_and_error(
    rigs: Rigs, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = two_nics()
    other = netns_label(kernel.add_netns("other").inode)
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with caplog.at_level(logging.INFO, logger="rdmad"), pytest.raises(DeviceBusy):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("other"), WHOLE)
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (record.levelno, record.__dict__["MESSAGE_ID"]) == (
        logging.WARNING,
        MESSAGE_CLAIM_FAILED,
    )
    assert fields(record) == {
        "RDMAD_DEVICE": "mlx5_0",
        "RDMAD_NETNS": other,
        "RDMAD_ERROR": DeviceBusy.dbus_name,
    }


async def test_a_netns_death_whose_netdev_cannot_be_restored_is_an_error_naming_the_claim(
    rigs: Rigs, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = two_nics()
    pod = netns_label(kernel.netns("pod").inode)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.fail("restore", KernelError(errno.EIO, "restoring eth0"))
    with caplog.at_level(logging.INFO, logger="rdmad"):
        kernel.delete_netns("pod")
        assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (record.levelno, record.__dict__["MESSAGE_ID"]) == (
        logging.ERROR,
        MESSAGE_NOT_RETURNED,
    )
    assert fields(record) == {
        "RDMAD_DEVICE": "mlx5_0",
        "RDMAD_NETNS": pod,
        "RDMAD_CLAIM": claim.id,
        "RDMAD_ERROR": KernelError.dbus_name,
    }
