"""A signal costs the same however many objects rdmad exports: rdmad sends each from the
path it knows, and never through dbus-fast's `_interface_signal_notify`, which finds the
path by searching every exported object (rdmad/bus/signals.py).

Shown without timing: the search is recorded, here only, and must never be used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from dbus_fast import Message, Variant
from dbus_fast.service import ServiceInterface

from rdmad.bus.names import MANAGER_IFACE, MANAGER_PATH, PROPERTIES_IFACE
from rdmad.bus.service import RdmadMessageBus
from rdmad.model import Gid
from tests.bus.conftest import Live
from tests.bus.fakes import MLX

MANY = 256  # devices exported besides mlx5_0


@pytest.fixture
def searched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The members of the signals sent through dbus-fast's search of every export (sent
    on as dbus-fast would)."""
    members: list[str] = []
    stock = RdmadMessageBus._interface_signal_notify

    def recorded(
        bus: RdmadMessageBus, interface: ServiceInterface, name: str, member: str, *rest: Any
    ) -> None:
        members.append(member)
        stock(bus, interface, name, member, *rest)

    monkeypatch.setattr(RdmadMessageBus, "_interface_signal_notify", recorded)
    return members


def _last(member: str, body0: str) -> Callable[[Message], bool]:
    return lambda m: m.member == member and bool(m.body) and m.body[0] == body0


async def test_the_record_sees_dbus_fasts_own_signal_path(live: Live, searched: list[str]) -> None:
    # Without this, an empty record below could mean the record sees nothing.
    live.service.manager.emit_properties_changed({"NetnsMode": "shared"})
    await live.wait_signal(_last("PropertiesChanged", MANAGER_IFACE))
    assert searched == ["PropertiesChanged"]


async def test_no_signal_searches_the_exported_objects(live: Live, searched: list[str]) -> None:
    for i in range(MANY):
        live.core.plug(dataclasses.replace(MLX, index=100 + i, name=f"spare{i}", netdev=""))
    await live.call("Claim", "ssa{sv}", ["mlx5_0", "ns1", {"shared": Variant("b", True)}])
    live.core.set_gids("c1", (Gid(1, 2, "fe80::1", "RoCE v2", "net1"),))
    await live.call("SetNetnsMode", "s", ["exclusive"])
    await live.call("Release", "s", ["c1"])
    live.core.unplug("spare0")
    await live.wait_signal(_last("DeviceRemoved", "spare0"))  # sent last: all are in

    sent = {(m.interface, m.member, m.path) for m in live.signals}
    assert {
        (MANAGER_IFACE, "DeviceAdded", MANAGER_PATH),
        (MANAGER_IFACE, "Claimed", MANAGER_PATH),
        (PROPERTIES_IFACE, "PropertiesChanged", "/io/rdmad1/device/mlx5_5f0"),
        (PROPERTIES_IFACE, "PropertiesChanged", "/io/rdmad1/claim/c1"),
        (PROPERTIES_IFACE, "PropertiesChanged", MANAGER_PATH),
        (MANAGER_IFACE, "Released", MANAGER_PATH),
        (MANAGER_IFACE, "DeviceRemoved", MANAGER_PATH),
    } <= sent
    assert searched == []
