"""rdmactl gives up on a hung rdmad after --timeout seconds instead of waiting forever."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from dbus_fast.aio import MessageBus

from rdmad.bus.client import Unreachable
from rdmad.cli import TimedClient


class HungBus:
    """A bus whose peer never answers, as a SIGSTOPped rdmad."""

    async def call(self, msg: Any) -> None:
        await asyncio.Event().wait()


def hung_client(timeout: float) -> TimedClient:
    return TimedClient(cast(MessageBus, HungBus()), timeout)


async def test_a_call_without_answer_is_unreachable_after_the_timeout() -> None:
    with pytest.raises(Unreachable, match=r"^no answer to ListDevices within 0\.05 s$"):
        await hung_client(0.05).call("ListDevices")


@pytest.mark.parametrize("member", ["Claim", "Release", "SetNetnsMode"])
async def test_a_change_without_answer_says_rdmad_may_still_carry_it_out(member: str) -> None:
    with pytest.raises(Unreachable, match="may still carry it out"):
        await hung_client(0.05).call(member)
