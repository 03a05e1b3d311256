"""A daemon killed mid-claim or mid-release, or down while a netns died: the next start
finds the state file and the kernel as the crash left them, and finishes or undoes what
was in flight. The real Core on the in-memory kernel; a crash is the daemon's process
stopping dead at a kernel step (`FakeKernel.pause`), its fds closed, its file kept."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.events import RdmaChanged
from rdmad.core.logfields import MESSAGE_NOT_RETURNED
from rdmad.core.store import Store
from rdmad.errors import KernelError
from rdmad.model import Claim, ClaimOptions, ClaimPhase, DeviceState, NetnsMode, ReleaseReason
from tests.support.core_rig import WAIT, FlakyStore, HostSide, Rig, Rigs, host_side, two_nics
from tests.support.fake_kernel import INIT, FakeKernel

WHOLE = ClaimOptions(ifname="net0", mtu=9000, addresses=(ip_interface("10.0.0.5/24"),))
SHARED = ClaimOptions(shared=True)


def phases(rig: Rig) -> list[ClaimPhase]:
    return [c.phase for c in Store(rig.store.path.parent).load().claims]


@contextlib.asynccontextmanager
async def abandoned(call: Awaitable[object]) -> AsyncIterator[asyncio.Future[object]]:
    """Run `call` as the crashed daemon's last operation; it never returns (the process is
    dead), and is cancelled when the test is over."""
    task = asyncio.ensure_future(call)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def crash_at(rig: Rig, op: str, call: Awaitable[object]) -> Rig:
    """Let `call` run until the kernel step `op`, kill the daemon there, start a fresh one."""
    gate = rig.kernel.pause(op)
    async with abandoned(call):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        return await rig.restart()


@pytest.mark.parametrize(
    ("mode", "options", "step"),
    [
        (NetnsMode.SHARED, WHOLE, "place"),  # PENDING written, nothing moved yet
        (NetnsMode.SHARED, WHOLE, "chardevs"),  # netdev moved and configured
        (NetnsMode.EXCLUSIVE, WHOLE, "place"),  # RDMA device moved, netdev not
        (NetnsMode.EXCLUSIVE, WHOLE, "chardevs"),  # both moved
        (NetnsMode.SHARED, SHARED, "add_macvlan"),
        (NetnsMode.SHARED, SHARED, "chardevs"),  # macvlan child made, its ifindex unrecorded
    ],
)
async def test_a_claim_interrupted_by_a_crash_is_undone_at_the_next_start(
    rigs: Rigs, mode: NetnsMode, options: ClaimOptions, step: str
) -> None:
    kernel = two_nics(mode)
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
    fresh = await crash_at(rig, step, claim)
    await fresh.quiesce()
    assert host_side(kernel) == before
    assert kernel.rdma_netns("mlx5_0") == INIT and kernel.links_in("pod") == []
    assert fresh.core.claims() == [] and phases(fresh) == []
    assert fresh.state("mlx5_0") == DeviceState.AVAILABLE
    assert fresh.seen.ended == [], "a claim never made is not announced as released"


@pytest.mark.parametrize(
    ("mode", "options", "step"),
    [
        (NetnsMode.SHARED, WHOLE, "bring_home"),
        (NetnsMode.SHARED, WHOLE, "configure_home"),  # netdev home, down, no addresses
        (NetnsMode.EXCLUSIVE, WHOLE, "move_home"),  # netdev home, RDMA device not
        (NetnsMode.SHARED, SHARED, "delete"),
    ],
)
async def test_a_release_interrupted_by_a_crash_is_finished_and_announced_as_reconciled(
    rigs: Rigs, mode: NetnsMode, options: ClaimOptions, step: str
) -> None:
    kernel = two_nics(mode)
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
    await rig.quiesce()
    fresh = await crash_at(rig, step, rig.core.release(claim.id))
    await fresh.quiesce()
    assert host_side(kernel) == before
    assert kernel.rdma_netns("mlx5_0") == INIT and kernel.links_in("pod") == []
    assert fresh.core.claims() == [] and phases(fresh) == []
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert fresh.state("mlx5_0") == DeviceState.AVAILABLE


async def test_a_claim_ended_before_the_bus_name_is_taken_is_announced_once_it_is(
    rigs: Rigs, tmp_path: Path
) -> None:
    # The daemon connects to the bus and takes io.rdmad1 after start: a Released sent in
    # between would not come from that name, which monitors match on.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.crash()
    fresh = await rigs.start(kernel, rig.store, announce=False)
    kernel.delete_netns("pod")
    await fresh.quiesce()
    assert fresh.core.claims() == [] and fresh.seen.ended == []
    fresh.core.announce_startup()
    assert fresh.seen.ended == [(claim.id, ReleaseReason.NETNS_GONE)]


async def test_the_state_file_says_releasing_while_a_release_is_under_way(rig: Rig) -> None:
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    gate = rig.kernel.pause("bring_home")
    async with abandoned(rig.core.release(claim.id)):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        assert phases(rig) == [ClaimPhase.RELEASING]
        gate.go.set()


async def test_a_live_claim_survives_a_restart_as_it_was(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    fresh = await rig.restart()
    await fresh.quiesce()
    assert [c.id for c in fresh.core.claims()] == [claim.id]
    assert kernel.link("net0", "pod") is not None
    assert fresh.state("mlx5_0") == DeviceState.CLAIMED and fresh.seen.ended == []


@pytest.mark.parametrize("options", [WHOLE, ClaimOptions(netdev=False)], ids=["whole", "rdma-only"])
async def test_a_device_an_exclusive_claim_moved_is_listed_as_before_after_a_restart(
    rigs: Rigs, options: ClaimOptions
) -> None:
    rig = await rigs.start(two_nics(NetnsMode.EXCLUSIVE))
    before = rig.core.device("mlx5_0").device
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
    fresh = await rig.restart()  # init_net no longer lists the device: the claim must
    await fresh.quiesce()
    view = fresh.core.device("mlx5_0")
    assert (view.device, view.state, view.netns) == (before, DeviceState.CLAIMED, claim.netns)


async def test_a_netns_deleted_while_the_daemon_was_down_ends_its_claim_at_start(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.crash()
    kernel.delete_netns("pod")  # the NIC comes back as net0, down, without addresses
    fresh = await rigs.start(kernel, rig.store)
    await fresh.quiesce()
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert host_side(kernel) == before, "renamed back and reconfigured"
    assert fresh.core.claims() == [] and fresh.state("mlx5_0") == DeviceState.AVAILABLE


async def test_a_dead_netns_whose_nsid_another_netns_got_meanwhile_still_ends_its_claim(
    rigs: Rigs,
    tmp_path: Path,
) -> None:
    # The nsid on record names a live netns again: the claim's own netns (by inode) is gone.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    await rig.crash()
    kernel.delete_netns("pod")
    newcomer = kernel.add_netns("newcomer")
    assert kernel.assign_nsid(newcomer) == claim.attached.nsid
    fresh = await rigs.start(kernel, rig.store)
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert fresh.core.claims() == []


async def test_a_dead_netns_whose_inode_and_nsid_a_newer_netns_got_still_ends_its_claim(
    rigs: Rigs,
    tmp_path: Path,
) -> None:
    # The kernel gives both to the next netns made (a container's, on a busy host): that
    # netns is found by the claim's inode and nsid, and is not the claim's.
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    await rig.crash()
    kernel.delete_netns("pod")
    newcomer = kernel.add_netns("newcomer", inode=claim.netns_inode)
    assert kernel.assign_nsid(newcomer) == claim.attached.nsid
    fresh = await rigs.start(kernel, rig.store)
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert fresh.core.claims() == []


async def test_a_restore_still_owed_at_a_crash_is_done_when_the_next_start_finds_the_nic(
    rigs: Rigs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rdmad.core.giveback.RETURN_TIMEOUT_S", 0.01)  # the NIC is later than that
    kernel = two_nics()
    before = host_side(kernel)
    kernel.nics_return_late = True
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    await rig.seen.wait_released(claim.id)
    assert [h.name for h in Store(tmp_path).load().pending_restores] == ["eth0"]
    await rig.crash()
    kernel.return_parked()
    await rigs.start(kernel, rig.store)
    assert host_side(kernel) == before
    assert Store(tmp_path).load().pending_restores == []


# ---------------------------------------------------------------- a give-back refused at start

REFUSED = KernelError(errno.EEXIST, "bringing net0 home as eth0: the name eth0 is taken")
BUSY = KernelError(errno.EBUSY, "moving mlx5_0 home: the device is busy")
GONE = KernelError(errno.ENODEV, "bringing net0 home as eth0: no netdev net0 in pod")


async def restart_refused(rig: Rig, op: str, error: KernelError) -> Rig:
    """Start a fresh daemon whose first call of `op` the kernel refuses."""
    await rig.crash()
    rig.kernel.fail(op, error)
    return await rig.rigs.start(rig.kernel, rig.store)


async def interrupted_claim(rig: Rig) -> Rig:
    """PENDING: killed with the netdev in the netns, before the claim was done."""
    gate = rig.kernel.pause("chardevs")
    async with abandoned(rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        return await restart_refused(rig, "bring_home", REFUSED)


async def interrupted_release(rig: Rig) -> Rig:
    """RELEASING: killed before the release's first kernel step."""
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    gate = rig.kernel.pause("bring_home")
    async with abandoned(rig.core.release(claim.id)):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        return await restart_refused(rig, "bring_home", REFUSED)


async def interrupted_exclusive_release(rig: Rig) -> Rig:
    """RELEASING, exclusive mode: killed with the netdev home, the RDMA device not."""
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    gate = rig.kernel.pause("move_home")
    async with abandoned(rig.core.release(claim.id)):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        return await restart_refused(rig, "move_home", BUSY)


async def netns_died_while_down(rig: Rig) -> Rig:
    """ACTIVE, its netns deleted while no daemon ran: the NIC is home, unconfigured."""
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.crash()
    rig.kernel.delete_netns("pod")
    rig.kernel.fail("restore", REFUSED)
    return await rig.rigs.start(rig.kernel, rig.store)


async def refused_twice(rig: Rig) -> Rig:
    """NOT_RETURNED: refused at one start, and again, for another reason, at the next."""
    fresh = await interrupted_release(rig)
    return await restart_refused(fresh, "bring_home", GONE)


# the phase a crash left the claim in: the netns mode, how it got there, the last refusal
REFUSALS = {
    "pending": (NetnsMode.SHARED, interrupted_claim, REFUSED),
    "releasing": (NetnsMode.SHARED, interrupted_release, REFUSED),
    "releasing-exclusive": (NetnsMode.EXCLUSIVE, interrupted_exclusive_release, BUSY),
    "active-netns-gone": (NetnsMode.SHARED, netns_died_while_down, REFUSED),
    "not-returned": (NetnsMode.SHARED, refused_twice, GONE),
}


async def refused_at_restart(rigs: Rigs, phase: str) -> tuple[Rig, HostSide]:
    """A daemon started on a claim left in `phase`, whose give-back the kernel refused; and
    the host side as it was before the claim."""
    mode, scenario, _ = REFUSALS[phase]
    kernel = two_nics(mode)
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    fresh = await scenario(rig)
    await fresh.quiesce()
    return fresh, before


def one_claim_not_returned(rig: Rig) -> Claim:
    (claim,) = rig.core.claims()
    assert claim.phase == ClaimPhase.NOT_RETURNED
    return claim


def device_changed(kernel: FakeKernel) -> None:
    """udev reports a change to mlx5_0 (a "change" uevent)."""
    kernel.emit(RdmaChanged("change infiniband/mlx5_0", device="mlx5_0"))


def released_home(rig: Rig, before: HostSide) -> None:
    assert host_side(rig.kernel) == before
    assert rig.kernel.rdma_netns("mlx5_0") == INIT
    assert rig.core.claims() == [] and phases(rig) == []
    assert rig.state("mlx5_0") == DeviceState.AVAILABLE


@pytest.mark.parametrize("phase", list(REFUSALS))
async def test_a_give_back_refused_at_start_keeps_the_claim_listed_with_the_reason(
    rigs: Rigs, phase: str
) -> None:
    fresh, _ = await refused_at_restart(rigs, phase)
    claim = one_claim_not_returned(fresh)
    assert claim.failure == str(REFUSALS[phase][2])
    assert phases(fresh) == [ClaimPhase.NOT_RETURNED], "and the next start knows it"
    # (exclusive mode: the device, in the netns, is not seen from init_net at all)
    held = [v.state for v in fresh.core.devices() if v.device.name == "mlx5_0"]
    assert held in ([DeviceState.CLAIMED], []), "the device is not offered"
    assert fresh.core.startup_notes == [
        "could not give back 1 claim at start (listed as not-returned; see the journal)"
    ]
    assert fresh.seen.ended == []


@pytest.mark.parametrize("phase", list(REFUSALS))
async def test_a_claim_not_returned_at_start_is_given_back_on_the_next_change_to_its_device(
    rigs: Rigs, phase: str
) -> None:
    fresh, before = await refused_at_restart(rigs, phase)
    claim = one_claim_not_returned(fresh)
    device_changed(fresh.kernel)
    assert await fresh.seen.wait_released(claim.id) == ReleaseReason.RECONCILED
    await fresh.quiesce()
    released_home(fresh, before)


@pytest.mark.parametrize("phase", list(REFUSALS))
async def test_a_claim_not_returned_at_start_is_given_back_on_release(
    rigs: Rigs, phase: str
) -> None:
    fresh, before = await refused_at_restart(rigs, phase)
    claim = one_claim_not_returned(fresh)
    await fresh.core.release(claim.id)
    assert fresh.seen.ended == [(claim.id, ReleaseReason.REQUESTED)]
    await fresh.quiesce()
    released_home(fresh, before)


async def test_a_claim_not_returned_at_start_is_given_back_at_the_next_start(rigs: Rigs) -> None:
    fresh, before = await refused_at_restart(rigs, "releasing")
    claim = one_claim_not_returned(fresh)
    again = await fresh.restart()
    assert again.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    await again.quiesce()
    released_home(again, before)


async def test_a_claim_not_returned_at_start_is_given_back_on_a_change_in_its_netns(
    rigs: Rigs,
) -> None:
    fresh, before = await refused_at_restart(rigs, "releasing")
    claim = one_claim_not_returned(fresh)
    fresh.kernel.set_addresses("net0", ("10.0.0.6/24",), netns="pod")
    assert await fresh.seen.wait_released(claim.id) == ReleaseReason.RECONCILED
    await fresh.quiesce()
    released_home(fresh, before)


async def test_a_change_to_another_device_does_not_retry_a_claim_not_returned(rigs: Rigs) -> None:
    fresh, _ = await refused_at_restart(rigs, "releasing")
    tries = fresh.kernel.calls["bring_home"]
    fresh.kernel.emit(RdmaChanged("change infiniband/mlx5_1", device="mlx5_1"))
    await fresh.quiesce()
    assert fresh.kernel.calls["bring_home"] == tries
    one_claim_not_returned(fresh)


async def test_a_release_refused_again_returns_the_error_and_keeps_the_claim_not_returned(
    rigs: Rigs,
) -> None:
    fresh, _ = await refused_at_restart(rigs, "releasing")
    claim = one_claim_not_returned(fresh)
    fresh.kernel.fail("bring_home", REFUSED)
    with pytest.raises(KernelError, match="the name eth0 is taken"):
        await fresh.core.release(claim.id)
    assert one_claim_not_returned(fresh) is claim
    assert phases(fresh) == [ClaimPhase.NOT_RETURNED]
    assert fresh.seen.ended == []


async def test_a_retry_refused_again_keeps_the_claim_and_the_next_change_retries_it(
    rigs: Rigs,
) -> None:
    fresh, before = await refused_at_restart(rigs, "releasing")
    claim = one_claim_not_returned(fresh)
    tries = fresh.kernel.calls["bring_home"]
    fresh.kernel.fail("bring_home", REFUSED)
    device_changed(fresh.kernel)
    await fresh.quiesce()
    assert fresh.kernel.calls["bring_home"] == tries + 1, "retried, and refused"
    assert one_claim_not_returned(fresh) is claim and fresh.seen.ended == []
    device_changed(fresh.kernel)
    assert await fresh.seen.wait_released(claim.id) == ReleaseReason.RECONCILED
    await fresh.quiesce()
    released_home(fresh, before)


async def test_a_give_back_refused_at_start_is_an_error_naming_the_claim(
    rigs: Rigs, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="rdmad"):
        fresh, _ = await refused_at_restart(rigs, "releasing")
        claim = one_claim_not_returned(fresh)
    (record,) = [r for r in caplog.records if r.__dict__.get("MESSAGE_ID") == MESSAGE_NOT_RETURNED]
    assert record.levelno == logging.ERROR
    assert claim.failure in record.getMessage()
    assert {k: record.__dict__.get(k) for k in ("RDMAD_CLAIM", "RDMAD_DEVICE", "RDMAD_ERROR")} == {
        "RDMAD_CLAIM": claim.id,
        "RDMAD_DEVICE": "mlx5_0",
        "RDMAD_ERROR": KernelError.dbus_name,
    }


async def test_a_netns_death_on_a_full_disk_ends_its_claim_and_the_next_start_restores_the_nic(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    store = FlakyStore(tmp_path)
    rig = await rigs.start(kernel, store)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    store.full = True
    kernel.delete_netns("pod")
    assert await rig.seen.wait_released(claim.id) == ReleaseReason.NETNS_GONE
    assert rig.core.claims() == []
    store.full = False
    fresh = await rig.restart()
    await fresh.quiesce()
    assert host_side(kernel) == before
    assert fresh.core.claims() == [] and phases(fresh) == []


async def test_a_bond_a_killed_release_brought_home_gets_its_settings_when_its_netns_died(
    rigs: Rigs, tmp_path: Path
) -> None:
    # RoCE LAG: the RDMA device's netdev is a bond, a virtual netdev, which dies with a netns.
    # A release killed between the move home and the restore, then the netns deleted before
    # the next start: the bond is home (it did not die), down and without its addresses.
    kernel = FakeKernel(NetnsMode.SHARED)
    kernel.add_nic("bond0", mtu=1500, addresses=("192.0.2.1/24",), kind="bond")
    kernel.add_rdma("mlx5_bond_0", "bond0")
    kernel.add_netns("pod")
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_bond_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.quiesce()
    gate = kernel.pause("configure_home")
    async with abandoned(rig.core.release(claim.id)):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        await rig.crash()
    kernel.delete_netns("pod")
    fresh = await rigs.start(kernel, rig.store)
    await fresh.quiesce()
    assert host_side(kernel) == before
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert fresh.state("mlx5_bond_0") == DeviceState.AVAILABLE


async def test_an_ended_claim_stays_on_file_as_ended_until_its_end_is_told(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.crash()
    fresh = await rigs.start(kernel, rig.store, announce=False)
    kernel.delete_netns("pod")
    await fresh.quiesce()
    assert phases(fresh) == [ClaimPhase.ENDED]
    fresh.core.announce_startup()
    assert phases(fresh) == []


async def test_a_claim_whose_end_was_saved_but_not_told_is_told_at_the_next_start(
    rigs: Rigs, tmp_path: Path
) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    await rig.core.release(claim.id)
    await rig.crash()
    # What a daemon killed between a release's end saved and its Released sent leaves.
    ended = replace(claim, phase=ClaimPhase.ENDED, end_reason=ReleaseReason.REQUESTED)
    Store(tmp_path).save_claim(ended, live=True, pending_restores=[])
    fresh = await rigs.start(kernel, rig.store)
    assert fresh.seen.ended == [(claim.id, ReleaseReason.REQUESTED)]
    assert fresh.core.claims() == [] and phases(fresh) == []
