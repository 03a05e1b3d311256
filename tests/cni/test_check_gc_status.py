"""CHECK, GC, STATUS and VERSION."""

from __future__ import annotations

from typing import Any

from testbed.net import ip, temp_netns
from tests.cni.conftest import CniRig, FakeIpam

# GC and STATUS are 1.1.0's; Debian's IPAM plugins (1.1.1) speak up to 1.0.0, so a 1.1.0
# network here goes without IPAM, or with fake_ipam.
GC_VERSION = "1.1.0"


def added(rig: CniRig, netns: str, **keys: Any) -> dict[str, Any]:
    """A shared attachment's config with ADD's result as prevResult, as CHECK gets it."""
    conf = rig.conf(device="sim0", shared=True, **keys)
    done = rig.run("ADD", conf, netns)
    assert done.code == 0 and done.out is not None, done
    return conf | {"prevResult": done.out}


async def test_version_lists_the_spec_versions_from_030(rig: CniRig) -> None:
    done = rig.run("VERSION", {"cniVersion": "1.0.0"})
    assert done.out == {
        "cniVersion": "1.1.0",
        "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }


async def test_check_at_031_is_error_1(rig: CniRig, netns: str) -> None:
    """CHECK came with 0.4.0."""
    conf = rig.conf("0.3.1", device="sim0", shared=True)
    assert rig.run("ADD", conf, netns).code == 0
    done = rig.run("CHECK", conf, netns)
    assert done.error == 1


async def test_check_passes_on_an_intact_attachment(rig: CniRig, netns: str) -> None:
    done = rig.run("CHECK", added(rig, netns), netns)
    assert (done.code, done.out) == (0, None)


async def test_check_fails_when_the_address_is_gone(rig: CniRig, netns: str) -> None:
    conf = added(rig, netns)
    ip("addr", "del", "10.77.0.2/24", "dev", "net1", netns=netns)
    done = rig.run("CHECK", conf, netns)
    assert done.error == 120
    assert done.out is not None and "10.77.0.2/24" in done.out["msg"]


async def test_check_fails_when_the_claim_is_gone(rig: CniRig, netns: str) -> None:
    conf = added(rig, netns)
    (row,) = await rig.client.manager("ListClaims")
    await rig.client.manager("Release", "s", row[0])
    assert rig.run("CHECK", conf, netns).error == 120


async def test_check_fails_when_the_interface_is_gone(rig: CniRig, netns: str) -> None:
    conf = added(rig, netns)
    ip("link", "set", "net1", "name", "other", netns=netns)
    done = rig.run("CHECK", conf, netns)
    assert done.error == 120
    assert done.out is not None and "net1" in done.out["msg"]


async def test_gc_releases_claims_not_in_valid_attachments(rig: CniRig, netns: str) -> None:
    conf = rig.conf(GC_VERSION, device="sim0", shared=True, ipam=None)
    rig.run("ADD", conf, netns, container="keep")
    with temp_netns("cni") as other:
        rig.run("ADD", conf, other, container="stale")
        gc = conf | {"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "net1"}]}
        done = rig.run("GC", gc)
        assert (done.code, done.out) == (0, None)
        rows = await rig.client.manager("ListClaims")
        assert [r[4] for r in rows] == ["cni/rdmanet/keep/net1"]


async def test_gc_keeps_attachments_listed_under_the_spec_110_key(rig: CniRig, netns: str) -> None:
    """The published 1.1.0 spec text named the list cni.dev/attachments (libcni sends both)."""
    conf = rig.conf("1.1.0", device="sim0", shared=True, ipam=None)
    rig.run("ADD", conf, netns, container="keep")
    gc = conf | {"cni.dev/attachments": [{"containerID": "keep", "ifname": "net1"}]}
    assert rig.run("GC", gc).code == 0
    rows = await rig.client.manager("ListClaims")
    assert [r[4] for r in rows] == ["cni/rdmanet/keep/net1"]


async def test_gc_frees_the_ipam_lease_of_each_attachment_it_releases(
    rig: CniRig, netns: str, fake_ipam: FakeIpam
) -> None:
    """With the IPAM plugin's DEL of that attachment, then GC forwarded to it."""
    conf = rig.conf(GC_VERSION, device="sim0", shared=True, ipam=fake_ipam.ipam())
    env = fake_ipam.env(rig)
    rig.run("ADD", conf, netns, container="keep", env=env)
    with temp_netns("cni") as other:
        rig.run("ADD", conf, other, container="stale", env=env)
        gc = conf | {"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "net1"}]}
        assert rig.run("GC", gc, env=env).code == 0
        assert fake_ipam.calls()[2] == "DEL stale"
        assert fake_ipam.verbs()[3:] == ["GC"]


async def test_gc_leaves_other_networks_and_other_owners_alone(rig: CniRig, netns: str) -> None:
    rig.run("ADD", rig.conf(device="sim0", shared=True, name="othernet", ipam=None), netns)
    await rig.client.manager("Claim", "ssa{sv}", "sim1", netns, {})
    conf = rig.conf(GC_VERSION, device="sim0", ipam=None)
    done = rig.run("GC", conf | {"cni.dev/valid-attachments": []})
    assert done.code == 0, done
    assert len(await rig.client.manager("ListClaims")) == 2


async def test_gc_before_110_is_error_1(rig: CniRig) -> None:
    """GC and STATUS came with 1.1.0 (a runtime sends neither to an older network)."""
    assert rig.run("GC", rig.conf(device="sim0") | {"cni.dev/valid-attachments": []}).error == 1


async def test_status_is_0_when_rdmad_answers(rig: CniRig) -> None:
    done = rig.run("STATUS", rig.conf(GC_VERSION, device="sim0", ipam=None))
    assert (done.code, done.out) == (0, None)


async def test_status_is_50_when_rdmad_is_stopped(rig: CniRig) -> None:
    await rig.daemon.stop()
    assert rig.run("STATUS", rig.conf(GC_VERSION, device="sim0", ipam=None)).error == 50
