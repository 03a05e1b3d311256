"""rdmactl gives up on a hung rdmad after --timeout seconds instead of waiting forever, and
on a bus that went away with one line instead of a traceback."""

from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace
from typing import Any, cast

import pytest
from dbus_fast import MessageType
from dbus_fast.aio import MessageBus

from rdmad.bus.client import Client, Unreachable
from rdmad.cli.main import cmd_monitor, parse_args


class HungBus:
    """A bus whose peer never answers, as a SIGSTOPped rdmad."""

    async def call(self, msg: Any) -> None:
        await asyncio.Event().wait()


def hung_client(timeout: float) -> Client:
    return Client(cast(MessageBus, HungBus()), timeout)


async def test_a_call_without_answer_is_unreachable_after_the_timeout() -> None:
    with pytest.raises(Unreachable, match=r"^no answer to ListDevices within 0\.05 s$"):
        await hung_client(0.05).call("ListDevices")


@pytest.mark.parametrize("member", ["Claim", "Release", "SetNetnsMode"])
async def test_a_change_without_answer_says_rdmad_may_still_carry_it_out(member: str) -> None:
    with pytest.raises(Unreachable, match="may still carry it out"):
        await hung_client(0.05).call(member)


class GoneBus:
    """A bus that went away (dbus-daemon restarted): calls and the connection end in EOF
    (rdmactl's BusConnection returns the cause from wait_for_disconnect)."""

    async def call(self, msg: Any) -> Any:
        if msg.member == "AddMatch":
            return SimpleNamespace(message_type=MessageType.METHOD_RETURN, body=[])
        raise EOFError

    def add_message_handler(self, handler: Any) -> None:
        pass

    async def wait_for_disconnect(self) -> Exception | None:
        return EOFError()  # the cause, as rdmad's BusConnection gives it


def gone_client() -> Client:
    return Client(cast(MessageBus, GoneBus()), 5)


async def test_a_call_when_the_bus_goes_away_is_unreachable() -> None:
    with pytest.raises(Unreachable, match=r"^the bus closed the connection during ListDevices$"):
        await gone_client().call("ListDevices")


async def test_monitor_ends_unreachable_when_the_bus_goes_away() -> None:
    args = parse_args(["monitor"])
    with pytest.raises(Unreachable, match=r"^the bus closed the connection$"):
        await cmd_monitor(gone_client(), args, io.StringIO())
