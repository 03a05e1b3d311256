"""The netlink scenario's pieces that are not timings (no root, no kernel): message bytes,
the dump request, the rotation of columns, the per-message pass, pyroute2's host config."""

from __future__ import annotations

import socket
import struct
from collections import Counter

import pytest
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from bench.netlink import (
    Timed,
    Took,
    frame,
    host_config_of,
    interleaved,
    link_dump_request,
    per_message_us,
)
from rdmad.kernel.netlink import (
    NLM_F_DUMP,
    NLM_F_REQUEST,
    Attrs,
    Message,
    attr,
    attr_str,
    attr_u32,
    split,
)
from rdmad.kernel.rtnl_msgs import (
    IFA_ADDRESS,
    IFA_LOCAL,
    IFLA_EXT_MASK,
    IFLA_IFNAME,
    IFLA_MTU,
    RTEXT_FILTER_SKIP_STATS,
    RTM_GETLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
)
from rdmad.model import HostConfig


def _message(msg_type: int, body: bytes) -> bytes:
    return frame(Message(msg_type, 0, 1, 0, body))


def test_a_frame_splits_back_into_the_message_it_was_made_of() -> None:
    for payload in (b"", b"\1\2\3", b"\1\2\3\4\5\6\7\10"):  # odd lengths are padded
        msg = Message(RTM_NEWLINK, 2, 7, 99, payload)
        assert split(frame(msg)) == [msg]
    both = [Message(RTM_NEWLINK, 2, 7, 99, b"\1\2\3"), Message(RTM_NEWLINK, 0, 8, 99, b"")]
    assert split(b"".join(map(frame, both))) == both


@pytest.mark.parametrize("mask", [RTEXT_FILTER_SKIP_STATS, 0])
def test_the_link_dump_request_carries_the_ext_mask_only_when_given(mask: int) -> None:
    (req,) = split(link_dump_request(mask)(5))
    assert (req.type, req.seq) == (RTM_GETLINK, 5)
    assert req.flags == NLM_F_REQUEST | NLM_F_DUMP
    attrs = Attrs.parse(req.payload[16:])  # after the ifinfomsg
    assert (IFLA_EXT_MASK in attrs, attrs.u32(IFLA_EXT_MASK)) == (bool(mask), mask)


async def test_each_column_runs_every_round_and_takes_each_place_equally_often() -> None:
    calls: list[str] = []

    def column(name: str) -> Timed:
        async def run() -> Took:
            calls.append(name)
            return Took(float(len(calls)), 0.0)

        return run

    t = await interleaved({n: column(n) for n in "abc"}, reps=6, warmup=2)
    assert {n: len(s) for n, s in t.items()} == {"a": 6, "b": 6, "c": 6}
    assert Counter(calls) == {"a": 8, "b": 8, "c": 8}
    measured = calls[2 * 3 :]
    for position in range(3):
        assert Counter(measured[position::3]) == {"a": 2, "b": 2, "c": 2}


async def test_a_decode_pass_is_timed_per_message_and_must_decode_them_all() -> None:
    blob = b"x" * 10
    took = await per_message_us(lambda b: list(b), blob, 10)()
    assert took.wall > 0 and took.cpu >= 0
    with pytest.raises(RuntimeError, match="decoded 10 messages of 4"):
        await per_message_us(lambda b: list(b), blob, 4)()


def _link(index: int, name: str, mtu: int, flags: int) -> bytes:
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 1, index, flags, 0)
    return _message(RTM_NEWLINK, body + attr_str(IFLA_IFNAME, name) + attr_u32(IFLA_MTU, mtu))


def _addr(index: int, cidr: str, kind: int = IFA_LOCAL) -> bytes:
    address, prefixlen = cidr.split("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    packed = socket.inet_pton(family, address)
    body = struct.pack("=BBBBI", family, int(prefixlen), 0, 0, index)
    return _message(RTM_NEWADDR, body + attr(kind, packed))


def test_pyroute2s_messages_make_the_host_config_rdmad_reads() -> None:
    marshal = MarshalRtnl()
    (link,) = marshal.parse(_link(7, "eth7", 9000, 1))
    addrs = list(
        marshal.parse(
            _addr(7, "192.0.2.7/24")
            + _addr(7, "2001:db8::7/64", IFA_ADDRESS)  # IPv6 sends IFA_ADDRESS only
            + _addr(7, "fe80::7/64", IFA_ADDRESS)  # link-local: the kernel's own
            + _addr(8, "198.51.100.8/24")  # another netdev's
        )
    )
    assert host_config_of(link, addrs) == HostConfig(
        ifindex=7, name="eth7", mtu=9000, up=True, addresses=("192.0.2.7/24", "2001:db8::7/64")
    )


def test_a_link_without_iff_up_reads_as_down() -> None:
    (link,) = MarshalRtnl().parse(_link(3, "eth3", 1500, 0))
    assert host_config_of(link, []).up is False
