"""A dbus-fast client of io.rdmad1, for rdmactl and rdmad-exporter (the CNI plugin, a
short-lived process per pod start, is a Go binary with its own client: cni/rdmad.go)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from rdmad.bus.names import (
    BUS_NAME,
    DBUS_NAME,
    DBUS_PATH,
    MANAGER_IFACE,
    MANAGER_PATH,
    PROPERTIES_IFACE,
)

# What the bus answers when nobody serves io.rdmad1 (or the connection broke).
UNREACHABLE_ERRORS = {
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
}


class Unreachable(Exception):
    """rdmad cannot be reached: no bus, nobody owns io.rdmad1, or no reply."""


class Client:
    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus

    async def call(
        self,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        *,
        path: str = MANAGER_PATH,
        interface: str = MANAGER_IFACE,
        destination: str = BUS_NAME,
    ) -> list[Any]:
        """The reply's body; an error reply raises Unreachable or DBusError (its name)."""
        reply = await self.bus.call(
            Message(
                destination=destination,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=list(body),
            )
        )
        if reply is None:
            raise Unreachable("no reply")
        if reply.message_type is MessageType.ERROR:
            name = reply.error_name or "org.freedesktop.DBus.Error.Failed"
            text = reply.body[0] if reply.body else name
            if name in UNREACHABLE_ERRORS:
                raise Unreachable(text)
            raise DBusError(name, text)
        return list(reply.body)

    async def add_match(self, rule: str) -> None:
        """Have the bus send this connection the signals `rule` matches (AddMatch)."""
        await self.call(
            "AddMatch", "s", [rule], path=DBUS_PATH, interface=DBUS_NAME, destination=DBUS_NAME
        )

    async def get_all(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self.call(
            "GetAll", "s", [interface], path=path, interface=PROPERTIES_IFACE
        )
        return {k: v.value for k, v in props.items()}
