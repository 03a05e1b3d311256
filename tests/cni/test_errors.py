"""Each error the spec defines, as the JSON error on stdout with a non-zero exit; a failed
ADD leaves nothing behind (no claim, no interface, no IPAM lease)."""

from __future__ import annotations

from testbed.net import ip, link, link_names, temp_netns
from tests.cni.conftest import CniRig


async def claim_count(rig: CniRig) -> int:
    return len(await rig.client.manager("ListClaims"))


async def test_without_cni_command_it_says_what_it_is_and_does_nothing(
    rig: CniRig, netns: str
) -> None:
    """As the reference plugins do (the CNI library's `about`), for a person running it."""
    done = rig.run("ADD", rig.conf(device="sim0"), netns, env={"CNI_COMMAND": None})
    assert (done.code, done.out) == (0, None)
    assert "CNI plugin rdmad" in done.stderr
    assert await claim_count(rig) == 0


async def test_unknown_cni_command_is_error_4(rig: CniRig, netns: str) -> None:
    assert rig.run("ATTACH", rig.conf(device="sim0"), netns).error == 4


async def test_invalid_ifname_is_error_4(rig: CniRig, netns: str) -> None:
    assert rig.run("ADD", rig.conf(device="sim0"), netns, ifname="a/b").error == 4


async def test_add_without_netns_is_error_4(rig: CniRig) -> None:
    assert rig.run("ADD", rig.conf(device="sim0"), "").error == 4


async def test_missing_container_id_is_error_4(rig: CniRig, netns: str) -> None:
    assert rig.run("DEL", rig.conf(device="sim0"), netns, container="").error == 4


async def test_config_that_is_not_json_is_error_6(rig: CniRig, netns: str) -> None:
    done = rig.run("ADD", b"{not json", netns)
    assert done.error == 6
    assert done.out is not None and done.out["msg"]


async def test_config_without_a_device_is_error_7(rig: CniRig, netns: str) -> None:
    assert rig.run("ADD", rig.conf(), netns).error == 7


async def test_config_naming_two_ways_to_the_device_is_error_7(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", selector={"driver": "rdmad_sim"})
    assert rig.run("ADD", conf, netns).error == 7


async def test_mtu_out_of_range_is_error_7(rig: CniRig, netns: str) -> None:
    assert rig.run("ADD", rig.conf(device="sim0", mtu=10), netns).error == 7


async def test_unknown_selector_key_is_error_7(rig: CniRig, netns: str) -> None:
    assert rig.run("ADD", rig.conf(selector={"colour": "red"}), netns).error == 7


async def test_mac_on_a_whole_device_claim_is_error_7(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", runtimeConfig={"mac": "02:00:00:00:00:01"})
    assert rig.run("ADD", conf, netns).error == 7


async def test_unsupported_cni_version_is_error_1(rig: CniRig, netns: str) -> None:
    assert rig.run("ADD", rig.conf("0.2.0", device="sim0"), netns).error == 1


async def test_error_is_the_librarys_error_document(rig: CniRig, netns: str) -> None:
    done = rig.run("ADD", rig.conf("0.4.0"), netns)
    assert done.out is not None and set(done.out) <= {"code", "msg", "details"}
    assert done.out["msg"].startswith("exactly one of device, deviceID and selector")


async def test_add_with_rdmad_stopped_is_error_11(rig: CniRig, netns: str) -> None:
    await rig.daemon.stop()
    assert rig.run("ADD", rig.conf(device="sim0"), netns).error == 11
    assert rig.leases() == set()


async def test_add_with_no_bus_is_error_11(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", busAddress="unix:path=/nonexistent/bus")
    assert rig.run("ADD", conf, netns).error == 11


async def test_del_with_rdmad_stopped_is_error_11(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0", shared=True)
    rig.run("ADD", conf, netns)
    await rig.daemon.stop()
    assert rig.run("DEL", conf, netns).error == 11


async def test_rdmad_error_is_100_up_with_its_dbus_name(rig: CniRig, netns: str) -> None:
    done = rig.run("ADD", rig.conf(device="nosuch"), netns)
    assert done.error == 101
    assert done.out is not None and "io.rdmad1.Error.NoSuchDevice" in done.out["msg"]


async def test_failed_claim_leaves_no_ipam_lease_and_no_interface(rig: CniRig, netns: str) -> None:
    conf = rig.conf(device="sim0")
    rig.run("ADD", conf, netns, container="first")
    with temp_netns("cni") as other:
        done = rig.run("ADD", conf, other, container="second")
        assert done.error == 102  # DeviceBusy: sim0 is held whole
        assert link_names(other) == {"lo"}
    assert rig.leases() == {"10.77.0.2"}
    assert await claim_count(rig) == 1


async def test_failure_after_the_claim_releases_it(rig: CniRig, netns: str) -> None:
    ip("link", "set", rig.nic("sim0"), "up")
    ipam = rig.conf()["ipam"] | {"routes": [{"dst": "10.79.0.0/16", "gw": "10.99.0.1"}]}
    done = rig.run("ADD", rig.conf(device="sim0", ipam=ipam), netns)
    assert done.error == 5  # the gateway is not on the link: ENETUNREACH
    assert await claim_count(rig) == 0
    assert link_names(netns) == {"lo"}
    assert rig.leases() == set()
    info = link(rig.nic("sim0"))
    assert info is not None and "UP" in info["flags"]


async def test_del_of_a_config_add_refused_succeeds(rig: CniRig, netns: str) -> None:
    """The runtime DELs after a failed ADD, and retries a failed DEL without end."""
    conf = rig.conf(device="sim0", runtimeConfig={"mac": "02:00:00:00:00:01"})
    assert rig.run("ADD", conf, netns).error == 7
    done = rig.run("DEL", conf, netns)
    assert (done.code, done.out) == (0, None)
