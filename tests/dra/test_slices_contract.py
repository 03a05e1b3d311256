"""Contract tests with a real rdmad (sim RDMA devices on real veths, a private bus):
rdmad-dra publishes the node's devices and keeps its slices current from rdmad's signals
alone. The loopback API server validates every slice it is sent (the `api` fixture)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Variant

from rdmad.dra.offer import is_slot
from testbed.dra import kubelet
from testbed.dra.apiserver import ApiServer
from testbed.dra.hotplug_rdmad import hotplug_rdmad
from testbed.dra.plugin_process import Plugin, running_plugin
from testbed.net import temp_veth
from tests.support.sim_rig import Rig, running_rig

pytestmark = pytest.mark.usefixtures("root")  # real veths

HOST_PCI = sorted(os.listdir("/sys/bus/pci/devices"))[:2]
Devices = dict[str, dict[str, Any]]


@pytest.fixture
async def rig(bus_address: str, tmp_path: Path) -> AsyncIterator[Rig]:
    # sim0 at a PCI address this host really has, so its pcieRoot comes from sysfs
    pci = {"sim0": HOST_PCI[0]} if HOST_PCI else {}
    async with running_rig(bus_address, tmp_path, pci=pci) as r:
        yield r


def names(devices: Devices) -> set[str]:
    """The whole devices offered (tests/dra/test_shared_contract.py follows the slots)."""
    return {name for name in devices if not is_slot(name)}


async def test_the_nodes_devices_appear_with_rdmads_attributes(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    devices = await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})
    attributes = devices["sim1"]["attributes"]
    assert attributes["rdmaDevice"] == {"string": "sim1"}
    assert attributes["netdev"] == {"string": rig.nic("sim1")}
    assert attributes["driver"] == {"string": "rdmad_sim"}
    assert attributes["linkLayer"] == {"string": "Ethernet"}
    assert attributes["netnsMode"] == {"string": "shared"}
    assert attributes["nodeGuid"]["string"]
    if HOST_PCI:
        sim0 = devices["sim0"]["attributes"]
        assert sim0["resource.kubernetes.io/pciBusID"] == {"string": HOST_PCI[0]}
        assert sim0["resource.kubernetes.io/pcieRoot"]["string"].startswith("pci")


async def test_a_claim_outside_kubernetes_withdraws_the_device_and_its_release_returns_it(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})
    path = await rig.client.manager(
        "Claim", "ssa{sv}", "sim0", netns, {"shared": Variant("b", True)}
    )
    await api.wait_for(lambda d: names(d) == {"sim1"})
    await rig.client.manager("Release", "s", path.rsplit("/", 1)[1])
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})


async def test_a_whole_device_claim_withdraws_it_too(
    api: ApiServer, rig: Rig, plugin: Plugin, netns: str
) -> None:
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})
    await rig.client.manager("Claim", "ssa{sv}", "sim1", netns, {})
    await api.wait_for(lambda d: names(d) == {"sim0"})


async def test_rdmad_stopped_empties_the_pool_and_back_fills_it(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})
    await rig.daemon.stop()
    await api.wait_for(lambda d: names(d) == set())
    await rig.daemon.start()
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})


async def test_the_kubelet_registering_the_plugin_again_restores_wiped_slices(
    api: ApiServer, rig: Rig, plugin: Plugin
) -> None:
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})
    with api.lock():
        api.slices.clear()  # a restarted kubelet wipes the node's slices, then registers
    await kubelet.notify_registration_status(str(plugin.registration_socket), True)
    await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})


async def test_a_hotplugged_device_is_added(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    with temp_veth("dh") as a, temp_veth("dh") as b:
        devices = [("sim0", a.host), ("sim1", b.host)]
        async with (
            hotplug_rdmad(bus_address, tmp_path, devices, unplugged={"sim1"}) as rdmad,
            running_plugin(api, bus_address, tmp_path / "dra"),
        ):
            await api.wait_for(lambda d: names(d) == {"sim0"})
            rdmad.plug("sim1")
            await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})


async def test_a_removed_device_leaves_the_offer(
    api: ApiServer, bus_address: str, tmp_path: Path
) -> None:
    with temp_veth("dh") as a, temp_veth("dh") as b:
        devices = [("sim0", a.host), ("sim1", b.host)]
        async with (
            hotplug_rdmad(bus_address, tmp_path, devices, unplugged=set()) as rdmad,
            running_plugin(api, bus_address, tmp_path / "dra"),
        ):
            await api.wait_for(lambda d: names(d) == {"sim0", "sim1"})
            rdmad.unplug("sim0")
            await api.wait_for(lambda d: names(d) == {"sim1"})
