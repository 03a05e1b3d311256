"""What observers (the bus, the journal) are told: a device's State changes once per step a
caller can act on, with no passing state while its netdev is between netns; mode changes.
The real Core on the in-memory kernel."""

from __future__ import annotations

import asyncio
from ipaddress import ip_interface
from pathlib import Path

import pytest

from rdmad.core.observer import CoreObserver, Observers
from rdmad.errors import DeviceBusy, ModeBusy, Unavailable
from rdmad.model import Claim, ClaimOptions, DeviceState, DeviceView, NetnsMode, ReleaseReason
from tests.support.core_rig import WAIT, Recorder, Rig, Rigs, two_nics

WHOLE = ClaimOptions(ifname="net0", mtu=9000, addresses=(ip_interface("10.0.0.5/24"),))
SHARED = ClaimOptions(shared=True)
AVAILABLE = DeviceState.AVAILABLE


@pytest.mark.parametrize("mode", [NetnsMode.SHARED, NetnsMode.EXCLUSIVE])
async def test_a_claim_and_its_release_show_as_claimed_then_available(
    rigs: Rigs, mode: NetnsMode
) -> None:
    rig = await rigs.start(two_nics(mode))
    mark = rig.seen.mark()
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.core.release(claim.id)
    await rig.quiesce()
    assert rig.seen.state_changes("mlx5_0", mark, AVAILABLE) == ["claimed", "available"]


async def test_a_claim_is_announced_claimed_when_the_call_returns(rig: Rig) -> None:
    mark = rig.seen.mark()
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert rig.seen.state_changes("mlx5_0", mark, AVAILABLE) == ["claimed"]


async def test_the_device_list_shows_what_observers_were_told_while_a_claim_runs(
    rigs: Rigs, tmp_path: Path
) -> None:
    # ListDevices and the devices' bus properties agree: no passing state mid-claim.
    rig = await rigs.start(two_nics())
    gate = rig.kernel.pause("gids")  # the netdev is in the netns by then
    claiming = asyncio.create_task(
        rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    )
    await asyncio.wait_for(gate.reached.wait(), WAIT)
    await rig.quiesce()
    listed = {v.device.name: v.state for v in rig.core.devices()}
    assert listed == {"mlx5_0": AVAILABLE, "mlx5_1": AVAILABLE}
    gate.go.set()
    await claiming
    assert [v.state for v in rig.core.devices()] == [DeviceState.CLAIMED, AVAILABLE]


async def test_a_shared_claim_and_its_release_show_as_shared_then_available(rig: Rig) -> None:
    mark = rig.seen.mark()
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    await rig.core.release(claim.id)
    await rig.quiesce()
    assert rig.seen.state_changes("mlx5_0", mark, AVAILABLE) == ["shared", "available"]


@pytest.mark.parametrize("mode", [NetnsMode.SHARED, NetnsMode.EXCLUSIVE])
async def test_netns_death_shows_as_available_once_the_nic_is_restored(
    rigs: Rigs, tmp_path: Path, mode: NetnsMode
) -> None:
    # The NIC comes back by itself, down and misnamed: no "unavailable" while it is fixed.
    kernel = two_nics(mode)
    rig = await rigs.start(kernel)
    mark = rig.seen.mark()
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    kernel.delete_netns("pod")
    await rig.seen.wait_released(claim.id)
    await rig.quiesce()
    assert rig.seen.state_changes("mlx5_0", mark, AVAILABLE) == ["claimed", "available"]
    assert rig.core.device("mlx5_0").device.netdev == "eth0"


async def test_claimed_and_released_are_told_once_each(rig: Rig) -> None:
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.core.release(claim.id)
    await rig.quiesce()
    assert rig.seen.made == [claim.id]
    assert rig.seen.ended == [(claim.id, ReleaseReason.REQUESTED)]


async def test_a_failed_claim_is_never_announced(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    mark = rig.seen.mark()
    kernel.fail("chardevs", DeviceBusy("no"))
    with pytest.raises(DeviceBusy):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.quiesce()
    assert rig.seen.made == [] and rig.seen.state_changes("mlx5_0", mark, AVAILABLE) == []


async def test_a_netdev_moved_away_by_someone_else_shows_unavailable_then_available(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    kernel.add_netns("elsewhere")
    rig = await rigs.start(kernel)
    mark = rig.seen.mark()
    kernel.move_link("eth0", "elsewhere")
    await rig.quiesce()
    kernel.move_link("eth0", None, from_netns="elsewhere")
    await rig.quiesce()
    assert rig.seen.state_changes("mlx5_0", mark, AVAILABLE) == ["unavailable", "available"]


async def test_concurrent_claims_of_one_device_give_one_winner(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.add_netns("other")
    rig = await rigs.start(kernel)
    results = await asyncio.gather(
        rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE),
        rig.core.claim("mlx5_0", rig.process.resolver.open("other"), WHOLE),
        return_exceptions=True,
    )
    assert sorted(type(r).__name__ for r in results) == ["Claim", "DeviceBusy"]


# -- the netns mode ------------------------------------------------------------------------------


async def test_the_mode_changes_while_no_other_netns_exists_and_every_device_is_retold(
    rigs: Rigs,
) -> None:
    kernel = two_nics()
    kernel.delete_netns("pod")
    rig = await rigs.start(kernel)
    mark = rig.seen.mark()
    await rig.core.set_netns_mode(NetnsMode.EXCLUSIVE)
    assert kernel.mode == NetnsMode.EXCLUSIVE and rig.core.netns_mode == NetnsMode.EXCLUSIVE
    assert rig.seen.modes == [NetnsMode.EXCLUSIVE]
    assert {v.device.name for v in rig.seen.views[mark:]} == {"mlx5_0", "mlx5_1"}


async def test_the_mode_does_not_change_while_claims_live(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    with pytest.raises(DeviceBusy, match="claims are live"):
        await rig.core.set_netns_mode(NetnsMode.EXCLUSIVE)
    assert kernel.mode == NetnsMode.SHARED and rig.seen.modes == []


async def test_the_mode_does_not_change_while_another_netns_exists(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    with pytest.raises(ModeBusy):
        await rig.core.set_netns_mode(NetnsMode.EXCLUSIVE)
    assert rig.core.netns_mode == NetnsMode.SHARED and rig.seen.modes == []


async def test_the_mode_cannot_be_set_without_an_rdma_subsystem(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.mode = NetnsMode.UNAVAILABLE
    rig = await rigs.start(kernel)
    with pytest.raises(Unavailable):
        await rig.core.set_netns_mode(NetnsMode.EXCLUSIVE)


async def test_setting_the_current_mode_changes_nothing(rigs: Rigs) -> None:
    rig = await rigs.start(two_nics())  # `pod` exists: a change would fail
    await rig.core.set_netns_mode(NetnsMode.SHARED)
    assert rig.seen.modes == []


# -- observers ------------------------------------------------------------------------------------


class Broken(CoreObserver):
    def claimed(self, claim: Claim) -> None:
        raise RuntimeError("observer bug")

    def device_changed(self, view: DeviceView) -> None:
        raise RuntimeError("observer bug")


async def test_an_observer_that_raises_breaks_neither_the_claim_nor_the_other_observers(
    rig: Rig,
) -> None:
    after = Recorder()
    rig.core.add_observer(Broken())
    rig.core.add_observer(after)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    assert after.made == [claim.id] and rig.seen.made == [claim.id]
    assert rig.state("mlx5_0") == DeviceState.CLAIMED


def test_observers_pass_on_every_call_an_observer_can_get() -> None:
    calls = [name for name in vars(CoreObserver) if not name.startswith("_")]
    assert len(calls) == 8
    assert all(getattr(Observers, name) is not getattr(CoreObserver, name) for name in calls)
