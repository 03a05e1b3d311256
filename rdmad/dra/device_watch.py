"""rdmad's devices as the plugin follows them over D-Bus: a re-read of rdmad's objects after
each signal that can change the offer, and nothing in between (no polling).

A burst of signals (a claim sends InterfacesAdded, Claimed and the device's
PropertiesChanged) costs one re-read: the watch only marks the offer stale, and the reader
re-reads once per wake-up, after the burst.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from rdmad.bus.client import Client, Unreachable
from rdmad.bus.names import (
    BUS_NAME,
    CLAIM_IFACE,
    DBUS_PATH,
    DEVICE_IFACE,
    DEVICE_PREFIX,
    MANAGER_IFACE,
    MANAGER_PATH,
    OBJECT_MANAGER_IFACE,
    name_owner_changed_rule,
)
from rdmad.dra.offer import RdmadState

log = logging.getLogger("rdmad.dra")

MATCH_RULES = (
    f"type='signal',sender='{BUS_NAME}',path_namespace='{MANAGER_PATH}'",
    name_owner_changed_rule(BUS_NAME),
)


def changes_offer(msg: Message) -> bool:
    """Whether signal `msg` can change what the node offers: rdmad came or went, a device
    came, went or changed (its State and Claims follow every claim and release, so a share
    taken or freed is one), or the netns mode changed."""
    if msg.message_type is not MessageType.SIGNAL:
        return False
    if msg.member == "NameOwnerChanged":
        return msg.path == DBUS_PATH and bool(msg.body) and msg.body[0] == BUS_NAME
    path = msg.path or ""
    if path.startswith(DEVICE_PREFIX + "/"):
        return msg.member == "PropertiesChanged"
    if path != MANAGER_PATH:
        return False
    if msg.member == "InterfacesAdded":
        return DEVICE_IFACE in msg.body[1]
    if msg.member == "InterfacesRemoved":
        return DEVICE_IFACE in msg.body[1]
    if msg.member == "PropertiesChanged":
        return msg.body[0] == MANAGER_IFACE and "NetnsMode" in msg.body[1]
    return False


class DeviceWatch:
    def __init__(self, bus: MessageBus) -> None:
        self._client = Client(bus)

    async def subscribe(self, stale: Callable[[], None]) -> None:
        """Call `stale()` on every signal that can change the offer, from now on."""

        def on_message(msg: Message) -> None:
            if changes_offer(msg):
                stale()

        self._client.bus.add_message_handler(on_message)
        for rule in MATCH_RULES:
            await self._client.add_match(rule)

    async def read(self) -> RdmadState | None:
        """rdmad's devices and claims now; None when rdmad cannot be read (not running, or
        refused)."""
        try:
            (objects,) = await self._client.call(
                "GetManagedObjects", path=MANAGER_PATH, interface=OBJECT_MANAGER_IFACE
            )
            manager = await self._client.get_all(MANAGER_PATH, MANAGER_IFACE)
        except Unreachable as e:
            log.info("rdmad is not on the bus (%s): nothing to offer", e)
            return None
        except DBusError as e:
            log.warning("rdmad cannot be read (%s: %s): nothing to offer", e.type, e.text)
            return None

        def of(iface: str) -> list[dict[str, Any]]:
            return [
                {k: v.value for k, v in ifaces[iface].items()}
                for ifaces in objects.values()
                if iface in ifaces
            ]

        return RdmadState(
            of(DEVICE_IFACE),
            of(CLAIM_IFACE),
            str(manager["NetnsMode"]),
            int(manager["SharedLimit"]),
        )
