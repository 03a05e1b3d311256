"""A daemon killed mid-claim or mid-release, or down while a netns died: the next start
finds the state file and the kernel as the crash left them, and finishes or undoes what
was in flight. The real Core on the in-memory kernel; a crash is the daemon's process
stopping dead at a kernel step (`FakeKernel.pause`), its fds closed, its file kept."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.model import ClaimOptions, ClaimPhase, DeviceState, NetnsMode, ReleaseReason
from rdmad.store import Store
from tests.support.core_rig import WAIT, Rig, Rigs, host_side, two_nics
from tests.support.fake_kernel import INIT

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
    rigs: Rigs, tmp_path: Path, mode: NetnsMode, options: ClaimOptions, step: str
) -> None:
    kernel = two_nics(mode)
    before = host_side(kernel)
    rig = await rigs.start(kernel, Store(tmp_path))
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
        (NetnsMode.SHARED, WHOLE, "get_device"),  # netdev home, the device not re-read
        (NetnsMode.EXCLUSIVE, WHOLE, "move_home"),  # netdev home, RDMA device not
        (NetnsMode.SHARED, SHARED, "delete"),
    ],
)
async def test_a_release_interrupted_by_a_crash_is_finished_and_announced_as_reconciled(
    rigs: Rigs, tmp_path: Path, mode: NetnsMode, options: ClaimOptions, step: str
) -> None:
    kernel = two_nics(mode)
    before = host_side(kernel)
    rig = await rigs.start(kernel, Store(tmp_path))
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
    await rig.quiesce()
    fresh = await crash_at(rig, step, rig.core.release(claim.id))
    await fresh.quiesce()
    assert host_side(kernel) == before
    assert kernel.rdma_netns("mlx5_0") == INIT and kernel.links_in("pod") == []
    assert fresh.core.claims() == [] and phases(fresh) == []
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert fresh.state("mlx5_0") == DeviceState.AVAILABLE


async def test_the_state_file_says_releasing_while_a_release_is_under_way(
    rigs: Rigs, tmp_path: Path
) -> None:
    rig = await rigs.start(two_nics(), Store(tmp_path))
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    gate = rig.kernel.pause("bring_home")
    async with abandoned(rig.core.release(claim.id)):
        await asyncio.wait_for(gate.reached.wait(), WAIT)
        assert phases(rig) == [ClaimPhase.RELEASING]
        gate.go.set()


async def test_a_live_claim_survives_a_restart_as_it_was(rigs: Rigs, tmp_path: Path) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel, Store(tmp_path))
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    fresh = await rig.restart()
    await fresh.quiesce()
    assert [c.id for c in fresh.core.claims()] == [claim.id]
    assert kernel.link("net0", "pod") is not None
    assert fresh.state("mlx5_0") == DeviceState.CLAIMED and fresh.seen.ended == []


async def test_a_netns_deleted_while_the_daemon_was_down_ends_its_claim_at_start(
    rigs: Rigs,
    tmp_path: Path,
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    rig = await rigs.start(kernel, Store(tmp_path))
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
    rig = await rigs.start(kernel, Store(tmp_path))
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    await rig.crash()
    kernel.delete_netns("pod")
    newcomer = kernel.add_netns("newcomer")
    assert kernel.assign_nsid(newcomer) == claim.nsid
    fresh = await rigs.start(kernel, rig.store)
    assert fresh.seen.ended == [(claim.id, ReleaseReason.RECONCILED)]
    assert fresh.core.claims() == []


async def test_a_restore_still_owed_at_a_crash_is_done_when_the_next_start_finds_the_nic(
    rigs: Rigs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rdmad.giveback.RETURN_TIMEOUT_S", 0.01)  # the NIC is later than that
    kernel = two_nics()
    before = host_side(kernel)
    kernel.nics_return_late = True
    rig = await rigs.start(kernel, Store(tmp_path))
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    await rig.seen.wait_released(claim.id)
    assert [h.name for h in Store(tmp_path).load().pending_restores] == ["eth0"]
    await rig.crash()
    kernel.return_parked()
    await rigs.start(kernel, rig.store)
    assert host_side(kernel) == before
    assert Store(tmp_path).load().pending_restores == []
