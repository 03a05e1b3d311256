"""The simulated backend's rdma_dev_exit_net, against real network namespaces: a device whose
netns died is home at the next look-up, and a netns found by the dead one's inode is not the
device's (its cookie differs)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from rdmad.backend import NetnsTarget
from rdmad.kernel.netns import KernelNetnsResolver, NetnsHandle
from rdmad.kernel.nlsocket import NlChannel
from rdmad.model import NetnsMode
from rdmad.sim import SimRdma
from tests.support.net import VethPair, ip, netns_inode, temp_netns

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

    def hand_on(self, inode: int, netns: str) -> None:
        """The kernel has given `inode`, a dead netns's, to the named `netns`."""
        self._handed_on[inode] = f"/run/netns/{netns}"

    def open(self, spec: str) -> NetnsHandle:
        return self._kernel.open(spec)

    def adopt_fd(self, fd: int) -> NetnsHandle:
        return self._kernel.adopt_fd(fd)

    def reopen(self, inode: int, path_hint: str) -> NetnsHandle | None:
        path = self._handed_on.get(inode)
        if path is None:
            return self._kernel.reopen(inode, path_hint)
        # the newer netns, under the inode the kernel would have given it
        return NetnsHandle(os.open(path, os.O_RDONLY | os.O_CLOEXEC), inode, path)

    async def cookie(self, target: NetnsTarget) -> int:
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
