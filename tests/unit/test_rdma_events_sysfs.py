"""The udev event source with a stand-in monitor, and sysfs facts from a fake /sys tree."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from rdmad.core.events import Event, RdmaChanged, Resync
from rdmad.kernel import udev
from rdmad.kernel.rdma_sysfs import SysfsFacts, sysfs_facts
from rdmad.kernel.udev import RDMA_SUBSYSTEMS, UdevEvents


@dataclass
class FakeDevice:
    action: str
    subsystem: str
    sys_name: str


class FakeMonitor:
    """A pyudev.Monitor look-alike: readable through a socketpair, fed from the test."""

    def __init__(self) -> None:
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        self.filters: list[str] = []
        self.started = False
        self.queue: list[FakeDevice | OSError] = []

    def filter_by(self, subsystem: str) -> None:
        self.filters.append(subsystem)

    def start(self) -> None:
        self.started = True

    def fileno(self) -> int:
        return self.r.fileno()

    def push(self, item: FakeDevice | OSError) -> None:
        self.queue.append(item)
        self.w.send(b"x")

    def poll(self, timeout: float) -> FakeDevice | None:
        try:
            self.r.recv(1)
        except BlockingIOError:
            return None
        item = self.queue.pop(0)
        if isinstance(item, OSError):
            raise item
        return item


@pytest.fixture
def monitor(monkeypatch: pytest.MonkeyPatch) -> FakeMonitor:
    """The monitor the udev source gets."""
    fake = FakeMonitor()
    monkeypatch.setattr(udev, "new_monitor", lambda: fake)
    return fake


async def started() -> tuple[UdevEvents, asyncio.Queue[Event]]:
    queue: asyncio.Queue[Event] = asyncio.Queue()
    source = UdevEvents()
    await source.start(queue.put_nowait)
    return source, queue


async def test_udev_source_subscribes_to_the_rdma_subsystems_before_returning(
    monitor: FakeMonitor,
) -> None:
    source, _ = await started()
    assert monitor.started and monitor.filters == list(RDMA_SUBSYSTEMS)
    await source.stop()


async def test_a_device_uevent_becomes_rdma_changed_naming_the_device(
    monitor: FakeMonitor,
) -> None:
    source, queue = await started()
    monitor.push(FakeDevice("add", "infiniband", "rxe0"))
    expected = RdmaChanged("add infiniband/rxe0", device="rxe0")
    assert await asyncio.wait_for(queue.get(), 5) == expected
    await source.stop()


async def test_a_char_device_uevent_names_the_node(monitor: FakeMonitor) -> None:
    source, queue = await started()
    monitor.push(FakeDevice("remove", "infiniband_verbs", "uverbs3"))
    expected = RdmaChanged("remove infiniband_verbs/uverbs3", chardev="uverbs3")
    assert await asyncio.wait_for(queue.get(), 5) == expected
    await source.stop()


async def test_udev_overrun_becomes_resync(monitor: FakeMonitor) -> None:
    source, queue = await started()
    monitor.push(OSError(errno.ENOBUFS, "No buffer space available"))
    assert await asyncio.wait_for(queue.get(), 5) == Resync("udev")
    await source.stop()


async def test_udev_pollerr_with_enobufs_pending_becomes_resync(
    monitor: FakeMonitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyudev's poll() reports POLLERR as an OSError without errno; the pending socket error
    (read with SO_ERROR) says it was an overrun."""
    source, queue = await started()
    monkeypatch.setattr(source, "_socket_error", lambda: errno.ENOBUFS)
    monitor.push(OSError("Error while polling fd: 7"))
    assert await asyncio.wait_for(queue.get(), 5) == Resync("udev")
    await source.stop()


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def test_software_device_without_parent_is_virtual(sysfs: Path) -> None:
    port = sysfs / "class/infiniband/rxe0/ports/1"
    port.mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    assert sysfs_facts("rxe0") == SysfsFacts(virtual=True, link_layer="Ethernet")


def test_sriov_vf_reports_pci_numa_driver_and_its_pf(sysfs: Path) -> None:
    pf = sysfs / "devices/pci0000:00/0000:3b:00.0"
    vf = sysfs / "devices/pci0000:00/0000:3b:00.2"
    (pf / "infiniband/mlx5_0").mkdir(parents=True)
    vf.mkdir(parents=True)
    (vf / "numa_node").write_text("1\n")
    _link(vf / "subsystem", sysfs / "bus/pci")
    _link(vf / "driver", sysfs / "bus/pci/drivers/mlx5_core")
    _link(vf / "physfn", pf)
    _link(sysfs / "class/infiniband/mlx5_2/device", vf)
    facts = sysfs_facts("mlx5_2")
    assert facts == SysfsFacts(
        driver="mlx5_core", pci_address="0000:3b:00.2", numa_node=1, parent="mlx5_0"
    )
