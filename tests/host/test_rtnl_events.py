"""RtnlEventSource against real link and netns changes. Subscribe first, act, then wait."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

import pytest

from rdmad.core.events import Event, LinkChanged, LinkRemoved, NetnsGone, Resync
from rdmad.kernel.netns import KernelNetnsResolver
from rdmad.kernel.rtnl import RtnlBackend
from rdmad.kernel.rtnl_events import RtnlEventSource
from testbed.net import ip, queue_sink, run, temp_netns, unique_name, wait_for

pytestmark = pytest.mark.usefixtures("root")  # each test makes links or netns


@pytest.fixture
async def events() -> AsyncIterator[asyncio.Queue[Event]]:
    queue: asyncio.Queue[Event] = asyncio.Queue()
    source = RtnlEventSource()
    await source.start(queue_sink(queue))
    try:
        yield queue
    finally:
        await source.stop()


async def test_new_veth_emits_link_changed_with_kind(events: asyncio.Queue[Event]) -> None:
    a, b = unique_name("ev"), unique_name("ev")
    await run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
    try:
        ev = await wait_for(events, lambda e: isinstance(e, LinkChanged) and e.netdev.name == a)
        assert isinstance(ev, LinkChanged) and ev.netdev.kind == "veth"
    finally:
        await run(["ip", "link", "del", a])


async def test_deleted_link_emits_link_removed(events: asyncio.Queue[Event]) -> None:
    a, b = unique_name("ev"), unique_name("ev")
    await run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
    await run(["ip", "link", "del", a])
    await wait_for(events, lambda e: isinstance(e, LinkRemoved) and e.name == a)


async def test_move_into_netns_emits_link_removed(events: asyncio.Queue[Event]) -> None:
    a, b = unique_name("ev"), unique_name("ev")
    with temp_netns() as ns:
        await run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        try:
            await run(["ip", "link", "set", b, "netns", ns])
            await wait_for(events, lambda e: isinstance(e, LinkRemoved) and e.name == b)
        finally:
            await run(["ip", "link", "del", a])


async def test_netns_deletion_emits_netns_gone(
    events: asyncio.Queue[Event], resolver: KernelNetnsResolver, rtnl: RtnlBackend
) -> None:
    with temp_netns() as ns, resolver.open(ns) as target:
        nsid = await rtnl.nsid(target)
    # temp_netns deleted it; the kernel drops the nsid once the netns is freed
    await wait_for(events, lambda e: e == NetnsGone(nsid))


async def test_overrun_emits_resync_and_keeps_going(monkeypatch: pytest.MonkeyPatch) -> None:
    queue: asyncio.Queue[Event] = asyncio.Queue()
    # the kernel doubles it: a couple of messages
    monkeypatch.setattr(RtnlEventSource, "RCVBUF", 1024)
    source = RtnlEventSource()
    await source.start(queue_sink(queue))
    names = [unique_name("eo") for _ in range(8)]
    try:
        # Blocking the loop on purpose: the reader cannot drain while the kernel queues
        # 16 RTM_NEWLINKs into a ~2 KiB buffer, so the socket must overrun.
        subprocess.run(  # noqa: ASYNC221 - blocking is the point here
            ["ip", "-batch", "-"],
            input="".join(f"link add {n} type veth peer name {n}p\n" for n in names),
            text=True,
            check=True,
        )
        await wait_for(queue, lambda e: e == Resync("rtnl"))
        await run(["ip", "link", "del", names[0]])
        await wait_for(queue, lambda e: isinstance(e, LinkRemoved) and e.name == names[0])
    finally:
        await source.stop()
        for n in names:  # names[0] is gone unless the test failed early
            ip("link", "del", n, check=False)
