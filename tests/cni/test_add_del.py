"""ADD and DEL as a runtime calls them: the interface, its IPAM address, and the way back."""

from __future__ import annotations

import json

from testbed.net import addresses, ip, is_up, link, link_names, netns_inode, temp_netns
from tests.cni.conftest import CLAIM_SPECS, PCI, CniRig


async def owners(rig: CniRig) -> list[str]:
    return [row[4] for row in await rig.client.manager("ListClaims")]


async def test_add_shared_puts_a_child_with_the_ipam_address_in_the_netns(
    rig: CniRig, netns: str
) -> None:
    done = rig.run("ADD", rig.conf(device="sim0", shared=True), netns)
    assert done.code == 0, done
    assert "10.77.0.2/24" in addresses("net1", netns=netns)
    info = link("net1", netns=netns)
    assert info is not None and is_up(info)
    assert await owners(rig) == ["cni/rdmanet/ctr1/net1"]


async def test_add_result_lists_interface_ips_and_routes(rig: CniRig, netns: str) -> None:
    out = rig.run("ADD", rig.conf(device="sim0", shared=True, mtu=1400), netns).out
    info = link("net1", netns=netns)
    assert info is not None
    assert out == {
        "cniVersion": "1.0.0",
        "interfaces": [
            {
                "name": "net1",
                "mac": info["address"],
                "mtu": 1400,
                "sandbox": f"/run/netns/{netns}",
            }
        ],
        "ips": [{"address": "10.77.0.2/24", "gateway": "10.77.0.1", "interface": 0}],
        "routes": [{"dst": "10.78.0.0/16"}],
    }


async def test_add_applies_ipam_routes_through_the_gateway(rig: CniRig, netns: str) -> None:
    rig.run("ADD", rig.conf(device="sim0", shared=True), netns)
    routes = json.loads(ip("-j", "route", "show", "10.78.0.0/16", netns=netns))
    assert [(r["gateway"], r["dev"]) for r in routes] == [("10.77.0.1", "net1")]


async def test_result_for_040_carries_the_ip_version(rig: CniRig, netns: str) -> None:
    out = rig.run("ADD", rig.conf("0.4.0", device="sim0", shared=True), netns).out
    assert out is not None and out["cniVersion"] == "0.4.0"
    assert out["ips"][0]["version"] == "4"


async def test_result_for_031_has_the_040_shape(rig: CniRig, netns: str) -> None:
    """Multus NetworkAttachmentDefinitions often say 0.3.1 (the sriov-cni examples do)."""
    out = rig.run("ADD", rig.conf("0.3.1", device="sim0", shared=True), netns).out
    assert out is not None and out["cniVersion"] == "0.3.1"
    assert out["ips"][0]["version"] == "4"
    assert "mtu" not in out["interfaces"][0]


async def test_result_for_110_lists_the_interface(rig: CniRig, netns: str) -> None:
    # Debian's IPAM plugins (1.1.1) speak up to 1.0.0: a 1.1.0 network goes without IPAM.
    out = rig.run("ADD", rig.conf("1.1.0", device="sim0", shared=True, ipam=None), netns).out
    assert out is not None and out["cniVersion"] == "1.1.0"
    assert [i["name"] for i in out["interfaces"]] == ["net1"]
    assert "ips" not in out  # the library leaves an empty list out


async def test_whole_device_add_moves_the_netdev_under_ifname(rig: CniRig, netns: str) -> None:
    done = rig.run("ADD", rig.conf(device="sim0"), netns)
    assert done.code == 0, done
    assert rig.nic("sim0") not in link_names()
    assert "10.77.0.2/24" in addresses("net1", netns=netns)


async def test_del_brings_a_whole_device_home_with_its_name_and_up(rig: CniRig, netns: str) -> None:
    ip("link", "set", rig.nic("sim0"), "up")
    rig.run("ADD", rig.conf(device="sim0"), netns)
    done = rig.run("DEL", rig.conf(device="sim0"), netns)
    assert done.code == 0 and done.out is None, done
    info = link(rig.nic("sim0"))
    assert info is not None and is_up(info)
    assert addresses(rig.nic("sim0")) == set()
    assert await owners(rig) == []


async def test_del_frees_the_ipam_lease(rig: CniRig, netns: str) -> None:
    rig.run("ADD", rig.conf(device="sim0", shared=True), netns)
    assert rig.leases() == {"10.77.0.2"}
    rig.run("DEL", rig.conf(device="sim0", shared=True), netns)
    assert rig.leases() == set()


async def test_del_twice_succeeds(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", shared=True)
    rig.run("ADD", conf, netns)
    assert rig.run("DEL", conf, netns).code == 0
    second = rig.run("DEL", conf, netns)
    assert (second.code, second.out) == (0, None)


async def test_del_without_add_succeeds(rig: CniRig, netns: str) -> None:
    done = rig.run("DEL", rig.conf(device="sim0", shared=True), netns)
    assert (done.code, done.out) == (0, None)


async def test_del_after_the_netns_was_deleted_succeeds(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0")
    rig.run("ADD", conf, netns)
    mark = rig.client.mark()
    ip("netns", "del", netns)
    done = rig.run("DEL", conf, "", env={"CNI_NETNS": ""})
    assert (done.code, done.out) == (0, None)
    await rig.client.wait_signal("Released", since=mark)
    assert await owners(rig) == []
    assert rig.leases() == set()


async def test_two_shared_attachments_on_one_device_are_two_claims(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", shared=True)
    rig.run("ADD", conf, netns, container="ctr1")
    with temp_netns("cni") as other:
        rig.run("ADD", conf, other, container="ctr2", ifname="net2")
        assert sorted(await owners(rig)) == ["cni/rdmanet/ctr1/net1", "cni/rdmanet/ctr2/net2"]
        rig.run("DEL", conf, netns, container="ctr1")
        assert await owners(rig) == ["cni/rdmanet/ctr2/net2"]


async def test_selector_picks_the_shared_device_with_fewest_claims(rig: CniRig, netns: str) -> None:
    conf = rig.conf(selector={"driver": "rdmad_sim"}, shared=True, ipam=None)
    rig.run("ADD", rig.conf(device="sim0", shared=True), netns, container="first")
    done = rig.run("ADD", conf, netns, container="second", ifname="net2")
    assert done.code == 0, done
    rows = await rig.client.manager("ListClaims")
    assert {r[4]: r[1] for r in rows}["cni/rdmanet/second/net2"] == "sim1"


async def test_selector_by_pci_prefix_picks_that_device(rig: CniRig, netns: str) -> None:
    rig.run("ADD", rig.conf(selector={"pciAddress": PCI["sim1"]}), netns)
    rows = await rig.client.manager("ListClaims")
    assert [r[1] for r in rows] == ["sim1"]


async def test_mac_capability_sets_the_childs_mac(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", shared=True, runtimeConfig={"mac": "02:00:00:aa:bb:cc"})
    out = rig.run("ADD", conf, netns).out
    info = link("net1", netns=netns)
    assert info is not None and info["address"] == "02:00:00:aa:bb:cc"
    assert out is not None and out["interfaces"][0]["mac"] == "02:00:00:aa:bb:cc"


async def test_cdi_spec_names_the_attachment_by_pod_and_ifname(rig: CniRig, netns: str) -> None:
    done = rig.run(
        "ADD", rig.conf(device="sim0", shared=True), netns, args="IgnoreUnknown=1;K8S_POD_NAME=web"
    )
    assert done.code == 0, done
    (spec,) = [json.loads(p.read_text()) for p in rig.daemon.cdi_dir.glob(CLAIM_SPECS)]
    assert spec["cdiVersion"] == "0.5.0"
    assert [d["name"] for d in spec["devices"]][1:] == ["web.net1"]


async def test_claim_records_the_netns_it_was_added_to(rig: CniRig, netns: str) -> None:
    rig.run("ADD", rig.conf(device="sim0", shared=True), netns)
    rows = await rig.client.manager("ListClaims")
    assert [r[2] for r in rows] == [f"net:[{netns_inode(netns)}]"]
