"""Each signal rdmad sends: from which object path, on which interface, with which body and
signature (what rdmactl monitor, rdmad-exporter and rdmad-dra read).

The ObjectManager signals' path is tested in test_service_objects.py; that no signal
costs a search of every exported object, in test_signal_cost.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dbus_fast import Message, Variant

from rdmad.bus.names import (
    CLAIM_IFACE,
    DEVICE_IFACE,
    MANAGER_IFACE,
    MANAGER_PATH,
    PROPERTIES_IFACE,
)
from rdmad.model import Gid
from tests.bus.conftest import Live
from tests.bus.fakes import MLX

DEVICE_PATH = "/io/rdmad1/device/mlx5_5f0"
CLAIM_PATH = "/io/rdmad1/claim/c1"
GID = Gid(1, 2, "fe80:0000:0000:0000:0202:c9ff:fe31:7a40", "RoCE v2", "net1")


def _signal(interface: str, member: str, path: str = MANAGER_PATH) -> Callable[[Message], bool]:
    return lambda m: m.interface == interface and m.member == member and m.path == path


def _sent(msg: Message) -> tuple[str, list[object]]:
    return msg.signature, list(msg.body)


async def _claim(live: Live) -> None:
    await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])


async def test_device_added_names_the_device_and_its_object(live: Live) -> None:
    live.core.plug(dataclasses.replace(MLX, index=2, name="mlx5_1", netdev="ens1f1"))
    msg = await live.wait_signal(_signal(MANAGER_IFACE, "DeviceAdded"))
    assert _sent(msg) == ("so", ["mlx5_1", "/io/rdmad1/device/mlx5_5f1"])


async def test_device_removed_names_the_device_and_its_object(live: Live) -> None:
    live.core.unplug("mlx5_0")
    msg = await live.wait_signal(_signal(MANAGER_IFACE, "DeviceRemoved"))
    assert _sent(msg) == ("so", ["mlx5_0", DEVICE_PATH])


async def test_claimed_names_the_claim_its_device_and_its_object(live: Live) -> None:
    await _claim(live)
    msg = await live.wait_signal(_signal(MANAGER_IFACE, "Claimed"))
    assert _sent(msg) == ("sso", ["c1", "mlx5_0", CLAIM_PATH])


async def test_released_names_the_claim_its_device_and_why(live: Live) -> None:
    await _claim(live)
    await live.call("Release", "s", ["c1"])
    msg = await live.wait_signal(_signal(MANAGER_IFACE, "Released"))
    assert _sent(msg) == ("sss", ["c1", "mlx5_0", "requested"])


async def test_a_device_sends_the_properties_that_changed_typed_as_declared(live: Live) -> None:
    await _claim(live)
    msg = await live.wait_signal(_signal(PROPERTIES_IFACE, "PropertiesChanged", DEVICE_PATH))
    assert _sent(msg) == (
        "sa{sv}as",
        [
            DEVICE_IFACE,
            {"State": Variant("s", "shared"), "Claims": Variant("ao", [CLAIM_PATH])},
            [],
        ],
    )


async def test_a_claim_sends_its_new_gids_from_its_own_object(live: Live) -> None:
    await _claim(live)
    live.core.set_gids("c1", (GID,))
    msg = await live.wait_signal(_signal(PROPERTIES_IFACE, "PropertiesChanged", CLAIM_PATH))
    row = (GID.port, GID.index, GID.gid, GID.type, GID.netdev)
    assert _sent(msg) == ("sa{sv}as", [CLAIM_IFACE, {"Gids": Variant("a(uusss)", [row])}, []])


async def test_a_mode_change_is_sent_from_the_manager(live: Live) -> None:
    await live.call("SetNetnsMode", "s", ["exclusive"])
    msg = await live.wait_signal(_signal(PROPERTIES_IFACE, "PropertiesChanged"))
    assert _sent(msg) == (
        "sa{sv}as",
        [MANAGER_IFACE, {"NetnsMode": Variant("s", "exclusive")}, []],
    )
