"""The IPAM plugin as the spec's delegation protocol (section 4) runs it, shown with
fake_ipam: its stderr, its failures, and the verbs forwarded to it."""

from __future__ import annotations

import json

from testbed.net import ip, temp_netns
from tests.cni.conftest import CniRig, FakeIpam


async def test_ipam_stderr_reaches_the_runtime(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf(device="sim0", shared=True, ipam=fake_ipam.ipam(stderr="lease noted\n"))
    done = rig.run("ADD", conf, netns, env=fake_ipam.env(rig))
    assert done.code == 0, done
    assert "lease noted" in done.stderr


async def test_failed_ipam_add_is_followed_by_its_del(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf(device="sim0", shared=True, ipam=fake_ipam.ipam(fail=["ADD"]))
    done = rig.run("ADD", conf, netns, env=fake_ipam.env(rig))
    assert done.error == 11  # the IPAM plugin's own code
    assert fake_ipam.calls() == ["ADD ctr1", "DEL ctr1"]


async def test_del_releases_the_claim_when_ipam_del_fails(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf(device="sim0", shared=True, ipam=fake_ipam.ipam(fail=["DEL"]))
    assert rig.run("ADD", conf, netns, env=fake_ipam.env(rig)).code == 0
    done = rig.run("DEL", conf, netns, env=fake_ipam.env(rig))
    assert done.error == 11  # reported, so that the runtime calls DEL again
    assert await rig.client.manager("ListClaims") == []


async def test_gc_goes_on_past_a_failure_and_reports_it(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf("1.1.0", device="sim0", shared=True, ipam=fake_ipam.ipam(fail=["DEL stale1"]))
    with temp_netns("cni") as other:
        for container, ns in (("stale1", netns), ("stale2", other)):
            assert rig.run("ADD", conf, ns, container=container, env=fake_ipam.env(rig)).code == 0
        done = rig.run("GC", conf | {"cni.dev/valid-attachments": []}, env=fake_ipam.env(rig))
        assert done.error == 11
        assert await rig.client.manager("ListClaims") == []
        assert "DEL stale2" in fake_ipam.calls()


async def test_gc_at_110_is_forwarded_to_the_ipam_plugin(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf("1.1.0", device="sim0", shared=True, ipam=fake_ipam.ipam())
    done = rig.run("GC", conf | {"cni.dev/valid-attachments": []}, env=fake_ipam.env(rig))
    assert (done.code, fake_ipam.verbs()) == (0, ["GC"])


async def test_status_at_110_fails_with_the_ipam_plugins_error(
    rig: CniRig, fake_ipam: FakeIpam
) -> None:
    conf = rig.conf("1.1.0", device="sim0", ipam=fake_ipam.ipam(fail=["STATUS"]))
    done = rig.run("STATUS", conf, env=fake_ipam.env(rig))
    assert done.error == 11
    assert done.out is not None and "IPAM fake-ipam" in done.out["msg"]


async def test_ipam_route_at_110_gets_its_table_and_priority(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    routes = [{"dst": "10.67.0.0/16", "table": 100, "priority": 7}]
    conf = rig.conf("1.1.0", device="sim0", shared=True, ipam=fake_ipam.ipam(routes=routes))
    assert rig.run("ADD", conf, netns, env=fake_ipam.env(rig)).code == 0
    (route,) = json.loads(ip("-j", "route", "show", "table", "100", netns=netns))
    assert (route["dst"], route["dev"], route["metric"]) == ("10.67.0.0/16", "net1", 7)
