"""Netlink framing shared by every family rdmad speaks (NETLINK_ROUTE, NETLINK_RDMA).

Bytes in, bytes out: message headers, attributes, and the one check of a reply (an
NLMSG_ERROR ack or refusal, an NLMSG_DONE that may carry an error). The families' own
codecs (rtnl_msgs, rdma_nl) build and read payloads on top of this; nlsocket moves the bytes.
Numbers come from include/uapi/linux/netlink.h.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from rdmad.errors import RdmadError, Unavailable, from_errno

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200  # NEW requests
NLM_F_CREATE = 0x400
NLM_F_DUMP = 0x300
NLM_F_CAPPED = 0x100  # in an NLMSG_ERROR: the echoed request has no payload
NLM_F_ACK_TLVS = 0x200  # in an NLMSG_ERROR: extended-ack attributes follow
NLMSGERR_ATTR_MSG = 1
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED and NLA_F_NET_BYTEORDER

HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLATTR = struct.Struct("=HH")  # len, type
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")

Build = Callable[[int], bytes]  # seq -> an encoded request


def align(n: int) -> int:
    return (n + 3) & ~3


# ---------------------------------------------------------------- attributes (encode)


def attr(kind: int, payload: bytes) -> bytes:
    """One nlattr, padded to 4 bytes (the length field excludes the padding)."""
    size = _NLATTR.size + len(payload)
    return _NLATTR.pack(size, kind) + payload + b"\0" * (align(size) - size)


def attr_u8(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=B", value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, _U32.pack(value))


def attr_i32(kind: int, value: int) -> bytes:
    return attr(kind, _I32.pack(value))


def attr_str(kind: int, value: str) -> bytes:
    """NUL-terminated, as mnl_attr_put_strz and the kernel's NLA_NUL_STRING expect."""
    return attr(kind, value.encode() + b"\0")


def attr_nest(kind: int, attrs: Iterable[bytes]) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(attrs))


def encode(msg_type: int, body: bytes, *, seq: int, flags: int = 0) -> bytes:
    """A request: nlmsghdr + body. NLM_F_REQUEST is always set; pid 0 is the kernel."""
    return HEADER.pack(HEADER.size + len(body), msg_type, flags | NLM_F_REQUEST, seq, 0) + body


# ---------------------------------------------------------------- attributes (decode)


def iter_attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, payload) pairs; flag bits stripped, type 0 (padding) skipped, a truncated tail
    ignored."""
    # The loop of every message rdmad reads (a link has ~40 attributes): names bound
    # locally and the alignment inlined, as align() and attribute look-ups cost it more
    # than its work.
    unpack, head, end, offset = _NLATTR.unpack_from, _NLATTR.size, len(data), 0
    while offset + head <= end:
        size, kind = unpack(data, offset)
        if size < head or offset + size > end:
            break
        kind &= NLA_TYPE_MASK
        if kind:
            yield kind, data[offset + head : offset + size]
        offset += (size + 3) & ~3  # align(size)


class Attrs:
    """Decoded attributes of one message or nest: the last value of each type wins."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[int, bytes]) -> None:
        self.raw = raw

    @classmethod
    def parse(cls, data: bytes) -> Attrs:
        return cls(dict(iter_attrs(data)))

    def __contains__(self, kind: int) -> bool:
        return kind in self.raw

    def u8(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return v[0] if v else default

    def u32(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return int(_U32.unpack_from(v)[0]) if v is not None and len(v) >= 4 else default

    def i32(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return int(_I32.unpack_from(v)[0]) if v is not None and len(v) >= 4 else default

    def u64(self, kind: int, default: int = 0) -> int:
        v = self.raw.get(kind)
        return int(struct.unpack_from("=Q", v)[0]) if v is not None and len(v) >= 8 else default

    def string(self, kind: int, default: str = "") -> str:
        v = self.raw.get(kind)
        return v.split(b"\0", 1)[0].decode(errors="replace") if v is not None else default

    def nested(self, kind: int) -> Attrs:
        return Attrs.parse(self.raw.get(kind, b""))


# ---------------------------------------------------------------- messages


class Message(NamedTuple):
    type: int
    flags: int
    seq: int
    pid: int
    payload: bytes
    # The netns it came from, for a socket listening to all (NETLINK_LISTEN_ALL_NSID);
    # None for the socket's own netns.
    nsid: int | None = None


def split(data: bytes, nsid: int | None = None) -> list[Message]:
    """Every netlink message in one datagram (a dump packs several per read), from the
    netns `nsid` (see Message.nsid)."""
    out: list[Message] = []
    offset = 0
    while offset + HEADER.size <= len(data):
        size, typ, flags, seq, pid = HEADER.unpack_from(data, offset)
        if size < HEADER.size or offset + size > len(data):
            raise ValueError(f"truncated netlink message at offset {offset}")
        payload = data[offset + HEADER.size : offset + size]
        out.append(Message(typ, flags, seq, pid, payload, nsid))
        offset += align(size)
    return out


class NetlinkError(OSError):
    """The kernel answered with a negative errno; `extack` is its extended-ack text, if any."""

    def __init__(self, err: int, extack: str = "") -> None:
        super().__init__(err, extack or os.strerror(err))
        self.extack = extack


def parse_error(msg: Message) -> tuple[int, str]:
    """(errno, extack message) of an NLMSG_ERROR; errno 0 is an ACK."""
    (code,) = _I32.unpack_from(msg.payload)
    extack = ""
    if msg.flags & NLM_F_ACK_TLVS:
        # the echoed request: only its header when capped, else the whole message
        echoed = HEADER.unpack_from(msg.payload, 4)[0] if len(msg.payload) >= 20 else 0
        skip = 4 + (HEADER.size if msg.flags & NLM_F_CAPPED else align(echoed))
        extack = Attrs.parse(msg.payload[skip:]).string(NLMSGERR_ATTR_MSG)
    return -code, extack


class Reply:
    """Collects the answer to one request, fed message by message (any order of datagrams).

    Every request rdmad sends ends in one of two ways: a doit request carries NLM_F_ACK, so
    it ends with an NLMSG_ERROR (errno 0 = ACK); a dump ends with NLMSG_DONE, whose payload
    may carry an error of its own.
    """

    __slots__ = ("done", "messages", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.messages: list[Message] = []
        self.done = False

    def feed(self, msg: Message) -> bool:
        """True once the reply is complete; raises NetlinkError for a kernel error."""
        if msg.type == NLMSG_ERROR:
            err, extack = parse_error(msg)
            self.done = True
            if err:
                raise NetlinkError(err, extack)
        elif msg.type == NLMSG_DONE:
            self.done = True
            if len(msg.payload) >= 4:
                (code,) = _I32.unpack_from(msg.payload)
                if code < 0:
                    raise NetlinkError(-code)
        elif msg.type not in (NLMSG_NOOP, NLMSG_OVERRUN):
            self.messages.append(msg)
        return self.done


def kernel_error(e: OSError, what: str) -> RdmadError:
    """The named error a caller sees for a failed kernel request on `what` (netlink, or a
    syscall of the kernel adapters), with the kernel's own words when it gave any."""
    err = e.errno or errno.EIO
    if err in (errno.EPROTONOSUPPORT, errno.ECONNREFUSED) and not isinstance(e, NetlinkError):
        # The socket's, not a reply's: the family's kernel side is absent or went away. Of
        # the families rdmad speaks, only NETLINK_RDMA can be (ib_core not loaded).
        return Unavailable("no RDMA subsystem: the kernel has no NETLINK_RDMA (ib_core not loaded)")
    mapped = from_errno(err, what)
    extack = getattr(e, "extack", "")
    if extack:
        mapped.args = (f"{mapped.args[0]}: {extack}",)
    return mapped
