"""A claim's GIDs (the entries its user picks from) and how they follow address changes:
the real Core on the in-memory kernel, whose GID table has one RoCE v2 entry per IPv4
address of a netdev."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import pytest

from rdmad.core.events import AddressChanged
from rdmad.core.logfields import MESSAGE_JOB_FAILED
from rdmad.model import ClaimOptions, Gid, NetnsMode, gid_of
from tests.support.core_rig import FlakyStore, Rig, Rigs, two_nics
from tests.support.fake_kernel import FakeKernel

SHARED = ClaimOptions(
    shared=True, ifname="net1", addresses=(ipaddress.ip_interface("198.51.100.5/24"),)
)
RDMA_ONLY = ClaimOptions(netdev=False)  # exclusive mode: the device moves, eth0 stays home


def v4_gid(address: str) -> str:
    return gid_of(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("address", "gid"),
    [
        ("192.0.2.10", "0000:0000:0000:0000:0000:ffff:c000:020a"),  # IPv4: v4-mapped
        ("fe80::5054:ff:fe12:3456", "fe80:0000:0000:0000:5054:00ff:fe12:3456"),  # its own
    ],
    ids=["ipv4", "ipv6"],
)
def test_an_address_maps_to_the_gid_sysfs_shows(address: str, gid: str) -> None:
    assert gid_of(ipaddress.ip_address(address)) == gid


async def changed_once_more(rig: Rig, before: int) -> None:
    await rig.seen.wait_for(lambda: len(rig.seen.changed) > before)


async def test_a_shared_claims_gids_are_its_childs_entries(rig: Rig) -> None:
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    assert claim.gids == (Gid(1, 1, v4_gid("198.51.100.5"), "RoCE v2", "net1"),)


async def test_an_address_added_on_a_shared_claims_child_joins_its_gids(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    kernel.set_addresses("net1", ("198.51.100.5/24", "203.0.113.7/24"), netns="pod")
    await changed_once_more(rig, 0)
    assert [g.gid for g in claim.gids] == [v4_gid("198.51.100.5"), v4_gid("203.0.113.7")]
    assert rig.seen.changed == [claim.id]


async def test_an_address_on_another_netdev_in_the_netns_leaves_a_shared_claim_alone(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    kernel.move_link("eth1", "pod")
    reads = kernel.calls["gids"]
    kernel.set_addresses("eth1", ("203.0.113.9/24",), netns="pod")
    await rig.quiesce()
    assert kernel.calls["gids"] == reads, "the GID table was read again"
    assert [g.gid for g in claim.gids] == [v4_gid("198.51.100.5")]


WHOLE = ClaimOptions(shared=False)


async def test_an_address_on_one_rail_of_a_pod_reads_that_rails_gids_only(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    for device in ("mlx5_0", "mlx5_1"):
        await rig.core.claim(device, rig.process.resolver.open("pod"), WHOLE)
    await rig.quiesce()
    reads = kernel.calls["gids"]
    kernel.set_addresses("eth1", ("192.0.2.2/24", "203.0.113.9/24"), netns="pod")
    await rig.quiesce()
    assert kernel.calls["gids"] == reads + 1


def pods_of_rails(pods: int, rails: int) -> FakeKernel:
    """A node of `pods` netns pod0, pod1, ..., each to take `rails` whole-device and `rails`
    shared claims, and a NIC with an RDMA device for each of those claims."""
    kernel = FakeKernel(NetnsMode.SHARED)
    for n in range(pods * rails * 2):
        kernel.add_nic(f"eth{n}", addresses=(f"192.0.{n // 250}.{n % 250 + 1}/16",))
        kernel.add_rdma(f"mlx5_{n}", f"eth{n}")
    for p in range(pods):
        kernel.add_netns(f"pod{p}")
    return kernel


@pytest.mark.parametrize("kind", ["whole", "shared"])
async def test_an_address_on_one_claims_interface_reads_its_gids_and_no_others_of_many(
    rigs: Rigs, kind: str
) -> None:
    pods, rails = 4, 3
    kernel = pods_of_rails(pods, rails)
    rig = await rigs.start(kernel)
    devices = iter(range(pods * rails * 2))
    for p in range(pods):
        for r in range(rails):
            whole = ClaimOptions(ifname=f"rail{r}")
            shared = ClaimOptions(shared=True, ifname=f"share{r}")
            for options in (whole, shared):
                pod = rig.process.resolver.open(f"pod{p}")
                await rig.core.claim(f"mlx5_{next(devices)}", pod, options)
    await rig.quiesce()
    ifname, inode = ("rail1" if kind == "whole" else "share1"), kernel.netns("pod2").inode
    [mine] = [c for c in rig.core.claims() if c.ifname == ifname and c.netns_inode == inode]
    reads, changed = kernel.calls["gids"], len(rig.seen.changed)
    kernel.set_addresses(ifname, ("203.0.113.9/24",), netns="pod2")
    await rig.quiesce()
    assert kernel.calls["gids"] == reads + 1
    assert rig.seen.changed[changed:] == [mine.id]
    assert [g.gid for g in mine.gids] == [v4_gid("203.0.113.9")]


async def test_a_held_claim_attached_to_a_pod_follows_its_interfaces_addresses(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.hold("mlx5_0", "pod-uid", ClaimOptions(shared=True))
    [claim] = await rig.core.attach("pod-uid", rig.process.resolver.open("pod"), "", SHARED)
    kernel.set_addresses("net1", ("198.51.100.5/24", "203.0.113.7/24"), netns="pod")
    await changed_once_more(rig, len(rig.seen.changed))
    assert [g.gid for g in claim.gids] == [v4_gid("198.51.100.5"), v4_gid("203.0.113.7")]


async def test_an_address_on_no_claims_interface_reads_the_whole_device_claims_gids(
    rigs: Rigs, tmp_path: Path
) -> None:
    # It may be on an upper device (a VLAN) of the claim's netdev, whose table holds it.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.move_link("eth1", "pod")
    await rig.quiesce()
    reads = kernel.calls["gids"]
    kernel.set_addresses("eth1", ("203.0.113.9/24",), netns="pod")
    await rig.quiesce()
    assert kernel.calls["gids"] == reads + 1


async def test_a_device_moved_without_its_netdev_follows_that_netdevs_addresses_at_home(
    rigs: Rigs,
) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), RDMA_ONLY)
    assert [(g.gid, g.netdev) for g in claim.gids] == [(v4_gid("192.0.2.1"), "eth0")]
    kernel.set_addresses("eth0", ("192.0.2.1/24", "192.0.2.99/24"))
    await changed_once_more(rig, 0)
    assert [g.gid for g in claim.gids] == [v4_gid("192.0.2.1"), v4_gid("192.0.2.99")]


async def test_an_address_on_another_netdev_at_home_leaves_a_moved_device_alone(rigs: Rigs) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), RDMA_ONLY)
    reads = kernel.calls["gids"]
    kernel.set_addresses("eth1", ("192.0.2.77/24",))
    await rig.quiesce()
    assert kernel.calls["gids"] == reads, "the GID table was read again"


async def test_the_event_of_an_address_the_claims_gids_already_show_reads_nothing_again(
    rigs: Rigs, tmp_path: Path
) -> None:
    # The claim's own address is announced after the claim read its entry.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    child = kernel.link("net1", "pod")
    assert child is not None
    reads = kernel.calls["gids"]
    own = ipaddress.ip_address("198.51.100.5")
    kernel.emit(AddressChanged(kernel.netns("pod").nsid, child.ifindex, own, removed=False))
    await rig.quiesce()
    assert kernel.calls["gids"] == reads, "the GID table was read again"


async def test_an_address_removed_from_a_shared_claims_child_leaves_its_gids(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    kernel.set_addresses("net1", ("198.51.100.5/24", "203.0.113.7/24"), netns="pod")
    await changed_once_more(rig, 0)
    kernel.set_addresses("net1", ("203.0.113.7/24",), netns="pod")
    await changed_once_more(rig, 1)
    assert [g.gid for g in claim.gids] == [v4_gid("203.0.113.7")]


async def test_a_gid_re_read_that_fails_is_logged_with_its_claim(
    rigs: Rigs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = two_nics()
    store = FlakyStore(tmp_path)
    rig = await rigs.start(kernel, store)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    store.full = True  # the new GIDs cannot be saved
    with caplog.at_level(logging.ERROR, logger="rdmad"):
        kernel.set_addresses("net1", ("198.51.100.5/24", "203.0.113.7/24"), netns="pod")
        await rig.quiesce()
    [record] = [r for r in caplog.records if getattr(r, "MESSAGE_ID", "") == MESSAGE_JOB_FAILED]
    assert record.getMessage().startswith(f"re-reading the GIDs of claim {claim.id} failed: ")
    assert "ENOSPC" in record.getMessage()
    fields = (record.__dict__["RDMAD_CLAIM"], record.__dict__["RDMAD_DEVICE"])
    assert fields == (claim.id, "mlx5_0")
