"""What the kernel does behind the daemon's back, and how claims and devices follow: netns
death, late and stale events, reused nsids, hot-unplug, lost events. The real Core on the
in-memory kernel."""

from __future__ import annotations

import asyncio
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.events import Resync
from rdmad.core.store import Store
from rdmad.model import ClaimOptions, ClaimPhase, DeviceState, NetnsMode, ReleaseReason
from tests.support.core_rig import Rigs, host_side, two_nics
from tests.support.fake_kernel import INIT

WHOLE = ClaimOptions(ifname="net0", mtu=9000, addresses=(ip_interface("10.0.0.5/24"),))
SHARED = ClaimOptions(shared=True)


# -- netns death -------------------------------------------------------------------------------


async def test_netns_death_ends_a_whole_claim_and_restores_the_returned_nic(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")  # the NIC comes back as net0, down, without addresses
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert host_side(kernel) == before
    assert rig.core.claims() == [] and Store(tmp_path).load().claims == []
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE


async def test_netns_death_ends_a_shared_claim_and_leaves_the_parent_alone(rigs: Rigs) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    kernel.delete_netns("pod")  # the macvlan child dies with it
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    await rig.quiesce()
    assert host_side(kernel) == before and rig.state("mlx5_0") == DeviceState.AVAILABLE


async def test_netns_death_in_exclusive_mode_brings_the_device_home_without_removing_it(
    rigs: Rigs,
) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    await rig.quiesce()
    assert kernel.rdma_netns("mlx5_0") == INIT and host_side(kernel) == before
    view = rig.core.device("mlx5_0")
    assert (view.state, view.netns) == (DeviceState.AVAILABLE, "init")
    assert rig.seen.removed == [], "the device came home: it never left the inventory"


async def test_a_nic_that_comes_home_late_is_waited_for_then_restored(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    kernel.nics_return_late = True
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    await rig.quiesce()
    assert rig.seen.ended == [], "the claim ends once its NIC is home"
    kernel.return_parked()
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert host_side(kernel) == before
    assert Store(tmp_path).load().pending_restores == []


async def test_a_nic_later_than_the_wait_is_restored_whenever_it_comes_home(
    rigs: Rigs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rdmad.core.giveback.RETURN_TIMEOUT_S", 0.01)  # the NIC is later than that
    kernel = two_nics()
    before = host_side(kernel)
    kernel.nics_return_late = True
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert [h.name for h in Store(tmp_path).load().pending_restores] == ["eth0"]
    kernel.return_parked()  # as net0, down, without addresses
    await rig.quiesce()
    assert host_side(kernel) == before
    assert Store(tmp_path).load().pending_restores == []
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE


async def test_a_returned_nic_whose_name_is_taken_comes_back_as_devN_and_is_renamed(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim(
        "mlx5_0", rig.process.resolver.open("pod"), ClaimOptions(ifname="eth1")
    )
    kernel.delete_netns("pod")  # eth1 is taken at home: the kernel names it dev<ifindex>
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert host_side(kernel) == before


async def test_netns_death_while_a_claim_holds_it_open_ends_the_claim_once_it_is_done(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    gate = kernel.pause("chardevs")
    task = asyncio.ensure_future(rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE))
    await gate.reached.wait()
    kernel.delete_netns("pod")  # the daemon's fd keeps it alive until the claim closes it
    assert kernel.netns("pod").alive
    gate.go.set()
    claim = await task
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert host_side(kernel) == before and rig.core.claims() == []


# -- stale and reused ---------------------------------------------------------------------------


async def test_a_stale_dellink_for_a_netdev_already_home_keeps_its_device_available(
    rigs: Rigs, tmp_path: Path
) -> None:
    # The claim's RTM_DELLINK is read only after the release brought the netdev home.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    with kernel.hold_events() as claim_events:
        claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with kernel.hold_events() as release_events:
        await rig.core.release(claim.id)
    await rig.quiesce()
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE
    kernel.deliver(claim_events)  # the stale RTM_DELLINK of eth0
    await rig.quiesce()
    view = rig.core.device("mlx5_0")
    assert (view.state, view.device.netdev) == (DeviceState.AVAILABLE, "eth0")
    kernel.deliver(release_events)
    await rig.quiesce()
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE


async def test_a_dellink_for_a_netdev_really_gone_makes_its_device_unavailable(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("elsewhere")
    rig = await rigs.start(kernel)
    kernel.move_link("eth0", "elsewhere")  # someone else's move
    await rig.quiesce()
    assert rig.state("mlx5_0") == DeviceState.UNAVAILABLE


async def test_a_stale_delnsid_for_a_reused_nsid_keeps_the_live_claim(
    rigs: Rigs, tmp_path: Path
) -> None:
    # nsids are reused as soon as a netns dies: a RTM_DELNSID still queued about the dead
    # one carries the nsid the claimed netns got since.
    kernel = two_nics()
    old = kernel.add_netns("old")
    dead_nsid = kernel.assign_nsid(old)
    rig = await rigs.start(kernel)
    with kernel.hold_events() as late:
        kernel.delete_netns("old")
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert claim.attached.nsid == dead_nsid
    kernel.deliver(late)
    await rig.quiesce()
    assert [c.phase for c in Store(tmp_path).load().claims] == [ClaimPhase.ACTIVE]
    assert rig.core.get_claim(claim.id).phase == ClaimPhase.ACTIVE and rig.seen.ended == []
    assert kernel.link("net0", "pod") is not None


async def test_a_netns_death_ends_its_claim_though_a_newer_netns_got_its_inode_already(
    rigs: Rigs, tmp_path: Path
) -> None:
    # The kernel gives a dead netns's inode to the next netns made, possibly before rdmad
    # reads the RTM_DELNSID: that netns is not the claim's.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    with kernel.hold_events() as late:
        kernel.delete_netns("pod")
        kernel.add_netns("newcomer", inode=claim.netns_inode)
    kernel.deliver(late)
    await rig.seen.wait_released(claim.id)
    assert rig.seen.ended == [(claim.id, ReleaseReason.NETNS_GONE)]


async def test_a_lost_delnsid_is_caught_by_the_resync_after_an_overrun(rigs: Rigs) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with kernel.hold_events():  # never delivered: the socket overran
        kernel.delete_netns("pod")
    rig.core.handle(Resync("rtnetlink"))
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    await rig.quiesce()
    assert host_side(kernel) == before and rig.state("mlx5_0") == DeviceState.AVAILABLE


async def test_the_resync_after_an_overrun_ends_a_claim_whose_nsid_and_inode_a_newer_netns_got(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    with kernel.hold_events():  # never delivered: the socket overran
        kernel.delete_netns("pod")
        newcomer = kernel.add_netns("newcomer", inode=claim.netns_inode)
        assert kernel.assign_nsid(newcomer) == claim.attached.nsid
    rig.core.handle(Resync("rtnetlink"))
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE


# -- devices coming and going -------------------------------------------------------------------


async def test_a_device_unplugged_while_claimed_ends_its_claim_and_its_netdev_comes_home(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.remove_rdma("mlx5_0")
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.DEVICE_REMOVED
    assert rig.seen.removed == ["mlx5_0"]
    assert host_side(kernel) == before
    assert [v.device.name for v in rig.core.devices()] == ["mlx5_1"]


async def test_a_device_plugged_in_is_announced_as_added(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    kernel.add_nic("eth2")
    kernel.add_rdma("mlx5_2", "eth2")
    await rig.seen.wait_for(lambda: any(v.device.name == "mlx5_2" for v in rig.seen.views))
    assert rig.state("mlx5_2") == DeviceState.AVAILABLE


async def test_an_rdma_subsystem_that_turns_up_late_brings_its_mode_and_devices(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.mode = NetnsMode.UNAVAILABLE  # ib_core not loaded yet
    rig = await rigs.start(kernel)
    assert rig.core.devices() == []
    kernel.mode = NetnsMode.SHARED
    kernel.add_nic("eth2")
    kernel.add_rdma("mlx5_2", "eth2")  # modprobe: udev reports the devices
    await rig.seen.wait_for(lambda: len(rig.core.devices()) == 3)
    assert rig.seen.modes == [NetnsMode.SHARED] and rig.core.netns_mode == NetnsMode.SHARED


async def test_a_netdev_renamed_by_someone_else_is_shown_under_its_new_name(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    kernel.rename_link("eth1", "renamed0")
    await rig.quiesce()
    view = rig.core.device("mlx5_1")
    assert (view.device.netdev, view.state) == ("renamed0", DeviceState.AVAILABLE)
