"""Every error name in the contract, produced by a real bad call against the real daemon.
After each, nothing moved: the devices are where they were."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from dbus_fast import Variant

from rdmad.bus.names import BUS_NAME, CLAIM_IFACE
from testbed.daemon import Client, DBusCallError, RdmadProcess
from testbed.net import ip, link
from tests.support.sim_rig import Rig, running_rig

E = "io.rdmad1.Error."


async def expect_error(rig: Rig, name: str, member: str, sig: str, *body: object) -> str:
    before = {nic: link(pair.host) for nic, pair in rig.nics.items()}
    with pytest.raises(DBusCallError) as info:
        await rig.client.manager(member, sig, *body)
    assert info.value.name == name, info.value
    assert info.value.message, "every error carries a human message"
    after = {nic: link(pair.host) for nic, pair in rig.nics.items()}
    assert after == before, "a failed call must leave every netdev as it was"
    return info.value.message


async def test_no_such_device(rig: Rig, netns: str) -> None:
    msg = await expect_error(rig, E + "NoSuchDevice", "Claim", "ssa{sv}", "mlx5_9", netns, {})
    assert "mlx5_9" in msg


async def test_get_device_of_unknown_name_is_no_such_device(rig: Rig) -> None:
    await expect_error(rig, E + "NoSuchDevice", "GetDevice", "s", "nope0")


async def test_no_such_claim(rig: Rig) -> None:
    await expect_error(rig, E + "NoSuchClaim", "Release", "s", "0123456789abcdef")


async def test_release_on_an_ended_claims_object_is_no_such_claim(rig: Rig, netns: str) -> None:
    path = await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
    await rig.client.call_raw(BUS_NAME, path, CLAIM_IFACE, "Release")
    with pytest.raises(DBusCallError) as info:
        await rig.client.call_raw(BUS_NAME, path, CLAIM_IFACE, "Release")
    assert info.value.name == E + "NoSuchClaim", info.value
    assert path in info.value.message


async def test_device_busy(rig: Rig, netns: str) -> None:
    await rig.client.manager("Claim", "ssa{sv}", "sim0", netns, {})
    other = f"{netns}x"
    ip("netns", "add", other)
    try:
        await expect_error(rig, E + "DeviceBusy", "Claim", "ssa{sv}", "sim0", other, {})
    finally:
        ip("netns", "del", other, check=False)


@pytest.mark.parametrize(
    "spec",
    [
        "pid:{daemon}",
        "/proc/self/ns/net",
        "/etc/hostname",
        "/tmp",
        "no-such-netns",
        "pid:0",
        "../etc/passwd",
        "/proc/{daemon}/ns/ipc",
    ],
)
async def test_invalid_netns(rig: Rig, spec: str) -> None:
    assert rig.daemon.proc is not None
    named = spec.format(daemon=rig.daemon.proc.pid)
    await expect_error(rig, E + "InvalidNetns", "Claim", "ssa{sv}", "sim0", named, {})


async def test_invalid_netns_for_a_fifo(rig: Rig) -> None:
    with tempfile.TemporaryDirectory() as d:
        fifo = Path(d) / "fifo"
        os.mkfifo(fifo)
        await expect_error(rig, E + "InvalidNetns", "Claim", "ssa{sv}", "sim0", str(fifo), {})


async def test_not_supported_shared_claim_in_exclusive_mode(exclusive_rig: Rig, netns: str) -> None:
    await expect_error(
        exclusive_rig,
        E + "NotSupported",
        "Claim",
        "ssa{sv}",
        "sim0",
        netns,
        {"shared": Variant("b", True)},
    )


async def test_not_supported_rdma_only_claim_in_shared_mode(rig: Rig, netns: str) -> None:
    await expect_error(
        rig, E + "NotSupported", "Claim", "ssa{sv}", "sim0", netns, {"netdev": Variant("b", False)}
    )


async def test_mode_busy_while_other_netns_exist(rig: Rig, netns: str) -> None:
    msg = await expect_error(rig, E + "ModeBusy", "SetNetnsMode", "s", "exclusive")
    assert "namespace" in msg
    assert await rig.client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "shared"


async def test_unavailable_without_an_rdma_subsystem(
    bus_address: str, tmp_path: Path, netns: str
) -> None:
    # This host's kernel has no RDMA: the real (non-simulated) backend finds none.
    daemon = RdmadProcess(bus_address, tmp_path)
    await daemon.start()
    client = await Client.connect(bus_address)
    try:
        assert await client.prop("/io/rdmad1", "io.rdmad1.Manager", "NetnsMode") == "unavailable"
        assert await client.manager("ListDevices") == []
        with pytest.raises(DBusCallError) as info:
            await client.manager("SetNetnsMode", "s", "exclusive")
        assert info.value.name == E + "Unavailable"
    finally:
        client.close()
        await daemon.kill()


async def test_kernel_error_names_errno(rig: Rig, netns: str) -> None:
    # A macvlan child may not have a larger MTU than its parent: the kernel says EINVAL.
    msg = await expect_error(
        rig,
        E + "KernelError",
        "Claim",
        "ssa{sv}",
        "sim0",
        netns,
        {"shared": Variant("b", True), "mtu": Variant("u", 9000)},
    )
    assert "EINVAL" in msg
    assert link("net1", netns) is None, "no half-made child is left in the netns"


@pytest.mark.parametrize(
    "options",
    [
        {"colour": Variant("s", "red")},
        {"mtu": Variant("s", "1500")},
        {"mtu": Variant("u", 10)},
        {"ifname": Variant("s", "x" * 16)},
        {"ifname": Variant("s", "a/b")},
        {"addresses": Variant("as", ["not-an-ip"])},
        {"chardevs": Variant("as", ["gpu"])},
        {"owner": Variant("s", "o" * 257)},
    ],
)
async def test_invalid_args(rig: Rig, netns: str, options: dict[str, Variant]) -> None:
    await expect_error(
        rig, "org.freedesktop.DBus.Error.InvalidArgs", "Claim", "ssa{sv}", "sim0", netns, options
    )


async def test_invalid_mode_name_is_invalid_args(rig: Rig) -> None:
    await expect_error(
        rig, "org.freedesktop.DBus.Error.InvalidArgs", "SetNetnsMode", "s", "promiscuous"
    )


async def test_daemon_survives_every_error(bus_address: str, tmp_path: Path, netns: str) -> None:
    async with running_rig(bus_address, tmp_path) as rig:
        for name in ("x", "", "\u00e9" * 300):
            with pytest.raises(DBusCallError):
                await rig.client.manager("Claim", "ssa{sv}", name, netns, {})
        assert rig.daemon.proc is not None and rig.daemon.proc.returncode is None
        assert len(await rig.client.manager("ListDevices")) == 2
