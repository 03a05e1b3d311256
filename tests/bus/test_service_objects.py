"""Objects, properties and signals follow the core's changes (each signal's content:
test_signals.py)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from dbus_fast import Message, Variant
from dbus_fast.errors import DBusError

from rdmad.bus.names import CLAIM_IFACE, DEVICE_IFACE, MANAGER_PATH, OBJECT_MANAGER_IFACE
from rdmad.errors import InvalidArgs
from tests.bus.conftest import Live


def _named(member: str, path: str = MANAGER_PATH) -> Callable[[Message], bool]:
    return lambda m: m.member == member and m.path == path


async def test_device_properties_have_the_contract_shapes(live: Live) -> None:
    (path,) = await live.call("GetDevice", "s", ["mlx5_0"])
    props = await live.get_all(path, DEVICE_IFACE)
    assert path == "/io/rdmad1/device/mlx5_5f0"
    assert props["Ports"] == [(1, "ACTIVE", "LINK_UP", "ens1f0")]
    assert props["NumaNode"] == 0 and props["State"] == "available" and props["Claims"] == []


async def test_claim_exports_an_object_and_announces_it(live: Live) -> None:
    opts = {"shared": Variant("b", True), "owner": Variant("s", "ctr-1")}
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", opts])
    claimed = await live.wait_signal(_named("Claimed"))
    added = await live.wait_signal(_named("InterfacesAdded"))
    props = await live.get_all(path, CLAIM_IFACE)
    assert claimed.body == ["c1", "mlx5_0", path]
    assert added.body[0] == path and CLAIM_IFACE in added.body[1]
    assert props["Owner"] == "ctr-1" and props["CharDevices"] == [
        ("/dev/infiniband/uverbs0", 231, 192)
    ]


async def test_release_on_the_claim_object_removes_it_and_says_why(live: Live) -> None:
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    await live.call("Release", path=path, interface=CLAIM_IFACE)
    released = await live.wait_signal(_named("Released"))
    removed = await live.wait_signal(_named("InterfacesRemoved"))
    assert released.body == ["c1", "mlx5_0", "requested"]
    assert removed.body == [path, [CLAIM_IFACE]]
    assert await live.call("ListClaims") == [[]]


async def test_object_manager_signals_come_from_the_manager_only(live: Live) -> None:
    # Stock dbus-fast sends them from the object's own path (tests/bus/test_dbus_fast_contract.py)
    (path,) = await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    await live.call("Release", path=path, interface=CLAIM_IFACE)
    await live.wait_signal(_named("Released"))  # sent after the claim's InterfacesRemoved
    sent = [(m.member, m.path) for m in live.signals if m.interface == OBJECT_MANAGER_IFACE]
    assert sent == [("InterfacesAdded", MANAGER_PATH), ("InterfacesRemoved", MANAGER_PATH)]


async def test_claim_fd_takes_a_netns_fd(live: Live) -> None:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        (path,) = await live.call(
            "ClaimFd", "sha{sv}", ["mlx5_0", 0, {"shared": Variant("b", True)}], unix_fds=[fd]
        )
    finally:
        os.close(fd)
    props = await live.get_all(path, CLAIM_IFACE)
    assert props["Netns"] == f"net:[{os.stat('/proc/self/ns/net').st_ino}]"
    assert props["NetnsPath"] == ""


async def test_claim_fd_without_an_fd_is_refused_and_closes_nothing(live: Live) -> None:
    # The service runs in this process: an `h` that is only a number must not close our fd.
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        with pytest.raises(DBusError) as refused:
            await live.call("ClaimFd", "sha{sv}", ["mlx5_0", fd, {}])
        os.fstat(fd)  # still open
    finally:
        os.close(fd)
    assert refused.value.type == InvalidArgs.dbus_name
    assert await live.call("ListClaims") == [[]]


async def test_get_managed_objects_lists_devices_and_claims(live: Live) -> None:
    await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    (objects,) = await live.call(
        "GetManagedObjects", path=MANAGER_PATH, interface=OBJECT_MANAGER_IFACE
    )
    assert DEVICE_IFACE in objects["/io/rdmad1/device/mlx5_5f0"]
    assert CLAIM_IFACE in objects["/io/rdmad1/claim/c1"]
