"""The daemon checks callers itself, on a bus that lets everything through (and has no
polkitd: only root may change state; tests/bus/test_polkit.py has polkitd)."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
from dbus_fast import Message
from dbus_fast.aio import MessageBus

from rdmad.bus.credentials import Credentials
from rdmad.bus.names import MANAGER_IFACE, MANAGER_PATH
from rdmad.bus.polkit import Action, Polkit
from rdmad.errors import AccessDenied
from testbed.bus import run_as
from tests.bus.conftest import Live

CLAIM = ("Claim", "ssa{sv}", "['mlx5_0', 'ns1', {'shared': Variant('b', True)}]")


@pytest.mark.usefixtures("root")  # run_as: a call as another uid
async def test_daemon_denies_mutating_methods_to_a_non_root_caller(live: Live) -> None:
    got = await run_as(live.address, MANAGER_PATH, MANAGER_IFACE, *CLAIM)
    assert got == "org.freedesktop.DBus.Error.AccessDenied"
    assert live.core.claims() == []


@pytest.mark.usefixtures("root")  # run_as: a call as another uid
async def test_daemon_lets_a_non_root_caller_read(live: Live) -> None:
    assert await run_as(live.address, MANAGER_PATH, MANAGER_IFACE, "ListDevices") == "ok"


class BusOfALeftCaller:
    """The bus as Credentials sees it when the caller has left before the privilege check:
    the bus daemon answers every question about it with an error."""

    def __init__(self) -> None:
        self.handlers: list[Callable[[Message], None]] = []

    def add_message_handler(self, handler: Callable[[Message], None]) -> None:
        self.handlers.append(handler)

    async def call(self, msg: Message) -> Message:
        msg.serial = 1  # as a bus numbers what it sends
        if msg.member == "AddMatch":
            return Message.new_method_return(msg)
        return Message.new_error(msg, "org.freedesktop.DBus.Error.NameHasNoOwner", "no such name")


async def test_a_caller_the_bus_daemon_cannot_identify_is_denied() -> None:
    bus = BusOfALeftCaller()
    credentials = Credentials(cast(MessageBus, bus), Polkit(cast(MessageBus, bus)))
    await credentials.start()
    call = Message(path=MANAGER_PATH, interface=MANAGER_IFACE, member="Claim", sender=":1.42")
    for handler in bus.handlers:  # as the bus does just before it dispatches the call
        handler(call)
    with pytest.raises(
        AccessDenied, match=r"io.rdmad1.claim-share: cannot identify the caller: .*NameHasNoOwner"
    ):
        await credentials.authorize(Action.CLAIM_SHARE, {})
