"""Fixtures for bus-edge tests: the service in-process on a private bus, over FakeCore."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from rdmad.bus.names import BUS_NAME, MANAGER_IFACE, MANAGER_PATH, PROPERTIES_IFACE
from rdmad.bus.polkit import AUTHORIZATION_TIMEOUT
from rdmad.bus.service import Service, connect_bus, start_service
from testbed.bus import PrivateBus, policy_bus, private_bus  # noqa: F401
from tests.bus.fakes import FakeCore, fake_resolver

WAIT = 5.0


@dataclass
class Live:
    address: str
    core: FakeCore
    service: Service
    client: MessageBus
    signals: list[Message]
    _arrived: asyncio.Event

    async def call(
        self,
        member: str,
        signature: str = "",
        body: list[Any] | None = None,
        *,
        path: str = MANAGER_PATH,
        interface: str = MANAGER_IFACE,
        unix_fds: list[int] | None = None,
    ) -> list[Any]:
        """Call io.rdmad1; raises DBusError with the reply's error name."""
        reply = await self.client.call(
            Message(
                destination=BUS_NAME,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=body or [],
                unix_fds=unix_fds or [],
            )
        )
        assert reply is not None
        if reply.message_type is MessageType.ERROR:
            raise DBusError(reply.error_name or "", reply.body[0] if reply.body else "")
        return list(reply.body)

    async def get_all(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self.call(
            "GetAll", "s", [interface], path=path, interface=PROPERTIES_IFACE
        )
        return {k: v.value for k, v in props.items()}

    async def wait_signal(self, match: Callable[[Message], bool]) -> Message:
        """The first signal (already received or to come) that matches; no sleeps."""
        async with asyncio.timeout(WAIT):
            while True:
                for msg in self.signals:
                    if match(msg):
                        return msg
                self._arrived.clear()
                await self._arrived.wait()


async def start_live(
    address: str, authorization_timeout: float = AUTHORIZATION_TIMEOUT
) -> AsyncIterator[Live]:
    """rdmad's bus edge serving FakeCore on the bus at `address`, plus a client (root)."""
    core = FakeCore()
    server = await connect_bus(address)
    service = await start_service(server, core, fake_resolver(), authorization_timeout)
    client = await MessageBus(bus_address=address, negotiate_unix_fd=True).connect()
    signals: list[Message] = []
    arrived = asyncio.Event()

    def on_message(msg: Message) -> None:
        if msg.message_type is MessageType.SIGNAL and (msg.path or "").startswith(MANAGER_PATH):
            signals.append(msg)
            arrived.set()

    client.add_message_handler(on_message)
    rule = f"type='signal',sender='{BUS_NAME}'"
    await client.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[rule],
        )
    )
    try:
        yield Live(address, core, service, client, signals, arrived)
    finally:
        client.disconnect()
        await service.stop()
        server.disconnect()


@pytest.fixture
async def live(private_bus: PrivateBus) -> AsyncIterator[Live]:  # noqa: F811
    """rdmad's bus edge serving FakeCore on the permissive private bus, plus a client."""
    async for value in start_live(private_bus.address):
        yield value


@pytest.fixture
async def live_policy(policy_bus: PrivateBus) -> AsyncIterator[Live]:  # noqa: F811
    """As `live`, on the bus that enforces the shipped dbus/io.rdmad1.conf."""
    async for value in start_live(policy_bus.address):
        yield value
