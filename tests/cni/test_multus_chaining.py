"""Configs as Multus and chains hand them over: deviceID injected at the top level and in
runtimeConfig, the device-info file, and a prevResult from the plugins before."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.net import ip, link, link_names
from tests.cni.conftest import PCI, CniRig

SRIOV_RESULT = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "net1", "mac": "02:11:22:33:44:55", "sandbox": "SANDBOX"}],
    "ips": [{"address": "10.5.0.9/24", "interface": 0}],
    "routes": [],
}


async def claimed_devices(rig: CniRig) -> list[str]:
    return [row[1] for row in await rig.client.manager("ListClaims")]


async def test_multus_delegate_config_claims_the_device_at_deviceid(
    rig: CniRig, netns: str, tmp_path: Path
) -> None:
    info_file = tmp_path / "devinfo" / "net1.json"
    conf = rig.conf(
        deviceID=PCI["sim1"],
        runtimeConfig={"deviceID": PCI["sim1"]},
        CNIDeviceInfoFile=str(info_file),
    )
    done = rig.run("ADD", conf, netns, args="IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p")
    assert done.code == 0, done
    assert await claimed_devices(rig) == ["sim1"]
    assert rig.nic("sim1") not in link_names()


async def test_multus_device_info_file_names_the_pci_and_rdma_device(
    rig: CniRig, netns: str, tmp_path: Path
) -> None:
    info_file = tmp_path / "devinfo" / "net1.json"
    conf = rig.conf(deviceID=PCI["sim1"], CNIDeviceInfoFile=str(info_file))
    rig.run("ADD", conf, netns)
    assert json.loads(info_file.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": PCI["sim1"], "rdma-device": "sim1"},
    }


async def test_device_info_file_multus_copied_from_the_device_plugin_is_kept(
    rig: CniRig, netns: str, tmp_path: Path
) -> None:
    info_file = tmp_path / "devinfo" / "net1.json"
    info_file.parent.mkdir()
    from_dp = {"pci-address": PCI["sim1"], "pf-pci-address": "0000:5e:00.0"}
    info_file.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": from_dp}))
    conf = rig.conf(deviceID=PCI["sim1"], CNIDeviceInfoFile=str(info_file))
    assert rig.run("ADD", conf, netns).code == 0
    assert json.loads(info_file.read_text())["pci"] == from_dp


async def test_deviceid_in_runtime_config_alone_is_enough(rig: CniRig, netns: str) -> None:
    conf = rig.conf(runtimeConfig={"deviceID": PCI["sim0"]})
    assert rig.run("ADD", conf, netns).code == 0
    assert await claimed_devices(rig) == ["sim0"]


async def test_unknown_deviceid_is_no_such_device(rig: CniRig, netns: str) -> None:
    assert rig.run("ADD", rig.conf(deviceID="0000:99:00.0"), netns).error == 101


async def test_chained_add_appends_its_interface_after_prev_result(rig: CniRig, netns: str) -> None:
    prev = SRIOV_RESULT | {"interfaces": [{"name": "eth0", "sandbox": f"/run/netns/{netns}"}]}
    conf = rig.conf(device="sim0", shared=True, prevResult=prev)
    out = rig.run("ADD", conf, netns).out
    assert out is not None
    assert [i["name"] for i in out["interfaces"]] == ["eth0", "net1"]
    assert [(i["address"], i["interface"]) for i in out["ips"]] == [
        ("10.5.0.9/24", 0),
        ("10.77.0.2/24", 1),
    ]


async def test_chained_after_sriov_moves_only_the_rdma_device(
    exclusive_rig: CniRig, netns: str
) -> None:
    """As after sriov-cni moved the VF's netdev: netdev=false, exclusive mode."""
    rig = exclusive_rig
    ip("link", "set", rig.nic("sim0"), "netns", netns)  # what sriov-cni did before
    conf = rig.conf(deviceID=PCI["sim0"], netdev=False, ipam=None, prevResult=SRIOV_RESULT)
    done = rig.run("ADD", conf, netns)
    assert done.code == 0, done
    assert done.out == {k: v for k, v in SRIOV_RESULT.items() if v}  # none of its own
    assert await claimed_devices(rig) == ["sim0"]
    assert link(rig.nic("sim0"), netns=netns) is not None  # the netdev stayed with sriov-cni
    assert rig.run("DEL", conf, netns).code == 0
    assert await claimed_devices(rig) == []
