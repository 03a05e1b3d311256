"""Counters and operation statistics: the real Core on the in-memory kernel."""

from __future__ import annotations

import pytest

from rdmad.errors import DeviceBusy, NoSuchDevice
from rdmad.model import (
    ClaimOptions,
    Counters,
    CounterScope,
    NetnsMode,
    PortCounters,
    ReleaseReason,
)
from tests.support.core_rig import Rig, Rigs, two_nics

WHOLE = ClaimOptions(ifname="net0")
SHARED = ClaimOptions(shared=True)


async def test_device_counters_are_device_wide(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.rdma["mlx5_0"].counters = {"sent_pkts": 5, "rcvd_pkts": 7}
    rig = await rigs.start(kernel)
    counters = await rig.core.device_counters("mlx5_0")
    assert counters.scope is CounterScope.DEVICE
    assert counters.ports == (PortCounters(1, {"sent_pkts": 5, "rcvd_pkts": 7}),)


async def test_a_shared_claim_sees_its_devices_counters(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.rdma["mlx5_0"].counters = {"sent_pkts": 5}
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), SHARED)
    counters = await rig.core.claim_counters(claim.id)
    assert counters.scope is CounterScope.DEVICE
    assert counters.ports == (PortCounters(1, {"sent_pkts": 5}),)


async def test_a_whole_claim_in_exclusive_mode_reads_its_own_counters_in_its_netns(
    rigs: Rigs,
) -> None:
    kernel = two_nics(NetnsMode.EXCLUSIVE)
    kernel.rdma["mlx5_0"].counters = {"sent_pkts": 9}
    rig = await rigs.start(kernel)
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    counters = await rig.core.claim_counters(claim.id)
    assert counters.scope is CounterScope.CLAIM
    assert counters.ports == (PortCounters(1, {"sent_pkts": 9}),)
    assert kernel.netns("pod").refs == 0  # the netns was opened for the read only


async def test_a_device_that_went_away_is_a_named_error(rigs: Rigs) -> None:
    kernel = two_nics()
    rig = await rigs.start(kernel)
    del kernel.rdma["mlx5_0"]  # unplugged, its event not yet applied
    with pytest.raises(NoSuchDevice, match="went away"):
        await rig.core.device_counters("mlx5_0")


async def test_statistics_count_claims_releases_and_errors_by_name(rig: Rig) -> None:
    claim = await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    with pytest.raises(DeviceBusy):
        await rig.core.claim("mlx5_0", rig.process.resolver.open("pod"), WHOLE)
    await rig.core.release(claim.id)
    stats = rig.core.stats
    assert stats.claims == 1 and stats.claim_seconds.count == 1
    assert stats.releases == {ReleaseReason.REQUESTED: 1}
    assert stats.release_seconds.count == 1
    assert stats.errors == {("claim", DeviceBusy.dbus_name): 1}


async def test_a_device_held_whole_for_a_pod_is_read_in_init_net(rigs: Rigs) -> None:
    kernel = two_nics()
    kernel.rdma["mlx5_0"].counters = {"sent_pkts": 3}
    rig = await rigs.start(kernel)
    held = await rig.core.hold("mlx5_0", "pod-uid", WHOLE)
    read = PortCounters(1, {"sent_pkts": 3})
    assert (await rig.core.device_counters("mlx5_0")).ports == (read,)
    assert await rig.core.claim_counters(held.id) == Counters(CounterScope.CLAIM, (read,))
