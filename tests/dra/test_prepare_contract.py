"""Contract tests of NodePrepareResources and NodeUnprepareResources: the kubelet's calls
(testbed/dra/kubelet.py) to the real plugin, which reads each ResourceClaim from the loopback
API server and holds its devices in a real rdmad (sim RDMA devices on real veths, a private
bus) for the pod the claim is reserved for."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

import pytest
from dbus_fast import Variant

from rdmad.dra.kube import CLAIM_READ_TIMEOUT
from rdmad.dra.offer import is_slot, slot_name
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import POD_UID
from testbed.dra.plugin_process import Plugin
from tests.dra.contract import CLAIM_IFACE, SERVICE, holds, prepare, serve
from tests.support.sim_rig import Rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

A = kubelet.Claim("default", "0b9f2c1e-1111-4c3e-9a6e-000000000001", "pod-a-rdma")
B = kubelet.Claim("default", "0b9f2c1e-2222-4c3e-9a6e-000000000002", "pod-b-rdma")


def whole(devices: dict[str, Any]) -> set[str]:
    """The whole devices offered (tests/dra/test_shared_contract.py follows the slots)."""
    return {name for name in devices if not is_slot(name)}


async def test_prepare_holds_the_device_for_the_pod_and_returns_its_cdi_device_id(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"], parameters={"interfaceName": "rdma0", "mtu": 1400})
    got = await prepare(plugin, A)
    (device,) = got[A.uid].devices
    assert got[A.uid].error == ""
    assert (device.request_names, device.pool_name, device.device_name) == (
        ["rdma"],
        "node-a",
        "sim0",
    )
    (row,) = await rig.client.manager("ListClaims")
    assert device.cdi_device_ids == [f"rdmad.io/rdma={row[0]}"]
    assert (row[1], row[3], row[4]) == ("sim0", "rdma0", f"dra/{A.uid}/sim0")
    assert await rig.client.prop(row[5], CLAIM_IFACE, "PodUid") == POD_UID
    assert await rig.client.prop(row[5], CLAIM_IFACE, "State") == "held"
    assert (rig.daemon.cdi_dir / f"rdmad.io-rdma-{row[0]}.json").exists()


async def test_a_prepared_device_leaves_the_offer(api: ApiServer, rig: Rig, plugin: Plugin) -> None:
    await api.wait_for(lambda d: whole(d) == {"sim0", "sim1"})
    serve(api, A, ["sim0"])
    await prepare(plugin, A)
    await api.wait_for(lambda d: set(d) == {"sim1", *(slot_name("sim1", i) for i in range(16))})


async def test_prepare_again_returns_the_same_devices_and_holds_nothing_more(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0", "sim1"])
    first = await prepare(plugin, A)
    again = await prepare(plugin, A)
    assert again == first
    assert len(await holds(rig)) == 2


async def test_unprepare_releases_the_holds_and_again_is_no_error(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    await prepare(plugin, A)
    endpoint = str(plugin.endpoint)
    assert await kubelet.unprepare(endpoint, SERVICE, [A]) == {A.uid: ""}
    assert await holds(rig) == []
    assert await kubelet.unprepare(endpoint, SERVICE, [A]) == {A.uid: ""}
    await api.wait_for(lambda d: whole(d) == {"sim0", "sim1"})


async def test_each_claim_of_a_call_gets_its_own_answer(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    serve(api, B, ["sim1"], allocated=False)
    got = await prepare(plugin, A, B)
    assert got[A.uid].error == "" and len(got[A.uid].devices) == 1
    assert "ResourceClaim default/pod-b-rdma is not allocated" in got[B.uid].error
    assert [h[0] for h in await holds(rig)] == ["sim0"]


def served_then_down(api: ApiServer) -> None:
    serve(api, A, ["sim0"])
    api.claims_down = True


@pytest.mark.parametrize(
    ("setup", "error"),
    [
        (lambda api: serve(api, A, ["sim0"], pool="node-b"), "is allocated to another node"),
        (lambda api: serve(api, A, ["sim0"], parameters={"mtu": 67}), "mtu 67 is out of range"),
        (lambda api: serve(api, A, ["sim7"]), "device sim7 is gone from this node"),
        (lambda api: None, "cannot read ResourceClaim default/pod-a-rdma from the API server: "),
        (served_then_down, "503"),
    ],
)
async def test_a_claim_that_cannot_be_prepared_gets_a_clear_error_and_holds_nothing(
    api: ApiServer, rig: Rig, plugin: Plugin, setup: Any, error: str
) -> None:
    setup(api)
    got = await prepare(plugin, A)
    assert error in got[A.uid].error and got[A.uid].devices == []
    assert await holds(rig) == []


async def test_a_second_claim_for_a_held_device_is_refused_naming_the_first(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    serve(api, B, ["sim0"])
    await prepare(plugin, A)
    got = await prepare(plugin, B)
    assert "rdmad cannot hold sim0" in got[B.uid].error
    assert "io.rdmad1.Error.DeviceBusy" in got[B.uid].error
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]


async def test_a_prepare_that_fails_part_way_releases_what_it_held(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    await rig.client.manager("Claim", "ssa{sv}", "sim1", netns, {})
    serve(api, A, ["sim0", "sim1"])
    got = await prepare(plugin, A)
    assert "rdmad cannot hold sim1" in got[A.uid].error
    assert [h[0] for h in await holds(rig)] == ["sim1"], "only the claim made outside is left"


async def test_a_prepare_killed_after_its_hold_is_finished_by_the_next(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    # What a plugin killed between rdmad's Hold and its reply to the kubelet leaves (its
    # label as the plugin wrote it before shared mode: dra/<claim UID>, no device).
    options = {"owner": Variant("s", f"dra/{A.uid}")}
    path = await rig.client.manager("Hold", "ssa{sv}", "sim0", POD_UID, options)
    serve(api, A, ["sim0", "sim1"])
    got = await prepare(plugin, A)
    cdi = await rig.client.prop(path, CLAIM_IFACE, "CdiDevice")
    assert got[A.uid].devices[0].cdi_device_ids == [cdi]
    assert sorted(h[0] for h in await holds(rig)) == ["sim0", "sim1"]


async def test_rdmad_down_is_the_claims_error(api: ApiServer, rig: Rig, plugin: Plugin) -> None:
    serve(api, A, ["sim0"])
    await rig.daemon.kill()
    got = await prepare(plugin, A)
    assert "rdmad is not reachable on its bus" in got[A.uid].error
    unprepared = await kubelet.unprepare(str(plugin.endpoint), SERVICE, [A])
    assert "rdmad is not reachable on its bus" in unprepared[A.uid]


async def test_a_slow_api_server_is_the_claims_error_within_the_kubelets_bound_and_then_it_prepares(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    api.stall_claims()
    start = time.monotonic()
    got = await prepare(plugin, A)  # the kubelet's own deadline bounds the call
    took = time.monotonic() - start
    assert got[A.uid].devices == []
    error = got[A.uid].error
    assert error.startswith("cannot read ResourceClaim default/pod-a-rdma from the API server: ")
    assert "the API server did not answer in time" in error
    assert f"port={urlparse(api.url).port}" in error
    assert f"read timeout={CLAIM_READ_TIMEOUT[1]}" in error
    assert CLAIM_READ_TIMEOUT[1] <= took < kubelet.DRA_CALL_TIMEOUT
    assert await holds(rig) == []
    api.answer_claims()
    again = await prepare(plugin, A)
    assert again[A.uid].error == "" and len(again[A.uid].devices) == 1
    assert await holds(rig) == [("sim0", f"dra/{A.uid}/sim0", "held")]


async def test_an_api_server_refusing_connections_is_the_claims_error_and_holds_nothing(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    serve(api, A, ["sim0"])
    with api.unreachable():
        got = await prepare(plugin, A)
    error = got[A.uid].error
    assert error.startswith("cannot read ResourceClaim default/pod-a-rdma from the API server: ")
    assert "Connection refused" in error and got[A.uid].devices == []
    assert await holds(rig) == []
