"""Address changes inside other netns, heard from init_net (rdmad.kernel.addr_events)."""

from __future__ import annotations

import asyncio
import ipaddress
import random
from collections.abc import AsyncIterator

import pytest

from rdmad.core.events import AddressChanged, Event
from rdmad.kernel.addr_events import AddrEventSource
from testbed.net import ip, queue_sink, temp_veth

pytestmark = pytest.mark.usefixtures("root")  # each test makes links or netns

WAIT = 10.0


@pytest.fixture
async def events() -> AsyncIterator[asyncio.Queue[Event]]:
    queue: asyncio.Queue[Event] = asyncio.Queue()
    source = AddrEventSource()
    await source.start(queue_sink(queue))
    yield queue
    await source.stop()


async def next_change(events: asyncio.Queue[Event], ifindex: int) -> AddressChanged:
    async with asyncio.timeout(WAIT):
        while True:
            event = await events.get()
            if isinstance(event, AddressChanged) and event.ifindex == ifindex:
                return event


def nsid_for(netns: str) -> int:
    """Give `netns` an nsid no other test is likely to hold (they are init_net-wide)."""
    nsid = random.randint(1000, 1 << 30)
    ip("netns", "set", netns, str(nsid))
    return nsid


def veth_in(netns: str) -> int:
    ip("link", "add", "adr0", "type", "veth", "peer", "name", "adr1", netns=netns)
    return int(ip("-o", "link", "show", "adr0", netns=netns).split(":")[0])


async def test_an_address_added_in_a_netns_with_an_nsid_is_reported_with_it(
    netns: str, events: asyncio.Queue[Event]
) -> None:
    nsid = nsid_for(netns)
    ifindex = veth_in(netns)
    ip("addr", "add", "192.0.2.10/24", "dev", "adr0", netns=netns)
    change = await next_change(events, ifindex)
    assert change == AddressChanged(nsid, ifindex, ipaddress.ip_address("192.0.2.10"), False)


async def test_an_address_removed_is_reported_too(netns: str, events: asyncio.Queue[Event]) -> None:
    nsid = nsid_for(netns)
    ifindex = veth_in(netns)
    ip("addr", "add", "192.0.2.10/24", "dev", "adr0", netns=netns)
    await next_change(events, ifindex)
    ip("addr", "del", "192.0.2.10/24", "dev", "adr0", netns=netns)
    change = await next_change(events, ifindex)
    assert change == AddressChanged(nsid, ifindex, ipaddress.ip_address("192.0.2.10"), True)


async def test_an_ipv6_address_is_reported_with_it(
    netns: str, events: asyncio.Queue[Event]
) -> None:
    nsid = nsid_for(netns)
    ifindex = veth_in(netns)
    ip("addr", "add", "2001:db8::10/64", "dev", "adr0", "nodad", netns=netns)
    change = await next_change(events, ifindex)
    assert change == AddressChanged(nsid, ifindex, ipaddress.ip_address("2001:db8::10"), False)


async def test_an_address_added_in_init_net_is_reported_without_an_nsid(
    events: asyncio.Queue[Event],
) -> None:
    with temp_veth("adr") as pair:
        ifindex = pair.host_ifindex()
        ip("addr", "add", "192.0.2.11/24", "dev", pair.host)
        change = await next_change(events, ifindex)
        address = ipaddress.ip_address("192.0.2.11")
        assert change == AddressChanged(None, ifindex, address, removed=False)
