"""Contract tests of KEP-5004: a pod written for the Mellanox shared device plugin
(`resources.limits: rdma/hca_shared_devices_a: 1`) gets a DeviceClass with
`extendedResourceName`, and the claim the scheduler makes for it, in its exact shape
(testbed/dra/claims.py), is prepared as any: a share of a device for the pod."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes.client import V1DeviceClass

from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.claims import EXTENDED_CLASS, EXTENDED_RESOURCE, POD_UID, extended_resource_claim
from testbed.dra.plugin_process import Plugin
from tests.dra.contract import CLAIM_IFACE, prepare
from tests.support.sim_rig import Rig, running_rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

POD = "mofed-test-pod"
REF = kubelet.Claim(
    "default", "3c5e7a90-5004-4b2d-8e6f-000000005004", f"{POD}-extended-resources-x7k2p"
)


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    async with running_rig(bus_address, tmp_path, extra=["--shared-limit", "2"]) as r:
        yield r


def test_the_class_maps_the_shared_device_plugins_resource_to_share_slots() -> None:
    spec = V1DeviceClass.model_validate(EXTENDED_CLASS).spec
    assert spec is not None and spec.extended_resource_name == EXTENDED_RESOURCE
    assert spec.selectors is not None and spec.selectors[0].cel is not None
    assert 'device.attributes["rdma.rdmad.io"].shared' in spec.selectors[0].cel.expression


async def test_the_schedulers_extended_resource_claim_is_prepared_as_a_share(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    await api.wait_for(lambda d: "sim0--share-0" in d)
    api.put_claim(extended_resource_claim(REF.uid, POD, ["sim0--share-0"]))
    got = await prepare(plugin, REF)
    assert got[REF.uid].error == ""
    (device,) = got[REF.uid].devices
    assert (device.request_names, device.device_name) == (
        ["container-0-request-0"],
        "sim0--share-0",
    )
    (row,) = await rig.client.manager("ListClaims")
    assert (row[1], row[4]) == ("sim0", f"dra/{REF.uid}/sim0--share-0")
    assert await rig.client.prop(row[5], CLAIM_IFACE, "Shared") is True
    assert await rig.client.prop(row[5], CLAIM_IFACE, "PodUid") == POD_UID
