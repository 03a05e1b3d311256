"""The container side of an attachment, read and completed over rtnetlink in its netns.

rdmad puts the interface there (name, MTU, addresses, up); the plugin reads what the
result reports (index, MAC, MTU) and adds what rdmad does not: routes and a requested MAC.
Framing, attributes and the reply check are rdmad.kernel.netlink's, on one blocking socket:
pyroute2 (or rdmad's asyncio socket layer) would cost a pod start more to import than these
few requests take.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from typing import NamedTuple

from rdmad.kernel.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    Attrs,
    Message,
    Reply,
    attr,
    attr_str,
    attr_u32,
    encode,
    split,
)

CLONE_NEWNET = 0x40000000
# include/uapi/linux/rtnetlink.h, if_link.h, if_addr.h
RTM_NEWLINK, RTM_GETLINK, RTM_SETLINK, RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE = (
    16,
    18,
    19,
    20,
    22,
    24,
)
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU = 1, 3, 4
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253

_IFINFO = struct.Struct("=BxHiII")
_IFADDR = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RECV_SIZE = 65536


class Link(NamedTuple):
    ifindex: int
    name: str
    mac: str
    mtu: int


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class NetnsLinks:
    """An rtnetlink socket opened inside the netns at `path` (the process returns to its
    own netns at once: a socket keeps the netns it was made in)."""

    def __init__(self, path: str) -> None:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                self._sock = socket.socket(
                    socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
                )
            finally:
                _setns(home)
        finally:
            os.close(target)
            os.close(home)
        self._sock.bind((0, 0))
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def _request(self, kind: int, flags: int, body: bytes) -> list[Message]:
        """Send one request (a doit with NLM_F_ACK, or a dump); its data messages.
        rdmad.kernel.netlink.NetlinkError (an OSError) if the kernel refused it."""
        self._seq += 1
        self._sock.sendall(encode(kind, body, seq=self._seq, flags=flags))
        reply = Reply(self._seq)
        while not any(
            msg.seq == reply.seq and reply.feed(msg) for msg in split(self._sock.recv(_RECV_SIZE))
        ):
            pass
        return reply.messages

    def link(self, name: str) -> Link:
        """The netdev `name` (NetlinkError ENODEV if there is none)."""
        body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr_str(IFLA_IFNAME, name)
        (msg,) = [m for m in self._request(RTM_GETLINK, NLM_F_ACK, body) if m.type == RTM_NEWLINK]
        _family, _type, index, _flags, _change = _IFINFO.unpack_from(msg.payload)
        attrs = Attrs.parse(msg.payload[_IFINFO.size :])
        mac = ":".join(f"{b:02x}" for b in attrs.raw.get(IFLA_ADDRESS, b""))
        return Link(index, name, mac, attrs.u32(IFLA_MTU))

    def addresses(self, index: int) -> set[str]:
        """The CIDRs on interface `index`."""
        out = set()
        body = _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        for msg in self._request(RTM_GETADDR, NLM_F_DUMP, body):
            if msg.type != RTM_NEWADDR:
                continue
            family, prefix, _flags, _scope, ifindex = _IFADDR.unpack_from(msg.payload)
            if ifindex != index:
                continue
            attrs = Attrs.parse(msg.payload[_IFADDR.size :]).raw
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            if raw:
                out.add(f"{socket.inet_ntop(family, raw)}/{prefix}")
        return out

    def set_mac(self, index: int, mac: str) -> None:
        value = bytes(int(part, 16) for part in mac.split(":"))
        body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0) + attr(IFLA_ADDRESS, value)
        self._request(RTM_SETLINK, NLM_F_ACK, body)

    def add_route(self, dst: str, gateway: str, index: int) -> None:
        net = ipaddress.ip_network(dst, strict=False)
        family = socket.AF_INET6 if net.version == 6 else socket.AF_INET
        scope = RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK
        body = _RTMSG.pack(
            family, net.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0
        )
        if net.prefixlen:
            body += attr(RTA_DST, net.network_address.packed)
        if gateway:
            body += attr(RTA_GATEWAY, ipaddress.ip_address(gateway).packed)
        body += attr_u32(RTA_OIF, index)
        self._request(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
