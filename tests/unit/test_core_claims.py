"""Claims and releases, and the rules that refuse a claim: the real Core on the in-memory
kernel (tests/support/fake_kernel.py), no root, no bus."""

from __future__ import annotations

from ipaddress import ip_interface

import pytest

from rdmad.errors import DeviceBusy, NoSuchClaim, NoSuchDevice, NotSupported, Unavailable
from rdmad.model import ClaimOptions, DeviceState, NetnsMode, ReleaseReason
from tests.support.core_rig import Rig, Rigs, two_nics
from tests.support.fake_kernel import INIT

WHOLE = ClaimOptions(ifname="net0", mtu=9000, addresses=(ip_interface("10.0.0.5/24"),))
SHARED = ClaimOptions(shared=True)


# -- whole-device claims, shared mode --------------------------------------------------------


async def test_a_whole_claim_moves_the_netdev_into_the_netns_renamed_and_configured(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    moved = kernel.link("net0", "pod")
    assert moved is not None and (moved.mtu, moved.up, moved.addresses) == (
        9000,
        True,
        ("10.0.0.5/24",),
    )
    assert kernel.link("eth0") is None
    assert rig.state("mlx5_0") == DeviceState.CLAIMED
    assert claim.attached.nsid == kernel.netns("pod").nsid
    assert [c.id for c in rig.core.claims()] == [claim.id]


async def test_a_whole_claim_in_shared_mode_leaves_the_rdma_device_in_init_net(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert kernel.rdma_netns("mlx5_0") == INIT and not claim.attached.rdma_moved
    assert rig.core.device("mlx5_0").netns == "init"


async def test_a_claimed_device_is_still_shown_with_its_host_netdev_name(rig: Rig) -> None:
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.quiesce()
    assert rig.core.device("mlx5_0").device.netdev == "eth0"


async def test_a_claim_without_ifname_keeps_the_host_name_inside_the_netns(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), ClaimOptions())
    assert claim.ifname == "eth0" and kernel.link("eth0", "pod") is not None


async def test_release_brings_the_netdev_home_with_its_name_mtu_state_and_addresses(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    before = kernel.link("eth0")
    assert before is not None
    host = (before.ifindex, before.mtu, before.up, before.addresses)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.core.release(claim.id)
    after = kernel.link("eth0")
    assert after is not None and (after.ifindex, after.mtu, after.up, after.addresses) == host
    assert kernel.links_in("pod") == []
    assert rig.core.claims() == [] and rig.state("mlx5_0") == DeviceState.AVAILABLE
    assert rig.seen.ended == [(claim.id, ReleaseReason.REQUESTED)]


async def test_the_claim_closes_the_netns_it_was_given(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert kernel.netns("pod").refs == 0 and rig.process.handles == []


async def test_a_software_rdma_device_is_never_claimed_with_its_netdev(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_nic("veth0", kind="veth")
    kernel.add_rdma("rxe0", "veth0", virtual=True)
    rig = await rigs.start(kernel)
    with pytest.raises(NotSupported, match="software RDMA device"):
        await rig.core.claim("rxe0", rig.process.resolver.open("pod"), WHOLE)
    assert kernel.link("veth0") is not None and "rxe0" in kernel.rdma


async def test_an_unknown_device_is_no_such_device(rig: Rig) -> None:
    with pytest.raises(NoSuchDevice):
        await rig.core.claim("mlx5_9", rig.process.resolver.open("pod"), WHOLE)


async def test_releasing_an_unknown_claim_is_no_such_claim(rig: Rig) -> None:
    with pytest.raises(NoSuchClaim):
        await rig.core.release("0123456789abcdef")


async def test_a_claimed_device_refuses_a_second_whole_claim(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("other")
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with pytest.raises(DeviceBusy):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("other"), WHOLE)
    assert kernel.links_in("other") == []


async def test_claims_need_an_rdma_subsystem(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.mode = NetnsMode.UNAVAILABLE
    rig = await rigs.start(kernel)
    with pytest.raises(Unavailable):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert kernel.link("eth0") is not None


# -- whole-device claims, exclusive mode -----------------------------------------------------


async def test_an_exclusive_mode_claim_moves_the_rdma_device_with_its_netdev(rigs: Rigs) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert kernel.rdma_netns("mlx5_0") == kernel.netns("pod").inode
    assert kernel.link("net0", "pod") is not None
    await rig.quiesce()
    view = rig.core.device("mlx5_0")  # init_net no longer sees it: the claim keeps it listed
    assert view.state == DeviceState.CLAIMED and view.netns == claim.netns


async def test_an_exclusive_mode_claim_reads_the_char_devices_after_the_move(rigs: Rigs) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    uverbs = next(c for c in claim.chardevs if c.kind == "uverbs")
    assert uverbs.minor == 192 + kernel.rdma["mlx5_0"].minor


async def test_an_rdma_only_claim_leaves_the_netdev_home(rigs: Rigs) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim(
        "mlx5_0", rig.process.resolver.open("pod"), ClaimOptions(netdev=False)
    )
    assert kernel.link("eth0") is not None and kernel.links_in("pod") == []
    assert claim.attached.rdma_moved and claim.attached.host is None


async def test_an_rdma_only_claim_needs_exclusive_mode(rig: Rig) -> None:
    with pytest.raises(NotSupported, match="exclusive"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), ClaimOptions(netdev=False))


async def test_an_exclusive_mode_release_brings_the_rdma_device_and_netdev_home(rigs: Rigs) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.core.release(claim.id)
    assert kernel.rdma_netns("mlx5_0") == INIT and kernel.link("eth0") is not None
    view = rig.core.device("mlx5_0")
    assert view.state == DeviceState.AVAILABLE and view.netns == "init"


# -- shared claims ---------------------------------------------------------------------------


async def test_a_shared_claim_puts_a_macvlan_child_named_net1_into_the_netns(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    child = kernel.link("net1", "pod")
    eth0 = kernel.link("eth0")
    assert child is not None and eth0 is not None
    assert (child.kind, child.parent) == ("macvlan", eth0.ifindex)
    assert claim.attached.ns_ifindex == child.ifindex and rig.state("mlx5_0") == DeviceState.SHARED


async def test_several_netns_share_one_device(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("pod2")
    rig = await rigs.start(kernel)
    first = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    second = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod2"), SHARED)
    assert rig.core.device("mlx5_0").claims == (first.id, second.id)
    assert first.attached.nsid != second.attached.nsid


async def test_one_netns_shares_a_device_only_once(rig: Rig) -> None:
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    with pytest.raises(DeviceBusy, match="already shared"):
        await rig.core.claim(
            "mlx5_0", rig.process.resolver.open("pod"), ClaimOptions(shared=True, ifname="net2")
        )


async def test_shared_claims_stop_at_the_limit(rigs: Rigs) -> None:
    kernel = two_nics()
    for n in range(3):
        kernel.add_netns(f"p{n}")
    rig = await rigs.start(kernel, shared_limit=2)
    for n in range(2):
        await rig.core.claim("mlx5_0", rig.process.resolver.open(f"p{n}"), SHARED)
    with pytest.raises(DeviceBusy, match="limit"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("p2"), SHARED)
    assert kernel.links_in("p2") == []


async def test_a_shared_device_refuses_a_whole_claim(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("other")
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    with pytest.raises(DeviceBusy):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("other"), WHOLE)
    assert kernel.link("eth0") is not None


async def test_a_device_claimed_whole_refuses_a_shared_claim(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("other")
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with pytest.raises(DeviceBusy, match="claimed whole"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("other"), SHARED)
    assert kernel.links_in("other") == []


async def test_shared_claims_need_shared_mode(rigs: Rigs) -> None:
    rig = await rigs.start(two_nics(NetnsMode.EXCLUSIVE))
    with pytest.raises(NotSupported, match="shared mode"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)


async def test_releasing_a_shared_claim_deletes_its_child_and_leaves_the_others(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("pod2")
    rig = await rigs.start(kernel)
    first = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod2"), SHARED)
    await rig.core.release(first.id)
    assert kernel.links_in("pod") == [] and kernel.link("net1", "pod2") is not None
    assert rig.state("mlx5_0") == DeviceState.SHARED
