"""A dbus-fast client of io.rdmad1, for rdmactl, rdmad-exporter and rdmad-dra (the CNI plugin, a
short-lived process per pod start, is a Go binary with its own client: cni/rdmad.go)."""

from __future__ import annotations

import asyncio
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


# Methods that change rdmad's state: one whose answer did not come may still be carried out.
CHANGES_STATE = {"Claim", "Release", "SetNetnsMode", "Hold", "Attach"}


class Client:
    """Calls on `bus`. With a `timeout`, a call without an answer within that many seconds
    raises Unreachable: a hung rdmad is unreachable, not a call that waits forever."""

    def __init__(self, bus: MessageBus, timeout: float | None = None) -> None:
        self.bus = bus
        self.timeout = timeout

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
        message = Message(
            destination=destination,
            path=path,
            interface=interface,
            member=member,
            signature=signature,
            body=list(body),
        )
        try:
            async with asyncio.timeout(self.timeout):
                reply = await self.bus.call(message)
        except TimeoutError:
            text = f"no answer to {member} within {self.timeout:g} s"
            if member in CHANGES_STATE:
                text += " (rdmad may still carry it out: list its claims and mode to see)"
            raise Unreachable(text) from None
        except (EOFError, OSError) as exc:  # how dbus-fast fails a call when the bus goes away
            raise Unreachable(f"the bus closed the connection during {member}") from exc
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
