"""A claim that fails at any step puts everything back as it was, and leaves no claim: the
real Core on the in-memory kernel."""

from __future__ import annotations

import errno
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.store import Store
from rdmad.errors import KernelError, RdmadError
from rdmad.model import ClaimOptions, ClaimPhase, DeviceState, NetnsMode
from tests.support.core_rig import FlakyStore, HostSide, Rig, Rigs, host_side, two_nics
from tests.support.fake_kernel import INIT

WHOLE = ClaimOptions(ifname="net0", mtu=9000, addresses=(ip_interface("10.0.0.5/24"),))
SHARED = ClaimOptions(shared=True)
BROKEN = KernelError(errno.EIO, "the kernel refused")


async def assert_nothing_stranded(rig: Rig, before: HostSide, on_disk: bool = True) -> None:
    """Every netdev home as it was, every RDMA device in init_net, nothing in the netns, no
    claim in memory (nor on disk, unless the disk is what failed), every device available."""
    await rig.quiesce()
    kernel = rig.kernel
    assert host_side(kernel) == before
    assert all(d.netns == INIT for d in kernel.rdma.values())
    assert kernel.links_in("pod") == []
    assert rig.core.claims() == []
    assert rig.seen.state_changes("mlx5_0", 0, DeviceState.AVAILABLE) == [], "no passing state"
    if on_disk:
        assert Store(rig.store.path.parent).load().claims == []
    assert {v.device.name: v.state for v in rig.core.devices()} == {
        "mlx5_0": DeviceState.AVAILABLE,
        "mlx5_1": DeviceState.AVAILABLE,
    }


@pytest.mark.parametrize(
    ("mode", "options", "failing"),
    [
        (NetnsMode.EXCLUSIVE, WHOLE, "move"),
        (NetnsMode.EXCLUSIVE, WHOLE, "place"),
        (NetnsMode.EXCLUSIVE, WHOLE, "chardevs"),
        (NetnsMode.SHARED, WHOLE, "host_config"),
        (NetnsMode.SHARED, WHOLE, "place"),
        (NetnsMode.SHARED, WHOLE, "chardevs"),
        (NetnsMode.SHARED, SHARED, "add_macvlan"),
        (NetnsMode.SHARED, SHARED, "chardevs"),
    ],
)
async def test_a_claim_failing_at_a_kernel_step_is_rolled_back_and_says_why(
    rigs: Rigs, mode: NetnsMode, options: ClaimOptions, failing: str
) -> None:
    kernel = two_nics(mode)
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    kernel.fail(failing, BROKEN)
    with pytest.raises(KernelError, match="the kernel refused"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
    await assert_nothing_stranded(rig, before)
    assert rig.seen.made == [] and rig.seen.ended == []


@pytest.mark.parametrize("options", [WHOLE, SHARED], ids=["whole", "shared"])
@pytest.mark.parametrize("saves_before_full", [0, 1], ids=["pending", "active"])
async def test_a_claim_whose_state_file_cannot_be_written_is_rolled_back(
    rigs: Rigs, tmp_path: Path, options: ClaimOptions, saves_before_full: int
) -> None:
    kernel = two_nics()
    before = host_side(kernel)
    store = FlakyStore(tmp_path)
    rig = await rigs.start(kernel, store)
    store.fail_after = saves_before_full
    with pytest.raises(KernelError, match="state file"):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), options)
    store.full = False
    # A disk that fills after the PENDING record leaves it there: see the next test.
    await assert_nothing_stranded(rig, before, on_disk=saves_before_full == 0)


async def test_a_claim_that_failed_with_a_full_disk_leaves_a_pending_record_the_next_start_drops(
    rigs: Rigs,
    tmp_path: Path,
) -> None:
    # The undo cannot rewrite the file either: it still says PENDING, which a restart undoes
    # (there is nothing left to undo) without announcing anything.
    kernel = two_nics()
    before = host_side(kernel)
    store = FlakyStore(tmp_path)
    rig = await rigs.start(kernel, store)
    store.fail_after = 1
    with pytest.raises(KernelError):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert [c.phase for c in Store(tmp_path).load().claims] == [ClaimPhase.PENDING]
    store.full = False
    fresh = await rig.restart()
    await assert_nothing_stranded(fresh, before)
    assert fresh.seen.ended == []


async def test_a_claim_whose_undo_fails_stays_pending_for_the_next_start_to_finish(
    rigs: Rigs,
    tmp_path: Path,
) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    before = host_side(kernel)
    rig = await rigs.start(kernel)
    kernel.fail("chardevs", BROKEN)
    kernel.fail("move_home", KernelError(errno.EBUSY, "the device is busy"))
    with pytest.raises(RdmadError):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert kernel.rdma_netns("mlx5_0") == kernel.netns("pod").inode  # stranded, for now
    assert [c.phase for c in Store(tmp_path).load().claims] == [ClaimPhase.PENDING]
    fresh = await rig.restart()
    await assert_nothing_stranded(fresh, before)
