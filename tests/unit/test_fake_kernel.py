"""The in-memory kernel the core tests run on keeps the kernel's rules (each also measured
on a real kernel: tests/host, tests/e2e, tests/guest). If it did not, the core tests could
pass against a kernel that does not exist."""

from __future__ import annotations

import ipaddress

import pytest

from rdmad.core.events import LinkChanged, LinkRemoved, NetnsGone
from rdmad.errors import InvalidArgs, InvalidNetns, ModeBusy, NotSupported
from rdmad.model import ChardevKind, NetnsMode
from tests.support.core_rig import two_nics
from tests.support.fake_kernel import INIT

UVERBS = (ChardevKind.UVERBS,)


def test_a_netns_lives_while_an_fd_holds_it_after_its_name_is_gone() -> None:
    kernel = two_nics()
    handle = kernel.process().resolver.open("pod")
    kernel.delete_netns("pod")
    assert kernel.netns("pod").alive
    handle.close()
    assert kernel.live_netns() == []


def test_a_deleted_netns_cannot_be_opened_by_name() -> None:
    kernel = two_nics()
    kernel.delete_netns("pod")
    with pytest.raises(InvalidNetns):
        kernel.process().resolver.open("pod")


async def test_a_netdev_moved_into_a_netns_leaves_init_net_and_gets_its_netns_an_nsid() -> None:
    kernel = two_nics()
    events: list[object] = []
    kernel.attach(events.append)
    process = kernel.process()
    eth0 = kernel.link("eth0")
    assert eth0 is not None
    placed = await process.net.place(eth0.ifindex, process.resolver.open("pod"), "net0", None, ())
    assert events == [LinkRemoved(eth0.ifindex, "eth0")]
    assert placed.nsid == kernel.netns("pod").nsid == 0
    assert await process.net.get_netdev(eth0.ifindex) is None


@pytest.mark.parametrize("shared", [False, True], ids=["moved", "macvlan"])
async def test_a_placed_netdev_shows_ipv4_first_each_family_by_address_no_link_local(
    shared: bool,
) -> None:
    kernel = two_nics()
    process = kernel.process()
    eth0, pod = kernel.link("eth0"), process.resolver.open("pod")
    assert eth0 is not None
    given = ("2001:db8::2/64", "10.0.0.9/24", "fe80::5/64", "2001:db8::1/64", "10.0.0.2/24")
    cidrs = tuple(map(ipaddress.ip_interface, given))
    put = process.net.add_macvlan if shared else process.net.place
    placement = await put(eth0.ifindex, pod, "net0", None, cidrs)
    shown = ("10.0.0.2/24", "10.0.0.9/24", "2001:db8::1/64", "2001:db8::2/64")
    assert placement.netdev is not None and placement.netdev.addresses == shown
    assert await process.net.read_placed(placement) == placement.netdev


def test_nsids_are_reused_lowest_first() -> None:
    kernel = two_nics()
    first = kernel.add_netns("a")
    assert kernel.assign_nsid(first) == 0
    kernel.delete_netns("a")
    assert kernel.assign_nsid(kernel.netns("pod")) == 0


def test_netns_death_drops_the_nsid_then_returns_physical_netdevs_down_and_bare() -> None:
    kernel = two_nics()
    kernel.move_link("eth0", "pod")
    kernel.add_nic("veth0", kind="veth")
    kernel.move_link("veth0", "pod")
    events: list[object] = []
    kernel.attach(events.append)
    kernel.delete_netns("pod")
    eth0 = kernel.link("eth0")
    assert eth0 is not None and (eth0.up, eth0.addresses) == (False, ())
    assert events[:2] == [NetnsGone(0), LinkChanged(eth0.as_netdev())]
    assert kernel.link("veth0") is None and all(x.name != "veth0" for x in kernel.links.values())


def test_a_returning_netdev_whose_name_is_taken_becomes_dev_ifindex() -> None:
    kernel = two_nics()
    kernel.move_link("eth0", "pod")
    kernel.add_nic("eth0")
    moved = kernel.link("eth0", "pod")
    assert moved is not None
    kernel.delete_netns("pod")
    assert kernel.link(f"dev{moved.ifindex}") is not None


async def test_the_mode_changes_only_while_no_other_netns_exists() -> None:
    kernel = two_nics()
    rdma = kernel.process().rdma
    with pytest.raises(ModeBusy):
        await rdma.set_netns_mode(NetnsMode.EXCLUSIVE)
    kernel.delete_netns("pod")
    await rdma.set_netns_mode(NetnsMode.EXCLUSIVE)
    assert await rdma.netns_mode() == NetnsMode.EXCLUSIVE


async def test_rdma_devices_move_only_in_exclusive_mode() -> None:
    kernel = two_nics()
    process = kernel.process()
    with pytest.raises(NotSupported):
        await process.rdma.move(1, process.resolver.open("pod"))


async def test_in_exclusive_mode_a_moved_device_is_hidden_and_its_char_devices_renewed() -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    process = kernel.process()
    dev = (await process.rdma.list_devices())[0]
    before = await process.rdma.chardevs(dev, UVERBS, None)
    pod = process.resolver.open("pod")
    await process.rdma.move(dev.index, pod)
    assert dev.name not in {d.name for d in await process.rdma.list_devices()}
    assert await process.rdma.get_device(dev.index) is None
    after = await process.rdma.chardevs(dev, UVERBS, pod)
    assert before[0].minor != after[0].minor
    pod.close()
    kernel.delete_netns("pod")  # rdma_dev_exit_net
    assert kernel.rdma_netns(dev.name) == INIT


async def test_a_device_shows_its_netdev_only_while_that_netdev_is_in_init_net() -> None:
    kernel = two_nics()
    rdma = kernel.process().rdma
    kernel.move_link("eth0", "pod")
    dev = await rdma.get_device(1)
    assert dev is not None and (dev.netdev, dev.netdev_ifindex) == ("", 0)


def test_a_software_rdma_device_dies_when_its_netdev_changes_netns() -> None:
    kernel = two_nics()
    kernel.add_nic("veth0", kind="veth")
    kernel.add_rdma("rxe0", "veth0", virtual=True)
    kernel.move_link("veth0", "pod")
    assert "rxe0" not in kernel.rdma


async def test_a_name_taken_in_the_target_fails_the_move_and_leaves_the_netdev_home() -> None:
    kernel = two_nics()
    kernel.move_link("eth1", "pod")
    process = kernel.process()
    eth0 = kernel.link("eth0")
    assert eth0 is not None
    with pytest.raises(InvalidArgs):
        await process.net.place(eth0.ifindex, process.resolver.open("pod"), "eth1", None, ())
    assert kernel.link("eth0") is eth0
