"""Contract tests of shared mode: rdmad's shared limit offered as share slots (one device of
the slice per share), pods prepared on the slots of one device, each holding its own share
in rdmad, through the kubelet's calls (testbed/dra/kubelet.py) to the real plugin, with a real
rdmad (sim RDMA devices on real veths, a private bus, shared netns mode, a limit of 2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from rdmad.dra.offer import is_slot
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import POD_UID
from testbed.dra.plugin_process import Plugin, running_plugin
from tests.dra.contract import CLAIM_IFACE, SERVICE, prepare, serve
from tests.support.sim_rig import Rig, running_rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

LIMIT = 2
POD_B = "7a2d1b63-4c8e-4f1b-8d20-3e6f9c8b5d41"
A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
B = kubelet.Claim("default", "0b9f2c1e-2222-4c3e-9a6e-000000000002", "pod-b-rdma")
C = kubelet.Claim("default", "0b9f2c1e-3333-4c3e-9a6e-000000000003", "pod-c-rdma")
SIM0_SLOTS = {"sim0--share-0", "sim0--share-1"}


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path, extra=["--shared-limit", str(LIMIT)]) as r:
        yield r


def slots_of(devices: dict[str, Any], rdma: str) -> set[str]:
    return {name for name in devices if is_slot(name) and name.startswith(f"{rdma}--")}


async def holds(rig: Rig) -> list[tuple[str, bool, str, str]]:
    """rdmad's claims: (device, Shared, PodUid, owner), by owner."""
    out = []
    for row in await rig.client.manager("ListClaims"):
        shared = await rig.client.prop(row[5], CLAIM_IFACE, "Shared")
        pod = await rig.client.prop(row[5], CLAIM_IFACE, "PodUid")
        out.append((row[1], shared, pod, row[4]))
    return sorted(out, key=lambda h: h[3])


async def two_pods_share_sim0(api: ApiServer, plugin: Plugin) -> dict[str, kubelet.Prepared]:
    serve(api, A, ["sim0--share-0"])
    serve(api, B, ["sim0--share-1"], pods=(POD_B,), parameters={"shared": True})
    return await prepare(plugin, A, B)


async def test_rdmad_tells_its_shared_limit_and_a_free_device_offers_as_many_slots(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    assert await rig.client.prop("/io/rdmad1", "io.rdmad1.Manager", "SharedLimit") == LIMIT
    devices = await api.wait_for(lambda d: slots_of(d, "sim0") == SIM0_SLOTS)
    assert {"sim0", "sim1", "sim1--share-0", "sim1--share-1"} <= set(devices)
    assert devices["sim0--share-1"]["attributes"]["shared"] == {"bool": True}
    assert devices["sim0"]["attributes"]["shared"] == {"bool": False}
    assert devices["sim0--share-1"]["attributes"]["rdmaDevice"] == {"string": "sim0"}


async def test_two_pods_prepared_on_one_device_each_hold_their_own_share(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    got = await two_pods_share_sim0(api, plugin)
    assert (got[A.uid].error, got[B.uid].error) == ("", "")
    assert [d.device_name for d in got[A.uid].devices] == ["sim0--share-0"]
    assert await holds(rig) == [
        ("sim0", True, POD_UID, f"dra/{A.uid}/sim0--share-0"),
        ("sim0", True, POD_B, f"dra/{B.uid}/sim0--share-1"),
    ]
    cdi = {got[r.uid].devices[0].cdi_device_ids[0] for r in (A, B)}
    assert len(cdi) == 2, "each pod gets its own share's CDI device"
    assert await prepare(plugin, A, B) == got, "prepare again: the same answer"
    assert len(await holds(rig)) == 2


async def test_shares_free_keep_slots_offered_and_none_left_withdraws_the_free_ones(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    serve(api, A, ["sim0--share-1"])
    assert (await prepare(plugin, A))[A.uid].error == ""
    # One share of two is Kubernetes': its slot stays, the free one too; whole, it is gone.
    devices = await api.wait_for(lambda d: "sim0" not in d and "sim1" in d)
    assert slots_of(devices, "sim0") == SIM0_SLOTS
    # The last share, taken outside Kubernetes: the free slot goes, the held one stays.
    path = await rig.client.manager(
        "Claim", "ssa{sv}", "sim0", netns, {"shared": Variant("b", True)}
    )
    await api.wait_for(lambda d: slots_of(d, "sim0") == {"sim0--share-1"})
    await rig.client.manager("Release", "s", path.rsplit("/", 1)[1])
    await api.wait_for(lambda d: slots_of(d, "sim0") == SIM0_SLOTS)


async def test_unprepare_of_one_pod_releases_its_share_and_keeps_the_others(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    await two_pods_share_sim0(api, plugin)
    # The pool follows rdmad behind it: until it shows the two shares, it may still be the
    # offer from before them (sim0 whole), and releasing one leaves the same offer.
    await api.wait_for(lambda d: "sim0" not in d and slots_of(d, "sim0") == SIM0_SLOTS)
    assert await kubelet.unprepare(str(plugin.endpoint), SERVICE, [A]) == {A.uid: ""}
    assert await holds(rig) == [("sim0", True, POD_B, f"dra/{B.uid}/sim0--share-1")]
    devices = await api.wait_for(lambda d: slots_of(d, "sim0") == SIM0_SLOTS)
    assert "sim0" not in devices, "still shared: not offered whole"
    assert await kubelet.unprepare(str(plugin.endpoint), SERVICE, [B]) == {B.uid: ""}
    await api.wait_for(lambda d: "sim0" in d)


async def test_a_whole_device_allocated_while_it_has_live_shares_fails_clearly(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0--share-0"])
    await prepare(plugin, A)
    serve(api, C, ["sim0"], pods=(POD_B,))  # allocated before the offer withdrew it
    got = await prepare(plugin, C)
    assert (
        "ResourceClaim default/pod-c-rdma: device sim0 was allocated whole, but sim0 has 1 live "
        "shared claims: a whole-device hold needs it free" in got[C.uid].error
    )
    assert [h[3] for h in await holds(rig)] == [f"dra/{A.uid}/sim0--share-0"]


@pytest.mark.parametrize(
    ("devices", "parameters", "error"),
    [
        (
            ["sim0--share-0"],
            {"shared": False},
            "request 'rdma' was allocated the share slot sim0--share-0, but its parameter "
            "'shared' is false",
        ),
        (
            ["sim0--share-0", "sim0--share-1"],
            None,
            "it was allocated sim0 more than once",
        ),
    ],
)
async def test_a_claim_whose_shares_cannot_be_held_gets_its_error_and_holds_nothing(
    api: ApiServer,
    rig: Rig,
    plugin: Plugin,
    devices: list[str],
    parameters: dict[str, Any] | None,
    error: str,
) -> None:
    serve(api, A, devices, parameters=parameters)
    got = await prepare(plugin, A)
    assert f"ResourceClaim default/pod-a-rdma: {error}" in got[A.uid].error
    assert await holds(rig) == []


async def test_exclusive_mode_offers_no_slots(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    async with (
        running_rig(bus_address, tmp_path, sim_mode="exclusive") as rig,
        running_plugin(api, rig.daemon.bus_address, tmp_path / "dra"),
    ):
        devices = await api.wait_for(lambda d: {"sim0", "sim1"} <= set(d))
        assert devices["sim0"]["attributes"]["netnsMode"] == {"string": "exclusive"}
        assert set(devices) == {"sim0", "sim1"}


def shares(api: ApiServer, rdma: str) -> str | None:
    """The `shares` of the device's counter set, None for none."""
    counter_set = api.counter_sets().get(rdma)
    return counter_set["counters"]["shares"]["value"] if counter_set else None


def consumption(devices: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return list(devices[name].get("consumesCounters", []))


async def test_on_1_36_and_newer_the_whole_device_takes_all_its_slots_counters(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    devices = await api.wait_for(lambda d: slots_of(d, "sim0") == SIM0_SLOTS)
    assert shares(api, "sim0") == str(LIMIT)
    assert consumption(devices, "sim0") == [
        {"counterSet": "sim0", "counters": {"shares": {"value": str(LIMIT)}}}
    ]
    for slot in SIM0_SLOTS:
        assert consumption(devices, slot) == [
            {"counterSet": "sim0", "counters": {"shares": {"value": "1"}}}
        ]


async def test_a_share_taken_outside_kubernetes_shrinks_the_counter_set(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    await api.wait_for(lambda d: slots_of(d, "sim0") == SIM0_SLOTS)
    path = await rig.client.manager(
        "Claim", "ssa{sv}", "sim0", netns, {"shared": Variant("b", True)}
    )
    devices = await api.wait_for(lambda d: "sim0" not in d and shares(api, "sim0") == "1")
    assert len(slots_of(devices, "sim0")) == 1
    await rig.client.manager("Release", "s", path.rsplit("/", 1)[1])
    await api.wait_for(lambda d: "sim0" in d and shares(api, "sim0") == str(LIMIT))


async def test_an_api_server_before_1_36_gets_plain_slots(
    api: ApiServer, rig: Rig, tmp_path: Path
) -> None:
    api.version = (1, 35)
    async with running_plugin(api, rig.daemon.bus_address, tmp_path / "dra"):
        devices = await api.wait_for(lambda d: slots_of(d, "sim0") == SIM0_SLOTS)
    assert api.counter_sets() == {}
    assert not any("consumesCounters" in d for d in devices.values())
