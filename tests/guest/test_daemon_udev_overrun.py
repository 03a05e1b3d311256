"""uevent overrun: the daemon's uevent socket loses events (ENOBUFS) and it notices.

The module's daemon runs with a tiny uevent receive buffer (UDEV_RCVBUF,
testbed/faulty_rdmad.py) and the
default rtnetlink one. While it is stopped (SIGSTOP), rxe devices are added on fresh veths and
half of them removed again, far more uevents than the buffer holds, so the kernel drops some
and flags the socket. After SIGCONT the daemon must log the *udev* resync (the proof the loss
was detected: on 7.3 the RDMA netlink monitor may overrun too) and end with ListDevices equal
to `rdma dev`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile

import pytest

from testbed.daemon import Client, RdmadProcess
from testbed.faulty_rdmad import RCVBUF, UDEV_RCVBUF
from testbed.net import eventually, ip, unique_name
from tests.support.rdma import WAIT, listed, rdma_dev_names, sh

pytestmark = [
    pytest.mark.guest,
    pytest.mark.usefixtures("in_guest", "daemon_log_on_failure"),
]

RCVBUF_BYTES = 4096  # bytes asked; the kernel doubles it: a few uevents at most
DEVICES = 20  # rxe devices (each on its own veth) added while the daemon is stopped
UDEV_RESYNC = "udev events were lost (socket overrun): resynchronising"


@pytest.fixture(scope="module")
def daemon_env() -> dict[str, str]:
    """This module's daemon: tiny uevent buffer, rtnetlink buffer left at its default."""
    return {UDEV_RCVBUF: str(RCVBUF_BYTES), RCVBUF: ""}


def batch(tool: str, lines: list[str]) -> None:
    """`ip -b` / `rdma -b` (batch): one process for many commands, so the events come fast."""
    with tempfile.NamedTemporaryFile("w", suffix=".batch") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        sh(tool, "-b", f.name)


async def inventory_matches(client: Client) -> bool:
    return set(await listed(client)) == rdma_dev_names()


async def test_uevent_overrun_is_detected_and_resynchronised_to_the_kernels_inventory(
    rdmad: RdmadProcess, client: Client
) -> None:
    assert UDEV_RESYNC not in rdmad.log()
    veths = [unique_name("uov", room=1) for _ in range(DEVICES)]
    rxes = [unique_name("uor") for _ in range(DEVICES)]
    assert rdmad.proc is not None
    pid = rdmad.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        batch("ip", [f"link add {v} type veth peer name {v}p" for v in veths])
        batch(
            "rdma", [f"link add {r} type rxe netdev {v}" for r, v in zip(rxes, veths, strict=True)]
        )
        batch("rdma", [f"link del {r}" for r in rxes[::2]])
        os.kill(pid, signal.SIGCONT)
        await eventually(lambda: UDEV_RESYNC in rdmad.log(), WAIT)
        async with asyncio.timeout(WAIT):
            # The resync re-reads after the log line and may announce nothing (an overrun can
            # hide an add and its del alike): poll, bounded.
            while not await inventory_matches(client):  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        names = set(await listed(client))
        assert set(rxes[1::2]) <= names and not set(rxes[::2]) & names
        log = rdmad.log()
        print(
            f"uevent overrun: {DEVICES} rxe added on {DEVICES} veths, {DEVICES // 2} deleted "
            f"while stopped, udev rcvbuf {RCVBUF_BYTES}: {log.count(UDEV_RESYNC)} udev resync(s), "
            f"{log.count('rdma-monitor events were lost')} rdma-monitor resync(s); "
            f"ListDevices == rdma dev ({len(names)} devices)"
        )
    finally:
        os.kill(pid, signal.SIGCONT)
        for r in rxes:
            sh("rdma", "link", "del", r, check=False)
        for v in veths:
            ip("link", "del", v, check=False)
