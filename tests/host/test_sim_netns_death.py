"""The simulated backend's rdma_dev_exit_net, against real network namespaces: a device whose
netns died is home at the next look-up, and a netns found by the dead one's inode is not the
device's (its cookie differs)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from rdmad.core.backend import NetnsTarget
from rdmad.kernel.netns import KernelNetnsResolver, NetnsHandle
from rdmad.kernel.nlsocket import NlChannel
from rdmad.kernel.sim import SimRdma
from rdmad.model import ChardevKind, NetnsMode
from testbed.net import VethPair, ip, netns_inode, temp_netns

pytestmark = pytest.mark.usefixtures("root")  # each test makes links or netns

DEVICE, INDEX = "sim0", 1


class KernelHandingOnInodes:
    """The kernel's resolver, but the kernel's hand-over of a dead netns's inode to a newer
    netns happens when the test says so (`hand_on`), not when the kernel's cleanup gets round
    to it: that is seconds to minutes after the death on 6.18, and no event tells
    (docs/kernel-notes.md). From then on `reopen` by that inode finds the newer netns, as
    the kernel's resolver would; the rest, the newer netns's cookie included, is the kernel's.
    """

    def __init__(self, kernel: KernelNetnsResolver) -> None:
        self._kernel = kernel
        self._handed_on: dict[int, str] = {}
        self.cookie_read: asyncio.Event | None = None  # when set: each cookie read waits
        self.reading_cookie = asyncio.Event()

    def hand_on(self, inode: int, netns: str) -> None:
        """The kernel has given `inode`, a dead netns's, to the named `netns`."""
        self._handed_on[inode] = f"/run/netns/{netns}"

    def open(self, spec: str, owner: int | None = None) -> NetnsHandle:
        return self._kernel.open(spec, owner)

    def adopt_fd(self, fd: int, owner: int | None = None) -> NetnsHandle:
        return self._kernel.adopt_fd(fd, owner)

    def reopen(self, inode: int, path_hint: str) -> NetnsHandle | None:
        path = self._handed_on.get(inode)
        if path is None:
            return self._kernel.reopen(inode, path_hint)
        # the newer netns, under the inode the kernel would have given it
        return NetnsHandle(os.open(path, os.O_RDONLY | os.O_CLOEXEC), inode, path)

    async def cookie(self, target: NetnsTarget) -> int:
        """The kernel's, read once `cookie_read` is set if the test holds it: the test
        looks the device up while a move is reading its cookie."""
        if self.cookie_read is not None:
            self.reading_cookie.set()
            await self.cookie_read.wait()
        return await self._kernel.cookie(target)

    def other_netns_exist(self) -> bool:
        return self._kernel.other_netns_exist()


@pytest.fixture
def kernel(resolver: KernelNetnsResolver) -> KernelHandingOnInodes:
    return KernelHandingOnInodes(resolver)


@pytest.fixture
async def sim(
    kernel: KernelHandingOnInodes, channel: NlChannel, veth: VethPair
) -> AsyncIterator[SimRdma]:
    rdma = SimRdma([(DEVICE, veth.host)], kernel, channel, NetnsMode.EXCLUSIVE)
    try:
        yield rdma
    finally:
        await rdma.close()


async def claimed_by(sim: SimRdma, kernel: KernelHandingOnInodes, netns: str) -> None:
    with kernel.open(netns) as target:
        await sim.move(INDEX, target)


async def test_a_device_stays_in_its_netns_while_that_lives(
    sim: SimRdma, kernel: KernelHandingOnInodes, netns: str
) -> None:
    await claimed_by(sim, kernel, netns)
    assert await sim.get_device(INDEX) is None, "exclusive mode: init_net does not see it"
    assert await sim.list_devices() == []


async def test_a_device_whose_netns_died_is_home(
    sim: SimRdma, kernel: KernelHandingOnInodes, netns: str, veth: VethPair
) -> None:
    await claimed_by(sim, kernel, netns)
    ip("netns", "del", netns)
    home = await sim.get_device(INDEX)
    assert home is not None and (home.name, home.netdev) == (DEVICE, veth.host)


async def test_a_netns_given_the_dead_ones_inode_does_not_keep_its_device(
    sim: SimRdma, kernel: KernelHandingOnInodes, netns: str, veth: VethPair
) -> None:
    # The kernel gives a dead netns's inode to a netns made after it (a container's, on a
    # busy host); rdmad may look the device up only then. Only the cookie tells them apart.
    await claimed_by(sim, kernel, netns)
    inode = netns_inode(netns)
    ip("netns", "del", netns)
    with temp_netns() as newer:
        kernel.hand_on(inode, newer)
        assert [d.name for d in await sim.list_devices()] == [DEVICE]
        home = await sim.get_device(INDEX)
        assert home is not None and home.netdev == veth.host


async def test_a_look_up_while_the_device_moves_does_not_send_it_home(
    sim: SimRdma, kernel: KernelHandingOnInodes, netns: str
) -> None:
    # The soak found it: a resync listed the devices while a claim's move read the netns's
    # cookie, the device was taken for an orphan and sent home, and the claim failed.
    gate = kernel.cookie_read = asyncio.Event()
    with kernel.open(netns) as target:
        moving = asyncio.create_task(sim.move(INDEX, target))
        await kernel.reading_cookie.wait()
        kernel.cookie_read = None  # the look-up's own reads go straight to the kernel
        looked = await sim.get_device(INDEX)
        gate.set()
        await moving
        assert looked is not None, "until the move is done the device is home"
        assert await sim.get_device(INDEX) is None, "exclusive mode: init_net does not see it"
        (uverbs,) = await sim.chardevs(looked, (ChardevKind.UVERBS,), target)
        assert uverbs.path == "/dev/infiniband/uverbs0"
