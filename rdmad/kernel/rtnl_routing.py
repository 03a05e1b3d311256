"""The rtnetlink messages of a claim's policy routing: FIB rules, routes in a table, and a
netdev's IPv4 settings (devconf), on the framing of rdmad.kernel.netlink.

A claim with a table gets, inside its netns: `from <address> lookup <table>` per address
(IPv4 and IPv6), its connected routes and its own routes in that table, and arp_ignore=1,
arp_announce=2, rp_filter=2 on its interface. All go through one in-netns NlChannel (rules
have no IFLA_TARGET_NETNSID). Numbers come from include/uapi/linux/fib_rules.h,
rtnetlink.h, if_link.h and ip.h; iproute2's `ip rule` and `ip route` are the reference.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from rdmad.kernel.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    Attrs,
    Build,
    Message,
    NetlinkError,
    attr,
    attr_nest,
    attr_u32,
    encode,
)
from rdmad.kernel.nlsocket import NlChannel
from rdmad.model import Cidr, Route

# include/uapi/linux/rtnetlink.h
RTM_SETLINK = 19
RTM_NEWROUTE = 24
RTM_DELROUTE = 25
RTM_GETROUTE = 26
RTM_NEWRULE = 32
RTM_DELRULE = 33
RTM_GETRULE = 34
RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_TABLE = 15
RT_TABLE_COMPAT = 252  # a dump's header table for an id of 256 or more
RTN_UNICAST = 1
RTPROT_STATIC = 4
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
# include/uapi/linux/fib_rules.h
FRA_SRC = 2
FRA_PRIORITY = 6
FRA_TABLE = 15
FR_ACT_TO_TBL = 1
# include/uapi/linux/if_link.h, ip.h
IFLA_AF_SPEC = 26
IFLA_INET_CONF = 1
IPV4_DEVCONF_RP_FILTER = 8
IPV4_DEVCONF_ARP_ANNOUNCE = 18
IPV4_DEVCONF_ARP_IGNORE = 19

# A multi-homed host's ARP settings on each rail: answer ARP only for an address of the
# interface asked on, announce the best local address of the target's subnet, and accept
# a packet whose source routes out of another rail (loose reverse-path filter).
RAIL_DEVCONF = {IPV4_DEVCONF_ARP_IGNORE: 1, IPV4_DEVCONF_ARP_ANNOUNCE: 2, IPV4_DEVCONF_RP_FILTER: 2}
# The rules' preference: before main (32766), after local (0); every claim's rule matches
# its own source addresses, so they can share one.
RULE_PRIORITY = 1000

_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}
_RTMSG = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, proto, scope, type, flags
_FIB_RULE_HDR = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, res1, res2, action, flags
_IFINFOMSG = struct.Struct("=BxHiII")


def _request(msg_type: int, body: bytes, flags: int = NLM_F_ACK) -> Build:
    return lambda seq: encode(msg_type, body, seq=seq, flags=flags)


def _short_table(table: int) -> int:
    """The header's u8 table field: the id when it fits, else RT_TABLE_UNSPEC (FRA_TABLE
    and RTA_TABLE carry the full u32 either way)."""
    return table if table < 256 else 0


@dataclass(frozen=True)
class Rule:
    """A FIB rule as a dump reports it: what rdmad needs to find and delete it."""

    family: int
    table: int
    priority: int
    src: bytes  # FRA_SRC, b"" for none
    src_len: int


def rule_from(msg: Message) -> Rule:
    family, _, src_len, _, table, *_ = _FIB_RULE_HDR.unpack_from(msg.payload)
    a = Attrs.parse(msg.payload[_FIB_RULE_HDR.size :])
    return Rule(
        family, a.u32(FRA_TABLE, table), a.u32(FRA_PRIORITY), a.raw.get(FRA_SRC, b""), src_len
    )


def _rule_body(family: int, table: int, priority: int, src: bytes, src_len: int) -> bytes:
    hdr = _FIB_RULE_HDR.pack(family, 0, src_len, 0, _short_table(table), 0, 0, FR_ACT_TO_TBL, 0)
    attrs = attr_u32(FRA_TABLE, table) + attr_u32(FRA_PRIORITY, priority)
    return hdr + (attr(FRA_SRC, src) if src else b"") + attrs


async def add_rule(ch: NlChannel, address: Cidr, table: int) -> None:
    """`from <address> lookup <table>` (the address alone: /32 or /128)."""
    body = _rule_body(
        _FAMILY[address.version], table, RULE_PRIORITY, address.ip.packed, address.max_prefixlen
    )
    await ch.request(_request(RTM_NEWRULE, body, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL))


async def rules(ch: NlChannel) -> list[Rule]:
    """Every FIB rule of the channel's netns, both families."""
    return [rule_from(m) for m in await _rule_dump(ch)]


async def _rule_dump(ch: NlChannel) -> list[Message]:
    body = _FIB_RULE_HDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)
    return await ch.request(_request(RTM_GETRULE, body, NLM_F_DUMP))


async def del_rule(ch: NlChannel, rule: Rule) -> None:
    """Delete `rule`; one already gone (ENOENT) is what was wanted."""
    body = _rule_body(rule.family, rule.table, rule.priority, rule.src, rule.src_len)
    try:
        await ch.request(_request(RTM_DELRULE, body))
    except NetlinkError as e:
        if e.errno != errno.ENOENT:
            raise


def _route_body(
    ifindex: int, table: int, dst: ipaddress.IPv4Network | ipaddress.IPv6Network, via: bytes
) -> bytes:
    scope = RT_SCOPE_UNIVERSE if via else RT_SCOPE_LINK
    hdr = _RTMSG.pack(
        _FAMILY[dst.version], dst.prefixlen, 0, 0, _short_table(table), RTPROT_STATIC, scope,
        RTN_UNICAST, 0,
    )  # fmt: skip
    out = hdr + attr_u32(RTA_TABLE, table) + attr_u32(RTA_OIF, ifindex)
    out += attr(RTA_DST, dst.network_address.packed) if dst.prefixlen else b""
    return out + (attr(RTA_GATEWAY, via) if via else b"")


async def add_route(ch: NlChannel, ifindex: int, table: int, route: Route) -> None:
    """A route out of `ifindex` in `table`: through route.via, or on-link without one."""
    via = route.via.packed if route.via is not None else b""
    body = _route_body(ifindex, table, route.dst, via)
    await ch.request(_request(RTM_NEWROUTE, body, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL))


def _table_of(msg: Message, table_attr: int) -> int:
    """The table a dumped route (RTA_TABLE) or rule (FRA_TABLE; fib_rule_hdr has its table
    where rtmsg has) names. The header gives an id below 256 itself, any other as
    RT_TABLE_COMPAT, and only then are the attributes parsed: most of a netns's routes are
    in local and main (a pod's claims with tables parsed every route of it)."""
    table: int = _RTMSG.unpack_from(msg.payload)[4]
    if table != RT_TABLE_COMPAT:
        return table
    return Attrs.parse(msg.payload[_RTMSG.size :]).u32(table_attr, table)


async def routes(ch: NlChannel, table: int = 0) -> list[Message]:
    """The routes of both families in `table` (0: in every table), as the kernel sends them.
    A strict socket filters the dump by RTA_TABLE; a table that does not exist is empty."""
    body = _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, _short_table(table), 0, 0, 0, 0)
    if table:
        body += attr_u32(RTA_TABLE, table)
    return await ch.request(_request(RTM_GETROUTE, body, NLM_F_DUMP))


async def free_table(ch: NlChannel, candidates: Iterable[int]) -> int:
    """The first of `candidates` (ids above 0) that no rule of the channel's netns looks up
    and that holds no route there; 0 if none. One rule dump (a netns has few rules), then
    a route dump per candidate, which the kernel filters by table: a netns's routes are in
    local and main, which these skip (one of a pod's claims read them all)."""
    looked_up = {_table_of(m, FRA_TABLE) for m in await _rule_dump(ch)}
    for table in candidates:
        if table not in looked_up and not await routes(ch, table):
            return table
    return 0


async def del_route(ch: NlChannel, msg: Message) -> None:
    """Delete a route a dump reported (its own message, sent back as RTM_DELROUTE, as `ip
    route flush` does); one already gone (ESRCH) is what was wanted."""
    try:
        await ch.request(_request(RTM_DELROUTE, msg.payload))
    except NetlinkError as e:
        if e.errno != errno.ESRCH:
            raise


async def set_rail_devconf(ch: NlChannel, ifindex: int) -> None:
    """RAIL_DEVCONF on netdev `ifindex`: IFLA_AF_SPEC/AF_INET/IFLA_INET_CONF, the netlink
    form of /proc/sys/net/ipv4/conf/<if>/ (inet_set_link_af)."""
    conf = attr_nest(IFLA_INET_CONF, (attr_u32(k, v) for k, v in RAIL_DEVCONF.items()))
    spec = attr_nest(IFLA_AF_SPEC, (attr_nest(socket.AF_INET, (conf,)),))
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, ifindex, 0, 0) + spec
    await ch.request(_request(RTM_SETLINK, body))
