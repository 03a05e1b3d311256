"""The container side of an attachment, read and completed over rtnetlink in its netns.

rdmad puts the interface there (name, MTU, addresses, up); the plugin reads what the
result reports (index, MAC, MTU) and adds what rdmad does not: routes and a requested MAC.
Raw messages on one blocking socket: pyroute2 would cost a pod start more to import than
these few requests take.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from typing import NamedTuple

CLONE_NEWNET = 0x40000000
# include/uapi/linux/netlink.h, rtnetlink.h, if_link.h, if_addr.h
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 1, 4, 0x200, 0x400, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
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

_HDR = struct.Struct("=IHHII")
_IFINFO = struct.Struct("=BxHiII")
_IFADDR = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTA = struct.Struct("=HH")
_ERR = struct.Struct("=i")


class NetlinkError(OSError):
    pass


class Link(NamedTuple):
    ifindex: int
    name: str
    mac: str
    mtu: int


def _attr(kind: int, payload: bytes) -> bytes:
    raw = _RTA.pack(4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _attrs(data: bytes, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    while start + 4 <= end:
        length, kind = _RTA.unpack_from(data, start)
        if length < 4:
            return
        yield kind & 0x3FFF, data[start + 4 : start + length]
        start += (length + 3) & ~3


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

    def _request(self, kind: int, flags: int, body: bytes) -> list[tuple[int, bytes]]:
        """Send one request; its replies as (type, payload), or NetlinkError."""
        self._seq += 1
        self._sock.send(
            _HDR.pack(_HDR.size + len(body), kind, NLM_F_REQUEST | flags, self._seq, 0) + body
        )
        out: list[tuple[int, bytes]] = []
        while True:
            data = self._sock.recv(65536)
            offset = 0
            while offset + _HDR.size <= len(data):
                length, mtype, _flags, seq, _pid = _HDR.unpack_from(data, offset)
                payload = data[offset + _HDR.size : offset + length]
                offset += (length + 3) & ~3
                if seq != self._seq:
                    continue
                if mtype == NLMSG_DONE:
                    return out
                if mtype == NLMSG_ERROR:
                    (code,) = _ERR.unpack_from(payload)
                    if code:
                        raise NetlinkError(-code, os.strerror(-code))
                    return out
                out.append((mtype, payload))
                if not flags & NLM_F_DUMP and not flags & NLM_F_ACK:
                    return out

    def link(self, name: str) -> Link:
        """The netdev `name` (ENODEV if there is none)."""
        body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(
            IFLA_IFNAME, name.encode() + b"\0"
        )
        for mtype, payload in self._request(RTM_GETLINK, 0, body):
            if mtype == RTM_NEWLINK:
                _family, _type, index, _flags, _change = _IFINFO.unpack_from(payload)
                mac, mtu = "", 0
                for kind, value in _attrs(payload, _IFINFO.size, len(payload)):
                    if kind == IFLA_ADDRESS:
                        mac = ":".join(f"{b:02x}" for b in value)
                    elif kind == IFLA_MTU:
                        (mtu,) = struct.unpack("=I", value[:4])
                return Link(index, name, mac, mtu)
        raise NetlinkError(errno.ENODEV, f"no interface {name}")

    def addresses(self, index: int) -> set[str]:
        """The CIDRs on interface `index`."""
        out = set()
        body = _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        for mtype, payload in self._request(RTM_GETADDR, NLM_F_DUMP, body):
            if mtype != RTM_NEWADDR:
                continue
            family, prefix, _flags, _scope, ifindex = _IFADDR.unpack_from(payload)
            if ifindex != index:
                continue
            attrs = dict(_attrs(payload, _IFADDR.size, len(payload)))
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            if raw:
                out.add(f"{socket.inet_ntop(family, raw)}/{prefix}")
        return out

    def set_mac(self, index: int, mac: str) -> None:
        value = bytes(int(part, 16) for part in mac.split(":"))
        body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, 0, 0) + _attr(IFLA_ADDRESS, value)
        self._request(RTM_SETLINK, NLM_F_ACK, body)

    def add_route(self, dst: str, gateway: str, index: int) -> None:
        net = ipaddress.ip_network(dst, strict=False)
        family = socket.AF_INET6 if net.version == 6 else socket.AF_INET
        scope = RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK
        body = _RTMSG.pack(
            family, net.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0
        )
        if net.prefixlen:
            body += _attr(RTA_DST, net.network_address.packed)
        if gateway:
            body += _attr(RTA_GATEWAY, ipaddress.ip_address(gateway).packed)
        body += _attr(RTA_OIF, struct.pack("=I", index))
        self._request(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
