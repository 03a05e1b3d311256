"""Holds: a device kept for a pod before its netns exists (Core.hold), attached to the netns
later (Core.attach), released like a claim. The real Core on the in-memory kernel."""

from __future__ import annotations

import asyncio
import contextlib
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.store import Store
from rdmad.errors import DeviceBusy, InvalidArgs, NoSuchClaim, NoSuchDevice
from rdmad.model import ClaimOptions, ClaimPhase, DeviceState, NetnsMode, ReleaseReason
from tests.support.core_rig import WAIT, Rig, Rigs, host_side, two_nics
from tests.support.fake_kernel import INIT
from tests.unit.test_core_reconcile import crash_at

POD = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"
OTHER_POD = "5b1e9d2a-0c3f-4f7a-8e61-2d4c6b8a0e97"
WHOLE = ClaimOptions(ifname="net0", mtu=9000)
SHARED = ClaimOptions(shared=True)
ADDRESSES = ClaimOptions(addresses=(ip_interface("10.0.0.5/24"),))


async def test_a_hold_moves_nothing_and_makes_the_device_unavailable_to_others(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    await rig.quiesce()
    assert held.phase == ClaimPhase.HELD and held.netns == ""
    assert kernel.link("eth0") is not None and kernel.links_in("pod") == []
    assert rig.state("mlx5_0") == DeviceState.CLAIMED
    with pytest.raises(DeviceBusy, match=held.id):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)


async def test_a_hold_is_announced_as_made_so_that_its_cdi_spec_exists_before_attach(
    rig: Rig,
) -> None:
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    assert rig.seen.made == [held.id]
    assert {c.kind for c in held.chardevs} == {"uverbs", "rdma_cm"}


async def test_a_hold_needs_a_pod_uid(rig: Rig) -> None:
    with pytest.raises(InvalidArgs, match="pod UID"):
        await rig.core.hold("mlx5_0", "", WHOLE)


async def test_a_device_is_held_once_for_one_pod(rig: Rig) -> None:
    await rig.core.hold("mlx5_0", POD, SHARED)
    with pytest.raises(DeviceBusy, match=POD):
        await rig.core.hold("mlx5_0", POD, SHARED)


async def test_a_shared_device_is_held_for_several_pods(rig: Rig) -> None:
    first = await rig.core.hold("mlx5_0", POD, SHARED)
    second = await rig.core.hold("mlx5_0", OTHER_POD, SHARED)
    assert {c.id for c in rig.core.claims()} == {first.id, second.id}


async def test_a_pods_shared_holds_without_a_name_get_net1_net2_and_attach_side_by_side(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    first = await rig.core.hold("mlx5_0", POD, SHARED)
    second = await rig.core.hold("mlx5_1", POD, SHARED)
    other_pods = await rig.core.hold("mlx5_0", OTHER_POD, SHARED)
    assert (first.ifname, second.ifname, other_pods.ifname) == ("net1", "net2", "net1")
    await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ClaimOptions())
    assert {link.name for link in kernel.links_in("pod")} >= {"net1", "net2"}


async def test_a_whole_device_held_for_one_pod_is_refused_to_another(rig: Rig) -> None:
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    with pytest.raises(DeviceBusy, match=held.id):
        await rig.core.hold("mlx5_0", OTHER_POD, WHOLE)


async def test_a_hold_of_an_unknown_device_is_refused(rig: Rig) -> None:
    with pytest.raises(NoSuchDevice):
        await rig.core.hold("mlx5_9", POD, WHOLE)


async def test_attach_moves_the_held_netdev_into_the_netns_as_a_claim_does(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    attached = await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES)
    assert [c.id for c in attached] == [held.id]
    moved = kernel.link("net0", "pod")
    assert moved is not None and (moved.mtu, moved.addresses) == (9000, ("10.0.0.5/24",))
    assert held.phase == ClaimPhase.ACTIVE and held.netns_inode == kernel.netns("pod").inode
    assert rig.seen.changed == [held.id], "the CDI spec is written again"


async def test_attach_of_a_pod_with_nothing_held_does_nothing(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    assert await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES) == []
    assert kernel.links_in("pod") == []


async def test_attach_named_by_interface_takes_only_that_hold(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.hold("mlx5_0", POD, ClaimOptions(ifname="rdma0"))
    second = await rig.core.hold("mlx5_1", POD, ClaimOptions(ifname="rdma1"))
    attached = await rig.core.attach(POD, rig.process.resolver.open("pod"), "rdma1", ADDRESSES)
    assert [c.id for c in attached] == [second.id]
    assert [link.name for link in kernel.links_in("pod")] == ["rdma1"]
    with pytest.raises(NoSuchClaim, match="rdma9"):
        await rig.core.attach(POD, rig.process.resolver.open("pod"), "rdma9", ADDRESSES)


async def test_attach_again_into_the_same_netns_returns_the_claim_as_it_is(rig: Rig) -> None:
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES)
    again = await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES)
    assert [c.id for c in again] == [held.id] and rig.seen.changed == [held.id]


async def test_attach_in_exclusive_mode_reads_the_char_devices_again_after_the_move(
    rigs: Rigs,
) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES)
    assert kernel.rdma_netns("mlx5_0") == kernel.netns("pod").inode
    uverbs = next(c for c in held.chardevs if c.kind == "uverbs")
    assert uverbs.minor == 192 + kernel.rdma["mlx5_0"].minor


async def test_a_failed_attach_leaves_the_device_home_and_held(rigs: Rigs, tmp_path: Path) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    kernel.fail("chardevs", NoSuchDevice("gone mid-way"))
    with pytest.raises(NoSuchDevice):
        await rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES)
    assert host_side(kernel) == before and kernel.links_in("pod") == []
    assert held.phase == ClaimPhase.HELD and held.netns == "" and held.attachment is None
    assert [c.phase for c in Store(tmp_path).load().claims] == [ClaimPhase.HELD]


async def test_release_of_a_hold_frees_the_device(rig: Rig, tmp_path: Path) -> None:
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    await rig.core.release(held.id)
    await rig.quiesce()
    assert rig.core.claims() == [] and Store(tmp_path).load().claims == []
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE
    assert rig.seen.ended == [(held.id, ReleaseReason.REQUESTED)]


async def test_a_hold_survives_a_restart_and_attaches_after_it(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    fresh = await rig.restart()
    await fresh.quiesce()
    (kept,) = fresh.core.claims()
    assert (kept.id, kept.phase, kept.hold) == (held.id, ClaimPhase.HELD, held.hold)
    assert fresh.state("mlx5_0") == DeviceState.CLAIMED and fresh.seen.ended == []
    await fresh.core.attach(POD, fresh.process.resolver.open("pod"), "", ADDRESSES)
    assert kernel.link("net0", "pod") is not None


async def test_an_attach_interrupted_by_a_crash_is_undone_back_to_held(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    gate = kernel.pause("chardevs")  # the netdev moved and configured
    task = asyncio.ensure_future(
        rig.core.attach(POD, rig.process.resolver.open("pod"), "", ADDRESSES)
    )
    try:
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        fresh = await rig.restart()
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):  # the dead daemon's call never returns
            await task
    await fresh.quiesce()
    assert kernel.links_in("pod") == [] and kernel.link("eth0") is not None
    assert kernel.rdma_netns("mlx5_0") == INIT
    (kept,) = fresh.core.claims()
    assert (kept.id, kept.phase, kept.netns) == (held.id, ClaimPhase.HELD, "")


async def test_a_holds_release_cut_short_by_a_crash_is_finished_at_the_next_start(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    await rig.quiesce()
    # Its first kernel call, once RELEASING is written: the re-read of its device.
    fresh = await crash_at(rig, "get_device", rig.core.release(held.id))
    await fresh.quiesce()
    assert fresh.core.claims() == [] and fresh.state("mlx5_0") == DeviceState.AVAILABLE
    assert fresh.seen.ended == [(held.id, ReleaseReason.RECONCILED)]
