"""policyRouting: the IPAM routes go in the claim's own table, looked up from the claim's
addresses, instead of the pod's main table (several rails in one pod)."""

from __future__ import annotations

import json

from testbed.net import ip
from tests.cni.conftest import CniRig, FakeIpam

ROUTES = [{"dst": "10.67.0.0/16", "gw": "10.66.0.1"}]


def table(netns: str, number: int) -> list[tuple[str, str, str]]:
    shown = json.loads(ip("-j", "route", "show", "table", str(number), netns=netns))
    return sorted((r["dst"], r.get("gateway", ""), r["dev"]) for r in shown)


async def test_policy_routing_puts_the_ipam_routes_in_the_claims_table(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    ipam = fake_ipam.ipam(routes=ROUTES)
    conf = rig.conf(device="sim0", shared=True, policyRouting=True, ipam=ipam)
    assert rig.run("ADD", conf, netns, env=fake_ipam.env(rig)).code == 0
    assert table(netns, 1000) == [
        ("10.66.0.0/24", "", "net1"),
        ("10.67.0.0/16", "10.66.0.1", "net1"),
    ]
    rules = ip("rule", "show", netns=netns)
    assert "from 10.66.0.2 lookup 1000" in rules
    assert "10.67.0.0" not in ip("route", "show", netns=netns)  # not in main
    ((*_, path),) = await rig.client.manager("ListClaims")
    assert await rig.client.prop(path, "io.rdmad1.Claim", "RouteTable") == 1000
    assert rig.run("DEL", conf, netns, env=fake_ipam.env(rig)).code == 0
    assert "lookup 1000" not in ip("rule", "show", netns=netns)


async def test_without_policy_routing_the_ipam_routes_go_in_main(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf(device="sim0", shared=True, ipam=fake_ipam.ipam(routes=ROUTES))
    assert rig.run("ADD", conf, netns, env=fake_ipam.env(rig)).code == 0
    assert "10.67.0.0/16 via 10.66.0.1 dev net1" in ip("route", "show", netns=netns)
    assert "lookup 1000" not in ip("rule", "show", netns=netns)
