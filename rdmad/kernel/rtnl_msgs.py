"""Lean rtnetlink messages for the claim and release hot paths.

pyroute2 decodes every attribute of an RTM_NEWLINK into objects: ~50 per netdev, about
150 us a message on these hosts, where rdmad reads four (name, MTU, kind, altnames). A
claim or release parses several link messages (its own requests and the events its move
causes) while the caller waits, so rdmad's sockets decode links as `LinkMsg`: the header
fields through pyroute2's own decode, the four attributes read straight from the buffer,
the rest skipped. Addresses decode the same way (`AddrMsg`). Requests are built here as
raw messages too, since pyroute2's high-level API spends more building a request (filters,
defaults) than the kernel spends answering it. They go through any `Requester`: rdmad
sends them on an NlSocket (`rtnl_channel`). A netns move is sent from a worker thread
instead (move_link_blocking).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Iterator
from typing import Any

from pyroute2 import AsyncIPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETNSID,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWNSID,
    RTM_SETLINK,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.nsidmsg import nsidmsg

from rdmad.kernel.nlsock import NlSocket, Requester

# include/uapi/linux/if_link.h
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFLA_PROP_LIST = 52
IFLA_ALT_IFNAME = 53
# include/uapi/linux/if_addr.h
IFA_ADDRESS = 1
IFA_LOCAL = 2
RTEXT_FILTER_SKIP_STATS = 1 << 3  # no counters in GETLINK replies: nothing here reads them
NSID_NOT_ASSIGNED = 0xFFFFFFFF  # NETNSA_NSID -1, as the u32 pyroute2 decodes
# include/uapi/linux/netlink.h: the top two bits of nla_type are flags
_NLA_TYPE_MASK = 0x3FFF
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLMSG_ERROR = 2
# A move waits for RCU in the kernel (tens of ms); this only bounds a wedged kernel.
MOVE_TIMEOUT_S = 30.0

Cidr = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _attrs(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each netlink attribute in data[start:end]."""
    while start + 4 <= end:
        length, kind = _NLA.unpack_from(data, start)
        if length < 4 or start + length > end:
            return  # malformed: stop rather than read another attribute's bytes
        yield kind & _NLA_TYPE_MASK, start + 4, start + length
        start += (length + 3) & ~3


def _asciiz(data: bytes, start: int, end: int) -> str:
    return bytes(data[start:end]).split(b"\0", 1)[0].decode(errors="replace")


class LinkMsg(ifinfmsg):  # type: ignore[misc]  # pyroute2 is untyped
    """An RTM_NEWLINK/RTM_DELLINK with only what rdmad reads decoded. `msg["index"]`,
    `msg["flags"]` and `msg["header"]` are pyroute2's; the attributes are fields."""

    ifname: str = ""
    mtu: int = 0
    kind: str = ""  # IFLA_INFO_KIND: veth, macvlan, "" for physical
    altnames: frozenset[str] = frozenset()

    def decode_nlas(self, offset: int) -> None:
        data, end = self.data, self.offset + self.length
        for kind, start, stop in _attrs(data, offset, end):
            if kind == IFLA_IFNAME:
                self.ifname = _asciiz(data, start, stop)
            elif kind == IFLA_MTU and stop - start >= 4:
                self.mtu = _U32.unpack_from(data, start)[0]
            elif kind == IFLA_LINKINFO:
                for sub, s, e in _attrs(data, start, stop):
                    if sub == IFLA_INFO_KIND:
                        self.kind = _asciiz(data, s, e)
            elif kind == IFLA_PROP_LIST:
                self.altnames = frozenset(
                    _asciiz(data, s, e)
                    for sub, s, e in _attrs(data, start, stop)
                    if sub == IFLA_ALT_IFNAME
                )


class AddrMsg(ifaddrmsg):  # type: ignore[misc]  # pyroute2 is untyped
    """An RTM_NEWADDR with only the address decoded, as LinkMsg for links: pyroute2's full
    decode (cache info, flags, label) costs ~0.1 ms an address where rdmad reads one."""

    local: str = ""  # IFA_LOCAL: the address itself
    address: str = ""  # IFA_ADDRESS: the peer's on point-to-point links, else the same

    def decode_nlas(self, offset: int) -> None:
        data, end = self.data, self.offset + self.length
        for kind, start, stop in _attrs(data, offset, end):
            if kind in (IFA_LOCAL, IFA_ADDRESS) and stop - start in (4, 16):
                text = str(ipaddress.ip_address(bytes(data[start:stop])))
                if kind == IFA_LOCAL:
                    self.local = text
                else:
                    self.address = text


def lean_links(ipr: AsyncIPRoute) -> AsyncIPRoute:
    """Make `ipr` decode link messages as LinkMsg (pyroute2's per-socket policy map)."""
    ipr.register_policy({RTM_NEWLINK: LinkMsg, RTM_DELLINK: LinkMsg})
    return ipr


RTNL_DECODERS: dict[int, type[Any]] = {
    RTM_NEWLINK: LinkMsg,
    RTM_DELLINK: LinkMsg,
    RTM_NEWADDR: AddrMsg,
    RTM_DELADDR: AddrMsg,
    RTM_NEWNSID: nsidmsg,
}


def rtnl_channel(sock: socket.socket) -> NlSocket:
    """Requests on `sock` (a NETLINK_ROUTE socket, in whatever netns it was made in);
    `sock` is closed if the channel cannot be set up on it."""
    try:
        return NlSocket(sock, RTNL_DECODERS)
    except BaseException:
        sock.close()
        raise


def link_request(index: int = 0, *attrs: tuple[str, Any], up: bool | None = None) -> ifinfmsg:
    """An ifinfmsg for RTM_GETLINK/SETLINK/DELLINK: by index, or by IFLA_IFNAME if 0."""
    msg = ifinfmsg()
    msg["index"] = index
    msg["attrs"] = list(attrs)
    if up is not None:
        msg["change"] = 1  # IFF_UP
        msg["flags"] = 1 if up else 0
    return msg


def addr_request(index: int = 0, cidr: Cidr | None = None) -> ifaddrmsg:
    """An ifaddrmsg: for RTM_GETADDR dumps (all families) or to add/delete `cidr`."""
    msg = ifaddrmsg()
    msg["index"] = index
    if cidr is not None:
        ip = str(cidr.ip)
        msg["family"] = socket.AF_INET if cidr.version == 4 else socket.AF_INET6
        msg["prefixlen"] = cidr.network.prefixlen
        # IFA_LOCAL is the address itself; IFA_ADDRESS equal to it means "no peer"
        msg["attrs"] = [("IFA_LOCAL", ip), ("IFA_ADDRESS", ip)]
    return msg


def cidr_from_addr_msg(msg: AddrMsg) -> Cidr | None:
    addr = msg.local or msg.address
    if not addr:
        return None
    return ipaddress.ip_interface(f"{addr}/{msg['prefixlen']}")


# -- requests ------------------------------------------------------------------------------


async def _ack(ipr: Requester, msg: Any, kind: int, flags: int = 0) -> None:
    async for _ in await ipr.nlm_request(msg, kind, NLM_F_REQUEST | NLM_F_ACK | flags):
        pass


async def setlink(
    ipr: Requester, index: int, *attrs: tuple[str, Any], up: bool | None = None
) -> None:
    """One RTM_SETLINK. The kernel applies a netns move first, then MTU, then the name, then
    the admin state (do_setlink), so one message can do all four."""
    await _ack(ipr, link_request(index, *attrs, up=up), RTM_SETLINK)


async def getlink(ipr: Requester, index: int = 0, name: str = "") -> LinkMsg:
    """One netdev, by index or else by name; NetlinkError(ENODEV) if there is none."""
    attrs: list[tuple[str, Any]] = [("IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS)]
    if not index:
        attrs.append(("IFLA_IFNAME", name))
    request = await ipr.nlm_request(link_request(index, *attrs), RTM_GETLINK, NLM_F_REQUEST)
    replies: list[LinkMsg] = [m async for m in request]
    (msg,) = replies
    return msg


async def dump_links(ipr: Requester) -> list[LinkMsg]:
    msg = link_request(0, ("IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS))
    request = await ipr.nlm_request(msg, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP)
    return [m async for m in request]


async def addresses(ipr: Requester, index: int) -> list[Cidr]:
    """The addresses of netdev `index`, all families. The kernel filters the dump by index
    on a strict-checking socket (NETLINK_GET_STRICT_CHK); on others it dumps every
    netdev's, so filter here as well."""
    request = await ipr.nlm_request(addr_request(), RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP)
    out = []
    async for m in request:
        if m["index"] == index:
            cidr = cidr_from_addr_msg(m)
            if cidr is not None:
                out.append(cidr)
    return out


async def add_address(ipr: Requester, index: int, cidr: Cidr) -> None:
    await _ack(ipr, addr_request(index, cidr), RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL)


async def del_address(ipr: Requester, index: int, cidr: Cidr) -> None:
    await _ack(ipr, addr_request(index, cidr), RTM_DELADDR)


async def dellink(ipr: Requester, index: int, *attrs: tuple[str, Any], name: str = "") -> None:
    """Delete a netdev, by index or else by name; `attrs` as IFLA_IF_NETNSID select it."""
    by_name = () if index else (("IFLA_IFNAME", name),)
    await _ack(ipr, link_request(index, *by_name, *attrs), RTM_DELLINK)


async def netns_nsid(ipr: Requester, fd: int) -> int | None:
    """The nsid the socket's netns gives the netns open at `fd`; None if it has none."""
    msg = nsidmsg()
    msg["attrs"] = [("NETNSA_FD", fd)]
    async for reply in await ipr.nlm_request(msg, RTM_GETNSID, NLM_F_REQUEST):
        nsid = reply.get_attr("NETNSA_NSID")
        return None if nsid is None or nsid == NSID_NOT_ASSIGNED else int(nsid)
    return None


def move_link_blocking(index: int, *attrs: tuple[str, Any], up: bool | None = None) -> None:
    """One RTM_SETLINK that moves a netdev between netns, sent from the calling thread's
    netns on a socket of its own: run it on a worker thread (rdmad.kernel.netns).

    Why not AsyncIPRoute: a netlink request runs in the sender's send() call, and a move
    waits there for RCU (15-25 ms here). On the loop thread that stalls every other client,
    and the move's own events pile up to be parsed after it; off the loop, they are handled
    while it runs. This is the one request that blocks that long, so it is the one sent
    this way. NetlinkError as pyroute2 raises it."""
    msg = link_request(index, *attrs, up=up)
    msg["header"]["type"] = RTM_SETLINK
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"] = seq = 1
    msg.encode()
    try:
        with socket.socket(
            socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        ) as sock:
            sock.settimeout(MOVE_TIMEOUT_S)
            sock.bind((0, 0))
            sock.send(msg.data)
            code = _ack_code(sock, seq)
    except OSError as e:  # the socket itself failed, or the kernel never answered
        raise NetlinkError(e.errno or errno.ETIMEDOUT, str(e)) from e
    if code:
        raise NetlinkError(-code)


def _ack_code(sock: socket.socket, seq: int) -> int:
    """The error code of the NLMSG_ERROR answering `seq` (0: done)."""
    while True:  # only our ack can arrive: the socket joined no multicast group
        reply = sock.recv(65536)
        _len, kind, _flags, got_seq, _pid = _NLMSGHDR.unpack_from(reply, 0)
        if kind == _NLMSG_ERROR and got_seq == seq:
            return int(struct.unpack_from("=i", reply, _NLMSGHDR.size)[0])
