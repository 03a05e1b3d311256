"""A held claim outlives its pod's sandbox: when the netns it was attached to dies, or the
pod's CNI DEL detaches it (Core.detach), what it took comes home and it is held for its pod
again, for the next sandbox's Attach (the kubelet makes a new sandbox for the same pod
without preparing its claims again). Only Release (the kubelet's unprepare) ends it. The
real Core on the in-memory kernel."""

from __future__ import annotations

from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.store import Store
from rdmad.errors import InvalidArgs, NoSuchClaim
from rdmad.model import Claim, ClaimOptions, ClaimPhase, DeviceState, NetnsMode, ReleaseReason
from tests.support.core_rig import Rig, Rigs, host_side, two_nics
from tests.support.fake_kernel import INIT, FakeKernel

POD = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"
WHOLE = ClaimOptions(ifname="net0", mtu=9000)
SHARED = ClaimOptions(shared=True, ifname="net0")
ADDRESSES = ClaimOptions(addresses=(ip_interface("10.0.0.5/24"),))


async def attached(rig: Rig, device: str, options: ClaimOptions, netns: str = "pod") -> Claim:
    """A hold of `device` for POD, attached to `netns` (its first sandbox's ADD)."""
    held = await rig.core.hold(device, POD, options)
    await rig.core.attach(POD, rig.process.resolver.open(netns), "", ADDRESSES)
    assert held.phase == ClaimPhase.ACTIVE
    return held


async def sandbox_dies(rig: Rig, kernel: FakeKernel, claim: Claim, netns: str = "pod") -> None:
    """The netns dies (its sandbox gone without a DEL), and the core has dealt with it."""
    kernel.delete_netns(netns)
    await rig.seen.wait_for(lambda: claim.phase == ClaimPhase.HELD)
    await rig.quiesce()


# ------------------------------------------------------------------ the netns dies


async def test_an_attached_hold_whose_netns_dies_is_held_for_its_pod_again(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await sandbox_dies(rig, kernel, held)
    assert (held.netns, held.hold is not None and held.hold.pod_uid) == ("", POD)
    assert [c.id for c in rig.core.claims()] == [held.id] and rig.seen.ended == []
    assert rig.state("mlx5_0") == DeviceState.CLAIMED, "still taken: not back in the offer"


async def test_a_hold_whose_netns_died_has_its_device_home_as_it_left(rigs: Rigs) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await sandbox_dies(rig, kernel, held)
    assert host_side(kernel) == before
    assert held.attachment is None


async def test_a_hold_whose_netns_died_is_attached_again_by_the_next_sandbox(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await sandbox_dies(rig, kernel, held)
    kernel.add_netns("pod-again")
    again = await rig.core.attach(POD, rig.process.resolver.open("pod-again"), "", ADDRESSES)
    assert [c.id for c in again] == [held.id]
    assert held.netns_inode == kernel.netns("pod-again").inode
    assert kernel.link("net0", "pod-again") is not None


async def test_a_hold_whose_netns_died_tells_its_observers_so(rigs: Rigs) -> None:
    """The bus's PropertiesChanged (State, Netns) and the CDI spec follow claim_changed."""
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    mark = len(rig.seen.changed)
    await sandbox_dies(rig, kernel, held)
    assert rig.seen.changed[mark:] == [held.id]


async def test_a_hold_whose_netns_died_is_saved_held(rigs: Rigs, tmp_path: Path) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await sandbox_dies(rig, kernel, held)
    (saved,) = Store(tmp_path).load().claims
    assert (saved.id, saved.phase, saved.netns_inode) == (held.id, ClaimPhase.HELD, 0)


async def test_in_exclusive_mode_a_hold_whose_netns_died_lists_its_char_devices_at_home(
    rigs: Rigs,
) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    in_pod = {c for c in held.chardevs if c.kind == "uverbs"}
    await sandbox_dies(rig, kernel, held)
    assert kernel.rdma_netns("mlx5_0") == INIT
    home = {c for c in held.chardevs if c.kind == "uverbs"}
    assert [c.minor for c in home] == [192 + kernel.rdma["mlx5_0"].minor]
    assert home != in_pod, "the move home made uverbs anew"


async def test_a_shared_hold_whose_netns_died_is_held_again_its_child_gone(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", SHARED)
    await sandbox_dies(rig, kernel, held)
    assert rig.state("mlx5_0") == DeviceState.SHARED and kernel.link("eth0") is not None
    kernel.add_netns("pod-again")
    await rig.core.attach(POD, rig.process.resolver.open("pod-again"), "", ADDRESSES)
    assert kernel.link("net0", "pod-again") is not None


async def test_release_ends_a_hold_whose_netns_died(rigs: Rigs, tmp_path: Path) -> None:
    """Nothing is stranded: the kubelet's unprepare ends a hold whose pod never comes back."""
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await sandbox_dies(rig, kernel, held)
    await rig.core.release(held.id)
    await rig.quiesce()
    assert rig.core.claims() == [] and Store(tmp_path).load().claims == []
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE
    assert rig.seen.ended == [(held.id, ReleaseReason.REQUESTED)]


async def test_a_hold_whose_netns_died_survives_a_restart(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await sandbox_dies(rig, kernel, held)
    fresh = await rig.restart()
    await fresh.quiesce()
    (kept,) = fresh.core.claims()
    assert (kept.id, kept.phase, kept.hold) == (held.id, ClaimPhase.HELD, held.hold)
    assert fresh.state("mlx5_0") == DeviceState.CLAIMED and fresh.seen.ended == []


async def test_a_hold_whose_netns_died_while_rdmad_was_down_is_held_again_at_start(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await rig.crash()
    kernel.delete_netns("pod")
    fresh = await rigs.start(kernel, rig.store)
    await fresh.quiesce()
    (kept,) = fresh.core.claims()
    assert (kept.id, kept.phase, kept.netns) == (held.id, ClaimPhase.HELD, "")
    assert host_side(kernel) == before and fresh.seen.ended == []
    assert [c.phase for c in Store(tmp_path).load().claims] == [ClaimPhase.HELD]


async def test_a_claim_without_a_hold_still_ends_with_its_netns(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert rig.core.claims() == []


# ------------------------------------------------------------------ Detach (the pod's DEL)


async def test_detach_brings_the_device_home_and_holds_it_for_the_pod_again(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await rig.core.detach(held.id)
    await rig.quiesce()
    assert host_side(kernel) == before and kernel.links_in("pod") == []
    assert (held.phase, held.netns) == (ClaimPhase.HELD, "")
    assert rig.state("mlx5_0") == DeviceState.CLAIMED and rig.seen.ended == []
    assert [c.phase for c in Store(tmp_path).load().claims] == [ClaimPhase.HELD]


async def test_after_detach_the_next_sandbox_attaches_the_hold_again(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    held = await attached(rig, "mlx5_0", WHOLE)
    await rig.core.detach(held.id)
    kernel.add_netns("pod-again")
    await rig.core.attach(POD, rig.process.resolver.open("pod-again"), "", ADDRESSES)
    assert kernel.link("net0", "pod-again") is not None and held.phase == ClaimPhase.ACTIVE


async def test_detach_of_a_hold_not_attached_changes_nothing(rig: Rig) -> None:
    """A retried DEL."""
    held = await rig.core.hold("mlx5_0", POD, WHOLE)
    await rig.core.detach(held.id)
    assert held.phase == ClaimPhase.HELD and rig.seen.changed == []


async def test_detach_of_a_claim_without_a_hold_is_refused(rig: Rig) -> None:
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with pytest.raises(InvalidArgs, match="not held for a pod"):
        await rig.core.detach(claim.id)
    assert claim.phase == ClaimPhase.ACTIVE


async def test_detach_of_an_unknown_claim_is_no_such_claim(rig: Rig) -> None:
    with pytest.raises(NoSuchClaim):
        await rig.core.detach("0123456789abcdef")
