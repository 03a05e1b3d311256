"""NlChannel, the daemon's netlink request channel, against the host kernel's rtnetlink."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import subprocess
import threading
from collections.abc import Iterator

import pytest

from rdmad.kernel.netlink import NetlinkError
from rdmad.kernel.nlsocket import NlChannel, rtnl_busy
from rdmad.kernel.rtnl_msgs import (
    addr_request,
    addresses,
    dump_links,
    getlink,
    setlink,
)
from testbed.net import VethPair
from tests.support.sending_threads import SendingThreads, watched_channel

MANY = 600  # addresses: more than one dump part holds (the kernel caps a part near 32 KiB)


def _add_many_addresses(dev: str, prefix: str) -> None:
    batch = "".join(
        f"addr add {prefix}.{i // 250}.{i % 250 + 1}/32 dev {dev}\n" for i in range(MANY)
    )
    subprocess.run(["ip", "-batch", "-"], input=batch, text=True, check=True)


async def test_a_get_returns_its_one_reply(channel: NlChannel, veth: VethPair) -> None:
    assert (await getlink(channel, veth.host_ifindex())).ifname == veth.host


async def test_a_refused_request_raises_the_kernels_errno(channel: NlChannel) -> None:
    with pytest.raises(NetlinkError) as refused:
        await getlink(channel, 0x7FFFFFF0)
    assert refused.value.errno == errno.ENODEV


async def test_a_refusal_carries_the_kernels_own_words(channel: NlChannel, veth: VethPair) -> None:
    # Extended acks: what the kernel says is what an operator reads in rdmad's error.
    with pytest.raises(NetlinkError) as refused:
        await setlink(channel, veth.host_ifindex(), mtu=1 << 20)
    assert refused.value.errno == errno.EINVAL
    assert "mtu" in refused.value.extack.lower()


async def test_a_dump_in_many_parts_is_read_to_its_end(channel: NlChannel, veth: VethPair) -> None:
    _add_many_addresses(veth.host, "10.77")
    got = await addresses(channel, veth.host_ifindex())
    assert len([c for c in got if c.version == 4]) == MANY


async def test_requests_from_many_tasks_each_get_their_own_answer(
    channel: NlChannel, veth: VethPair
) -> None:
    host, peer = veth.host_ifindex(), (await getlink(channel, name=veth.peer)).index
    wanted = [veth.host if i % 2 else veth.peer for i in range(40)]
    links, dump = await asyncio.gather(
        asyncio.gather(*(getlink(channel, host if i % 2 else peer) for i in range(40))),
        dump_links(channel),
    )
    assert [m.ifname for m in links] == wanted
    assert {veth.host, veth.peer} <= {m.ifname for m in dump}


async def test_an_abandoned_dump_does_not_reach_the_next_request(
    channel: NlChannel, veth: VethPair
) -> None:
    _add_many_addresses(veth.host, "10.78")
    # A caller cancelled mid-dump leaves the dump's parts behind on the socket (and the
    # kernel refuses a second dump while one runs); stand in for it with a raw send.
    channel._sock.send(addr_request(0)(999))
    channel._sock.recv(4096)  # the first part, as a caller would have read it
    channel._dirty = True
    got = await addresses(channel, veth.host_ifindex())
    assert ipaddress.ip_interface("10.78.0.1/32") in got
    assert (await getlink(channel, veth.host_ifindex())).ifname == veth.host


@pytest.fixture
def watched() -> Iterator[tuple[NlChannel, SendingThreads]]:
    channel, sock = watched_channel()
    try:
        yield channel, sock
    finally:
        channel.close()


async def test_a_request_is_sent_from_the_event_loop_itself(
    watched: tuple[NlChannel, SendingThreads],
) -> None:
    channel, sock = watched
    assert (await getlink(channel, name="lo")).ifname == "lo"
    assert sock.senders == [threading.get_ident()]


async def test_while_a_move_is_in_flight_requests_are_sent_off_the_event_loop(
    watched: tuple[NlChannel, SendingThreads],
) -> None:
    # The kernel answers inside send(), after taking the RTNL lock a move holds.
    channel, sock = watched
    with rtnl_busy():
        assert (await getlink(channel, name="lo")).ifname == "lo"
    assert sock.senders and threading.get_ident() not in sock.senders
