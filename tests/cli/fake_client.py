"""A stand-in for rdmad.bus.client.Client: canned replies by method, the calls it was made."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rdmad.bus.client import Client
from rdmad.bus.names import BUS_NAME, MANAGER_IFACE, MANAGER_PATH

Reply = list[Any] | Callable[[Sequence[Any]], list[Any]]


class FakeClient(Client):
    def __init__(self, replies: dict[str, Reply]) -> None:  # no bus: nothing is sent
        self.replies = replies
        self.calls: list[tuple[str, list[Any]]] = []

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
        self.calls.append((member, list(body)))
        reply = self.replies[member]
        return reply(body) if callable(reply) else reply
