"""GetCounters on devices and claims, and Manager.GetStatistics, in their contract shapes."""

from __future__ import annotations

from dbus_fast import Variant

from rdmad.bus.names import CLAIM_IFACE, DEVICE_IFACE
from rdmad.errors import DeviceBusy
from rdmad.model import RdmaLimit, RdmaUsage
from tests.bus.conftest import Live

DEVICE = "/io/rdmad1/device/mlx5_5f0"


async def test_device_counters_are_device_wide_per_port(live: Live) -> None:
    live.core.port_counters = {"sent_pkts": 3, "rcvd_pkts": 2**40}
    got = await live.call("GetCounters", path=DEVICE, interface=DEVICE_IFACE)
    assert got == ["device", [(1, {"sent_pkts": 3, "rcvd_pkts": 2**40})]]


async def test_a_whole_device_claims_counters_are_its_own(live: Live) -> None:
    live.core.port_counters = {"sent_pkts": 3}
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {}])
    got = await live.call("GetCounters", path=path, interface=CLAIM_IFACE)
    assert got == ["claim", [(1, {"sent_pkts": 3})]]


async def test_a_shared_claims_counters_are_its_devices(live: Live) -> None:
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    (scope, _ports) = await live.call("GetCounters", path=path, interface=CLAIM_IFACE)
    assert scope == "device"


async def test_a_claims_rdma_usage_is_its_devices_lines_in_its_cgroup(live: Live) -> None:
    live.core.usage = RdmaUsage("kubepods/pod1", RdmaLimit(1, 7), RdmaLimit(1, None))
    options = {"cgroup": Variant("s", "kubepods/pod1"), "hca_handles": Variant("u", 1)}
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", options])
    got = await live.call("GetRdmaUsage", path=path, interface=CLAIM_IFACE)
    assert got == ["kubepods/pod1", {"hca_handle": 1, "hca_object": 7}, {"hca_handle": 1}]


async def test_a_claim_without_a_cgroup_has_no_rdma_usage(live: Live) -> None:
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {}])
    got = await live.call("GetRdmaUsage", path=path, interface=CLAIM_IFACE)
    assert got == ["", {}, {}]


async def test_statistics_carry_counts_errors_and_cumulative_histograms(live: Live) -> None:
    live.core.stats.claimed(0.02)
    live.core.stats.released("requested")
    live.core.stats.failed("claim", DeviceBusy.dbus_name)
    (stats,) = await live.call("GetStatistics")
    assert stats["claims"].value == 1
    assert stats["releases"].value == {"requested": 1}
    assert stats["errors"].value == [("claim", "io.rdmad1.Error.DeviceBusy", 1)]
    buckets, total, count = stats["claim_latency"].value
    assert count == 1 and total == 0.02 and buckets[-1] == (float("inf"), 1)
    assert all(n == (0 if le < 0.02 else 1) for le, n in buckets)
    assert stats["release_latency"].value[2] == 0
