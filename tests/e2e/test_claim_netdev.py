"""A claim's netdev as the pod sees it, on the bus (Addresses, MacAddress), through the
real daemon on real netns and veths (sim RDMA): read when the claim is made, and announced
again with PropertiesChanged when the pod changes its addresses (rdmad follows the
netns's address events)."""

from __future__ import annotations

from dbus_fast import Variant

from testbed.net import ip, link
from tests.support.sim_rig import Rig

CLAIM_IFACE = "io.rdmad1.Claim"


async def claim(rig: Rig, netns: str, *cidrs: str) -> str:
    options = {"ifname": Variant("s", "rdma0"), "addresses": Variant("as", list(cidrs))}
    path: str = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, options)
    return path


async def test_a_claim_shows_its_netdevs_addresses_and_mac(rig: Rig, netns: str) -> None:
    path = await claim(rig, netns, "192.0.2.5/24")
    inside = link("rdma0", netns)
    assert inside is not None
    assert await rig.client.prop(path, CLAIM_IFACE, "Addresses") == ["192.0.2.5/24"]
    assert await rig.client.prop(path, CLAIM_IFACE, "MacAddress") == inside["address"]


async def test_an_address_the_pod_adds_is_announced(rig: Rig, netns: str) -> None:
    path = await claim(rig, netns, "192.0.2.5/24")
    mark = rig.client.mark()
    ip("addr", "add", "198.51.100.7/26", "dev", "rdma0", netns=netns)
    await rig.client.wait_property(path, "Addresses", ["192.0.2.5/24", "198.51.100.7/26"], mark)


async def test_a_held_claim_shows_no_addresses(rig: Rig) -> None:
    pod = "0f6a2c44-7d1e-4c8e-9a55-3b7e1c2d9f10"
    path = await rig.client.manager("Hold", "ssa{sv}", "sim0", pod, {})
    assert await rig.client.prop(path, CLAIM_IFACE, "Addresses") == []
    assert await rig.client.prop(path, CLAIM_IFACE, "MacAddress") == ""
