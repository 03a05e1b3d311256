"""The rtnetlink messages rdmad sends and reads, on the framing of rdmad.kernel.netlink.

Requests are built from the few fields each one needs, and replies decode only what rdmad
reads: a link's index, flags, name, MTU, kind and altnames (a full decode is ~50 attributes
a netdev), an address's CIDR, a netns's nsid. Numbers come from include/uapi/linux/
rtnetlink.h, if_link.h, if_addr.h and net_namespace.h; iproute2 is the reference client.

Every request goes through an NlChannel (rdmad.kernel.nlsocket), whose sockets check GET
requests strictly (NETLINK_GET_STRICT_CHK): the kernel then filters a dump by the index in
the request, so reading one netdev's addresses costs the same on a node with 10 or 10,000.
A netns move is sent from a worker thread instead (move_link_blocking).
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import socket
import struct
from collections.abc import Iterable, Sequence
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
    attr_i32,
    attr_nest,
    attr_str,
    attr_u32,
    encode,
    iter_attrs,
)
from rdmad.kernel.nlsocket import NlChannel, open_socket, transact
from rdmad.model import Cidr, IPAddress

# include/uapi/linux/rtnetlink.h
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_SETLINK = 19
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
RTM_NEWNSID = 88
RTM_DELNSID = 89
RTM_GETNSID = 90
RTM_DELLINKPROP = 109
RTNLGRP_LINK = 1
RTNLGRP_NSID = 28
# include/uapi/linux/if_link.h
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_NET_NS_FD = 28
IFLA_EXT_MASK = 29
IFLA_TARGET_NETNSID = 46
IFLA_PROP_LIST = 52
IFLA_ALT_IFNAME = 53
IFLA_MACVLAN_MODE = 1
MACVLAN_MODE_BRIDGE = 4
RTEXT_FILTER_SKIP_STATS = 1 << 3  # no counters in GETLINK replies: nothing here reads them
IFF_UP = 1
IFF_LOWER_UP = 1 << 16  # the carrier, reported only while the netdev is up
# include/uapi/linux/if_addr.h
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_TARGET_NETNSID = 10
# include/uapi/linux/net_namespace.h
NETNSA_NSID = 1
NETNSA_FD = 3
NETNSA_NSID_NOT_ASSIGNED = -1

_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTGENMSG = struct.Struct("=Bxxx")
_U32 = struct.Struct("=I")  # family, padded to 4 as the kernel aligns it
# A move waits for RCU in the kernel (tens of ms); this only bounds a wedged kernel.
MOVE_TIMEOUT_S = 30.0

# -- replies -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """An RTM_NEWLINK/RTM_DELLINK: what rdmad reads of a netdev."""

    index: int
    flags: int  # IFF_*
    ifname: str
    mtu: int
    kind: str  # IFLA_INFO_KIND: veth, macvlan, "" for physical
    altnames: frozenset[str]
    mac: str = ""  # IFLA_ADDRESS as aa:bb:..., "" if none (a netdev of no link layer)

    @property
    def up(self) -> bool:
        return bool(self.flags & IFF_UP)

    @property
    def carrier(self) -> bool:
        return bool(self.flags & IFF_LOWER_UP)


def link_from(msg: Message) -> Link:
    _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(msg.payload)
    ifname, mtu, kind, altnames, mac = "", 0, "", frozenset[str](), ""
    for key, value in iter_attrs(msg.payload[_IFINFOMSG.size :]):
        if key == IFLA_ADDRESS:
            mac = value.hex(":")
        elif key == IFLA_IFNAME:
            ifname = _asciiz(value)
        elif key == IFLA_MTU and len(value) >= 4:
            mtu = _U32.unpack_from(value)[0]
        elif key == IFLA_LINKINFO:
            kind = Attrs.parse(value).string(IFLA_INFO_KIND)
        elif key == IFLA_PROP_LIST:
            altnames = frozenset(_asciiz(v) for k, v in iter_attrs(value) if k == IFLA_ALT_IFNAME)
    return Link(index, flags, ifname, mtu, kind, altnames, mac)


def _asciiz(value: bytes) -> str:
    return value.split(b"\0", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class Addr:
    """An RTM_NEWADDR: a netdev's address."""

    index: int
    cidr: Cidr | None  # None: neither IFA_LOCAL nor IFA_ADDRESS (never seen)


def addr_local(msg: Message) -> tuple[int, IPAddress | None]:
    """The ifindex and address of an RTM_NEWADDR/RTM_DELADDR, without the prefix length: a
    node's address events are mostly other interfaces', and this reads one in 5 us."""
    index: int = _IFADDRMSG.unpack_from(msg.payload)[4]
    raw = _local_address(msg)
    return index, None if raw is None else ipaddress.ip_address(raw)


def addr_from(msg: Message) -> Addr:
    _family, prefixlen, _flags, _scope, index = _IFADDRMSG.unpack_from(msg.payload)
    raw = _local_address(msg)
    if raw is None:
        return Addr(index, None)
    # From the packed bytes: 6 us, where ip_interface() parses its way there in 20-45.
    kind = ipaddress.IPv4Interface if len(raw) == 4 else ipaddress.IPv6Interface
    return Addr(index, kind((raw, prefixlen)))


def _local_address(msg: Message) -> bytes | None:
    a = Attrs.parse(msg.payload[_IFADDRMSG.size :])
    # IFA_LOCAL is the address itself; IFA_ADDRESS is the peer's on point-to-point links
    # and IPv6 sends only it.
    raw = a.raw.get(IFA_LOCAL) or a.raw.get(IFA_ADDRESS)
    return raw if raw is not None and len(raw) in (4, 16) else None


def nsid_from(msg: Message) -> int | None:
    """The nsid of an RTM_NEWNSID/RTM_DELNSID; None if it has none."""
    a = Attrs.parse(msg.payload[_RTGENMSG.size :])
    if NETNSA_NSID not in a:
        return None
    nsid = a.i32(NETNSA_NSID)
    return None if nsid == NETNSA_NSID_NOT_ASSIGNED else nsid


# -- request bodies ------------------------------------------------------------------------------


def _request(msg_type: int, body: bytes, flags: int = NLM_F_ACK) -> Build:
    return lambda seq: encode(msg_type, body, seq=seq, flags=flags)


def _link_body(
    index: int,
    attrs: Iterable[bytes] = (),
    *,
    up: bool | None = None,
) -> bytes:
    change = flags = 0
    if up is not None:
        change, flags = IFF_UP, IFF_UP if up else 0
    return _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, change) + b"".join(attrs)


def _link_attrs(
    *,
    ifname: str | None = None,
    mtu: int | None = None,
    net_ns_fd: int | None = None,
    target_nsid: int | None = None,
) -> list[bytes]:
    out = []
    if net_ns_fd is not None:
        out.append(attr_u32(IFLA_NET_NS_FD, net_ns_fd))
    if target_nsid is not None:
        out.append(attr_i32(IFLA_TARGET_NETNSID, target_nsid))
    if ifname is not None:
        out.append(attr_str(IFLA_IFNAME, ifname))
    if mtu is not None:
        out.append(attr_u32(IFLA_MTU, mtu))
    return out


def setlink_request(
    index: int,
    *,
    net_ns_fd: int | None = None,
    ifname: str | None = None,
    mtu: int | None = None,
    up: bool | None = None,
) -> Build:
    """One RTM_SETLINK. The kernel applies a netns move first, then MTU, then the name, then
    the admin state (do_setlink), so one message can do all four."""
    attrs = _link_attrs(ifname=ifname, mtu=mtu, net_ns_fd=net_ns_fd)
    return _request(RTM_SETLINK, _link_body(index, attrs, up=up))


def _addr_body(index: int, cidr: Cidr | None = None) -> bytes:
    if cidr is None:  # a dump: every family, filtered by index on a strict socket
        return _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, index)
    family = socket.AF_INET if cidr.version == 4 else socket.AF_INET6
    packed = cidr.ip.packed
    # IFA_LOCAL is the address itself; IFA_ADDRESS equal to it means "no peer"
    return _IFADDRMSG.pack(family, cidr.network.prefixlen, 0, 0, index) + b"".join(
        (attr(IFA_LOCAL, packed), attr(IFA_ADDRESS, packed))
    )


def _nsid_body(*attrs: bytes) -> bytes:
    return _RTGENMSG.pack(socket.AF_UNSPEC) + b"".join(attrs)


# -- requests ----------------------------------------------------------------------------------


async def setlink(
    ch: NlChannel,
    index: int,
    *,
    net_ns_fd: int | None = None,
    ifname: str | None = None,
    mtu: int | None = None,
    up: bool | None = None,
) -> None:
    await ch.request(setlink_request(index, net_ns_fd=net_ns_fd, ifname=ifname, mtu=mtu, up=up))


async def _getlink_reply(
    ch: NlChannel, index: int, name: str, target_nsid: int | None = None
) -> Message:
    """The RTM_GETLINK reply that getlink, ifindex_of and link_mac read."""
    attrs = [attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)]
    attrs += _link_attrs(ifname=None if index else name, target_nsid=target_nsid)
    (msg,) = await ch.request(_request(RTM_GETLINK, _link_body(index, attrs)))
    return msg


def _header_index(msg: Message) -> int:
    """The ifindex in a link message's header."""
    index: int = _IFINFOMSG.unpack_from(msg.payload)[2]
    return index


async def getlink(
    ch: NlChannel, index: int = 0, name: str = "", *, target_nsid: int | None = None
) -> Link:
    """One netdev, by index or else by name, in the channel's netns or the one
    `target_nsid` names; NetlinkError(ENODEV) if there is none."""
    return link_from(await _getlink_reply(ch, index, name, target_nsid))


async def ifindex_of(ch: NlChannel, name: str) -> int:
    """The index of netdev `name` in the channel's netns, from the reply's header alone (the
    whole link message takes 0.25 ms to decode); NetlinkError(ENODEV) if there is none."""
    return _header_index(await _getlink_reply(ch, 0, name))


async def link_mac(
    ch: NlChannel, index: int = 0, name: str = "", *, target_nsid: int | None = None
) -> tuple[int, str]:
    """The index and MAC (aa:bb:...; "" without one) of one netdev, found as getlink finds
    it, from the reply's header and its attributes up to the address (link_from reads all
    40 or so); NetlinkError(ENODEV) if there is none."""
    msg = await _getlink_reply(ch, index, name, target_nsid)
    for key, value in iter_attrs(msg.payload[_IFINFOMSG.size :]):
        if key == IFLA_ADDRESS:
            return _header_index(msg), value.hex(":")
    return _header_index(msg), ""


async def dump_links(ch: NlChannel) -> list[Link]:
    body = _link_body(0, [attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)])
    return [link_from(m) for m in await ch.request(_request(RTM_GETLINK, body, NLM_F_DUMP))]


async def dellink(
    ch: NlChannel, index: int, *, name: str = "", target_nsid: int | None = None
) -> None:
    """Delete a netdev, by index or else by name, in the channel's netns or the one
    `target_nsid` names."""
    attrs = _link_attrs(ifname=None if index else name, target_nsid=target_nsid)
    await ch.request(_request(RTM_DELLINK, _link_body(index, attrs)))


async def new_macvlan(
    ch: NlChannel, parent: int, ifname: str, *, net_ns_fd: int, mtu: int | None = None
) -> None:
    """A bridge-mode macvlan of `parent` (in the channel's netns), created directly in the
    netns open at `net_ns_fd`: there is no moment where it exists in the parent's. It is
    created up (as `ip link add ... up`): one request less on a claim's way, and a
    failure to bring it up fails the creation itself."""
    info = attr_nest(
        IFLA_LINKINFO,
        (
            attr_str(IFLA_INFO_KIND, "macvlan"),
            attr_nest(IFLA_INFO_DATA, (attr_u32(IFLA_MACVLAN_MODE, MACVLAN_MODE_BRIDGE),)),
        ),
    )
    attrs = _link_attrs(ifname=ifname, mtu=mtu, net_ns_fd=net_ns_fd)
    attrs += [attr_u32(IFLA_LINK, parent), info]
    flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    await ch.request(_request(RTM_NEWLINK, _link_body(0, attrs, up=True), flags))


async def del_altname(ch: NlChannel, index: int, name: str) -> None:
    prop = attr_nest(IFLA_PROP_LIST, (attr_str(IFLA_ALT_IFNAME, name),))
    await ch.request(_request(RTM_DELLINKPROP, _link_body(index, [prop])))


def addr_request(index: int, target_nsid: int | None = None) -> Build:
    """An RTM_GETADDR dump, every family, of netdev `index` (0: of every netdev), in the
    channel's netns or the one `target_nsid` names. The kernel filters it by the index
    (strict checking): it sends that netdev's messages and no others."""
    body = _addr_body(index)
    if target_nsid is not None:
        body += attr_i32(IFA_TARGET_NETNSID, target_nsid)
    return _request(RTM_GETADDR, body, NLM_F_DUMP)


async def addresses(ch: NlChannel, index: int, *, target_nsid: int | None = None) -> list[Cidr]:
    """The addresses of netdev `index`, all families, in the channel's netns or the one
    `target_nsid` names (read from here: no socket in that netns)."""
    msgs = await ch.request(addr_request(index, target_nsid))
    return [a.cidr for a in map(addr_from, msgs) if a.cidr is not None]


async def add_address(ch: NlChannel, index: int, cidr: Cidr) -> None:
    flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    await ch.request(_request(RTM_NEWADDR, _addr_body(index, cidr), flags))


async def del_address(ch: NlChannel, index: int, cidr: Cidr) -> None:
    await ch.request(_request(RTM_DELADDR, _addr_body(index, cidr)))


async def netns_nsid(ch: NlChannel, fd: int) -> int | None:
    """The nsid the channel's netns gives the netns open at `fd`; None if it has none."""
    (msg,) = await ch.request(_request(RTM_GETNSID, _nsid_body(attr_u32(NETNSA_FD, fd))))
    return nsid_from(msg)


async def assign_nsid(ch: NlChannel, fd: int) -> None:
    """Have the kernel pick an nsid for the netns open at `fd` (EEXIST if it has one)."""
    body = _nsid_body(attr_u32(NETNSA_FD, fd), attr_i32(NETNSA_NSID, NETNSA_NSID_NOT_ASSIGNED))
    await ch.request(_request(RTM_NEWNSID, body))


async def live_nsids(ch: NlChannel) -> set[int]:
    """Every nsid the channel's netns has assigned (to live netns)."""
    msgs = await ch.request(_request(RTM_GETNSID, _nsid_body(), NLM_F_DUMP))
    return {nsid for nsid in map(nsid_from, msgs) if nsid is not None}


def move_link_blocking(
    index: int,
    *,
    net_ns_fd: int,
    ifname: str | None = None,
    mtu: int | None = None,
    up: bool | None = None,
    mtu_before: int | None = None,
    via: MoveSocket | None = None,
) -> None:
    """One RTM_SETLINK that moves a netdev between netns, sent from the calling thread's
    netns on `via`, made there, or on a socket of its own: run it on a worker thread
    (rdmad.kernel.netns). `mtu` is set in the target, after the move; `mtu_before` in the
    source, before it, by a request of its own on the same socket.

    Why not on the loop: a netlink request runs in the sender's send() call, and a move
    waits there for RCU (15-25 ms here). On the loop thread that stalls every other client,
    and the move's own events pile up to be handled after it; off the loop, they are handled
    while it runs. A move is also sent from the netns it leaves, which only a thread can
    enter (netns.move_from_netns, as for an RDMA device's move); a deletion, which waits as
    long but from init_net, goes off the loop through its NlChannel (nlsocket.rtnl_busy).
    NetlinkError if the kernel refused either, or never answered."""
    builds = [setlink_request(index, net_ns_fd=net_ns_fd, ifname=ifname, mtu=mtu, up=up)]
    if mtu_before is not None:
        builds.insert(0, setlink_request(index, mtu=mtu_before))
    sock = via
    try:
        sock = sock or MoveSocket()
        sock.send(builds)
    except NetlinkError:
        raise
    except OSError as e:  # the socket itself failed, or the kernel never answered
        raise NetlinkError(e.errno or errno.ETIMEDOUT, str(e)) from e
    finally:
        if sock is not None and sock is not via:
            sock.close()


class MoveSocket:
    """A blocking rtnetlink socket for netns moves, in the netns of the thread that made
    it. One kept for the moves out of init_net (`move_link_blocking(via=...)`) spares each
    claim a socket made and closed: a closed socket frees itself through RCU, which the
    pod's next claim's move would wait for (docs/performance.md). Used by one thread at a
    time: the mover thread (rdmad.kernel.netns.move_from_netns)."""

    def __init__(self) -> None:
        self._sock = open_socket(socket.NETLINK_ROUTE, blocking=True)
        self._sock.settimeout(MOVE_TIMEOUT_S)
        # Never reused: a reply that came after its request timed out is skipped by seq.
        self._seq = itertools.count(1)

    def send(self, builds: Sequence[Build]) -> None:
        for build in builds:
            transact(self._sock, build, next(self._seq))

    def close(self) -> None:
        self._sock.close()
